"""Per-dataset defaults: the paper's recipe for ImageFolder data, a short one for the builtin digits."""

from __future__ import annotations

from typing import Any

from .config import TrainConfig

#: The digits recipe (2 CPU cores, <= 5 minutes): same optimiser and schedule shape, fewer epochs, in two
#: 1-thread processes of 16 images each (training/parallel.py); base lr 6.4e-2 per 1024 images = 2e-3 at
#: the total batch of 32.
DIGITS_RECIPE: dict[str, Any] = {"epochs": 100, "batch_size": 16, "processes": 2, "lr": 6.4e-2,
                                 "warmup_epochs": 3, "drop_path": 0.1}


def train_config(data: str, output: str, **kwargs: Any) -> TrainConfig:
    """A TrainConfig for ``data`` with the dataset's defaults under the explicitly given values."""
    base = dict(DIGITS_RECIPE) if data == "digits" else {}
    base.update(kwargs)
    return TrainConfig(data=data, output=output, **base)
