"""What the ONNX layer and iRPE emitters share: the emission state and the bucket tables."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from irpe.models.deit import ViTConfig

from .graph import GraphBuilder


@dataclass
class Table:
    """One bucket table and its learned embedding (NumPy).

    ``weight``: bias (Ht, K); contextual q/k (Ht, d, K); contextual v (Ht, K, d); Ht = 1 when shared.
    """

    bucket: np.ndarray
    num_buckets: int
    weight: np.ndarray


@dataclass
class Emit:
    """Everything the layer emitters share: the builder, the weights and the export options."""

    builder: GraphBuilder
    weights: dict[str, np.ndarray]  # the state dict as float32 arrays
    cfg: ViTConfig
    opset: int
    plugin: bool = False
    tables: dict[int, dict[str, list[Table]]] = field(default_factory=dict)
    batch: str = ""  # 1-D int64 tensor [N] (the dynamic batch size), set by :func:`layers.embed`
    cache: dict[str, str] = field(default_factory=dict)  # values shared by all layers (e.g. zeros)

    @property
    def tokens(self) -> int:
        h, w = self.cfg.grid
        return self.cfg.num_prefix_tokens + h * w
