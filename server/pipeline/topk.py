"""The answer of a classification: softmax and the k most probable classes."""

from __future__ import annotations

from typing import Any

import numpy as np


def top_k(logits: np.ndarray, k: int, labels: list[str]) -> list[dict[str, Any]]:
    """Softmax (float64) and the k most probable classes, best first."""
    z = logits.astype(np.float64)
    p = np.exp(z - z.max())
    p /= p.sum()
    if k < len(p) > 256:  # the k largest in O(n), then ordered as a stable argsort of -p would order them
        # (for a few hundred classes or fewer the plain argsort below is cheaper than partition + lexsort)
        kth = np.partition(p, len(p) - k)[len(p) - k]
        cand = np.flatnonzero(p >= kth)
        order = cand[np.lexsort((cand, -p[cand]))][:k]
    else:
        order = np.argsort(-p, kind="stable")[:k]
    probs = p.tolist()  # Python floats at once, not one NumPy scalar per class
    return [{"index": i, "label": labels[i], "probability": probs[i]} for i in order.tolist()]
