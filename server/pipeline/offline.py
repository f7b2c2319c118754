"""Classify image files without a server, with the same decode, preprocessing and engine code."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from irpe.artifact import load_artifact

from ..engines import load_engine
from ..errors import APIError
from .decode import prepare
from .topk import top_k


def classify_files(paths: list[str | Path], artifact_dir: str | Path, *, k: int = 5, backend: str = "auto",
                   device: str = "cpu", max_pixels: int = 40_000_000) -> tuple[str, list[list[dict[str, Any]]]]:
    """(model name, top-k predictions per file); decode errors raise APIError naming the problem."""
    artifact = load_artifact(artifact_dir)
    engine = load_engine(artifact_dir, artifact, backend=backend, device=device, max_batch=len(paths) or 1)
    arrays = []
    for p in paths:
        try:
            arrays.append(prepare(Path(p).read_bytes(), artifact.preprocess, max_pixels))
        except APIError as e:
            raise APIError(e.status, e.code, f"{p}: {e.message}") from None
    k = max(1, min(k, artifact.num_classes))
    limit = engine.info.max_batch
    logits = np.concatenate([engine.run(np.stack(arrays[i:i + limit])) for i in range(0, len(arrays), limit)])
    return artifact.name, [top_k(row, k, artifact.labels) for row in logits]


def format_table(paths: list[str | Path], preds: list[list[dict[str, Any]]]) -> str:
    """A plain-text table: file, rank, probability, index, label."""
    rows = [("file", "rank", "prob", "index", "label")]
    for path, ranked in zip(paths, preds, strict=True):
        for rank, p in enumerate(ranked, 1):
            rows.append((str(path) if rank == 1 else "", str(rank), f"{p['probability']:.4f}", str(p["index"]),
                         p["label"]))
    widths = [max(len(r[c]) for r in rows) for c in range(5)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows)
