"""Fixtures: a tiny ImageFolder tree and one short digits training run shared by the tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from irpe.training.config import TrainConfig, TrainResult
from irpe.training.loop import train
from irpe.training.presets import train_config

MICRO = "deit_micro_patch4_32_ctx_product_shared_k"
SHORT_DIGITS = dict(epochs=8, batch_size=16, lr=0.064, warmup_epochs=1, drop_path=0.0, threads=1, processes=1,
                    progress=False)


def make_image_folder(root: Path, classes: int = 4, per_class: int = 6, size: int = 40) -> Path:
    """train/ and val/ splits of coloured-blob JPEGs (class = colour), varied sizes."""
    rng = np.random.default_rng(0)
    for split, n in (("train", per_class), ("val", 2)):
        for c in range(classes):
            d = root / split / f"class_{c}"
            d.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                arr = rng.integers(0, 60, (size, size + 4 * i, 3), dtype=np.uint8)
                arr[8:30, 8:30, c % 3] = 200 + 10 * (c // 3)
                Image.fromarray(arr).save(d / f"{i}.jpg", quality=95)
    return root


@pytest.fixture(scope="session")
def image_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_image_folder(tmp_path_factory.mktemp("imagefolder"))


def tiny_config(data: Path, out: Path, **kw: object) -> TrainConfig:
    """A seconds-long ImageFolder run of the micro model (4 classes)."""
    base = dict(model=MICRO, overrides={"num_classes": 4}, epochs=2, batch_size=8, lr=0.1,
                warmup_epochs=1, threads=1, progress=False)
    base.update(kw)
    return TrainConfig(data=str(data), output=str(out), **base)


@pytest.fixture(scope="session")
def digits_run(tmp_path_factory: pytest.TempPathFactory) -> TrainResult:
    """8 short epochs of the digits model (about 30 s on 2 cores)."""
    out = tmp_path_factory.mktemp("digits_run")
    return train(train_config("digits", str(out), **SHORT_DIGITS))
