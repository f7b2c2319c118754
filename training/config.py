"""What a training run takes and gives (``TrainConfig``, ``TrainResult``) and its place in a process group
(``Dist``): plain dataclasses, shared by the loop, the local process group and the checkpoint writer."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class TrainConfig:
    """Everything ``irpe train`` takes; ``lr`` is the base rate for a total batch of 1024."""

    data: str
    output: str
    model: str = "deit_micro_patch4_32_ctx_product_shared_k"
    overrides: dict[str, Any] = field(default_factory=dict)
    epochs: int = 300
    batch_size: int = 64
    lr: float = 1e-3
    min_lr: float = 1e-5
    warmup_epochs: int = 5
    weight_decay: float = 0.05
    smoothing: float = 0.1
    drop_path: float = 0.1
    seed: int = 0
    device: str = "auto"
    workers: int = 0
    threads: int | None = None
    processes: int = 1  # > 1: data-parallel in that many local processes (training/parallel.py)
    resume: str | None = None
    stop_after: int | None = None
    progress: bool = True


@dataclass
class TrainResult:
    """The checkpoint written, the per-epoch statistics (log.txt's lines) and the wall time."""

    checkpoint: Path
    history: list[dict[str, float]]
    seconds: float

    @property
    def val_acc(self) -> float:
        return self.history[-1]["val_acc"] if self.history else 0.0


@dataclass
class Dist:
    """This process's rank in the group (rank 0 of 1 without one)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0
