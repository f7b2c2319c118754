"""The engine interface every backend implements: ``run(float32 [N,3,H,W]) -> float32 [N,classes]``."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import numpy as np


class EngineError(RuntimeError):
    """The engine cannot be built as asked (missing runtime, GPU fallback, bad model); names the fix."""


@dataclass
class EngineInfo:
    """What is actually running, reported by /v1/models and the startup log."""

    backend: str
    device: str
    providers: list[str]
    input_shape: list[Any]
    max_batch: int
    batch_sizes: list[int] = field(default_factory=list)
    precision: str = "fp32"  # fp32, fp16, bf16, int8+fp32 / int8+bf16 (int8 QDQ MatMuls, the rest in fp32/bf16)
    custom_ops: list[str] = field(default_factory=list)  # op domains put into the graph (irpe.ort: ort_graph.py)


class Engine(ABC):
    """float32 [N,3,H,W] -> float32 [N,classes]; ``info`` says what runs it (every backend subclasses it)."""

    info: EngineInfo

    @abstractmethod
    def run(self, images: np.ndarray) -> np.ndarray:
        """Classify one batch.

        Args:
            images: float32 [N, 3, H, W], preprocessed; N one of ``info.batch_sizes``.

        Returns:
            float32 logits [N, classes].
        """


def batch_sizes(max_batch: int) -> list[int]:
    """The batch sizes the batcher uses (and warm-up runs): powers of two below max_batch, and max_batch."""
    sizes = [1 << i for i in range(max_batch.bit_length()) if (1 << i) < max_batch]
    return sizes + [max_batch]
