"""Data-parallel training in local processes (training/parallel.py)."""

import argparse
import time

import pytest
import torch

from irpe.cli import main
from irpe.training.loop import train
from irpe.training.parallel import cpu_seconds

from .conftest import tiny_config


def _load(path):
    with torch.serialization.safe_globals([argparse.Namespace]):
        return torch.load(path, weights_only=True)


def test_two_processes_train_one_model_and_rank0_writes_it(image_folder, tmp_path, capsys):
    before = cpu_seconds()
    assert main(["train", "--data", str(image_folder), "-o", str(tmp_path / "two"), "--num-classes", "4",
                 "--epochs", "2", "--batch-size", "4", "--lr", "0.1", "--warmup-epochs", "1", "--no-progress",
                 "--processes", "2"]) == 0
    assert "val_acc=" in capsys.readouterr().out
    raw = _load(tmp_path / "two" / "checkpoint.pth")
    assert raw["epoch"] == 1 and raw["args"].world_size == 2 and raw["args"].processes == 2
    assert not any(k.startswith("module.") for k in raw["model"])  # unwrapped, exportable as is
    assert len((tmp_path / "two" / "log.txt").read_text().splitlines()) == 2  # rank 0 alone logs
    assert cpu_seconds() - before > 1.0  # the spawned ranks' CPU time is counted


def test_a_failing_rank_stops_the_group_with_a_clear_error(image_folder, tmp_path):
    start = time.perf_counter()
    cfg = tiny_config(image_folder, tmp_path / "bad", processes=2, overrides={"num_classes": 7})
    with pytest.raises(ValueError, match="4 classes but the model has 7 outputs; pass --num-classes 4"):
        train(cfg)  # the rank's own error, raised here as it is
    assert time.perf_counter() - start < 120  # no rank is left waiting for the dead one


def test_more_cuda_processes_than_gpus_names_the_fix(image_folder, tmp_path):
    n = max(2, torch.cuda.device_count() + 1)
    with pytest.raises(ValueError, match=f"--processes {n} with --device cuda needs {n} GPUs.*pass --processes 1"):
        train(tiny_config(image_folder, tmp_path / "gpu", processes=n, device="cuda"))
