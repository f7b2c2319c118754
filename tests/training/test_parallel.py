"""Data-parallel training in local processes (training/parallel.py)."""

import argparse
import time

import pytest
import torch

from irpe.training.loop import train
from irpe.training.parallel import cpu_seconds

from .conftest import tiny_config


def _load(path):
    with torch.serialization.safe_globals([argparse.Namespace]):
        return torch.load(path, weights_only=True)


def test_two_processes_train_one_model_and_rank0_writes_it(image_folder, tmp_path):
    before = cpu_seconds()
    result = train(tiny_config(image_folder, tmp_path / "two", processes=2, epochs=2, batch_size=4))
    assert [h["epoch"] for h in result.history] == [0, 1] and result.checkpoint.is_file()
    raw = _load(result.checkpoint)
    assert raw["args"].world_size == 2 and raw["args"].processes == 2
    assert not any(k.startswith("module.") for k in raw["model"])  # unwrapped, exportable as is
    assert cpu_seconds() - before > 1.0  # the spawned ranks' CPU time is counted


def test_a_failing_rank_stops_the_group_with_a_clear_error(image_folder, tmp_path):
    start = time.perf_counter()
    cfg = tiny_config(image_folder, tmp_path / "bad", processes=2, overrides={"num_classes": 7})
    with pytest.raises(RuntimeError, match=r"training process \d of 2 exited with status 1"):
        train(cfg)
    assert time.perf_counter() - start < 120  # no rank is left waiting for the dead one
