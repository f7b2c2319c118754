"""The iRPE attention core as one OpenVINO custom op on the bf16 paths: q kᵀ, the q/k lookups, softmax, the
value side's bucket sums and p v in one pass per (batch, head) plane (the C kernel ``_ovops``).

Why: OpenVINO runs plain DeiT's attention as one fused subgraph that never writes the (n, n) scores. iRPE breaks
it into gathers, Adds, a Softmax, transposes and one-hot GEMMs that each write and read an (N, H, n, n) tensor;
on a CPU those passes, not the multiply-adds, are iRPE's price (docs/cpu.md). The kernel keeps a block of query
rows in cache instead, with q kᵀ and p v as AVX-512 BF16 dot products (f32 accumulation).

Only on a bf16 (or int8 + bf16) compile, where OpenVINO rounds the same products to bf16 itself, and only where the
kernel is built and this CPU has AVX-512 BF16; ``IRPE_OV_OPS=0`` turns it off. The op runs through OpenVINO's
Python op API (evaluate), with the kernel's own threads (the caller's and ``threads - 1`` helpers). :func:`op`
is what :mod:`.openvino_graph` puts into the graph; nothing here reads a graph.
"""

from __future__ import annotations

import os
from functools import lru_cache
from typing import Any

import numpy as np


def _kernel() -> Any:
    try:
        from . import _ovops  # type: ignore[attr-defined]
    except ImportError:
        return None
    return _ovops


def available() -> bool:
    """Whether the fused op can run here: the kernel built, AVX-512 BF16 on this CPU, not turned off."""
    kernel = _kernel()
    return kernel is not None and kernel.vectorised() and os.environ.get("IRPE_OV_OPS", "1") != "0"


def default_threads() -> int:
    """The CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def plan(n: int, indices: list[np.ndarray], planes: list[int], bucket: np.ndarray | None = None, kv: int = 0,
         grid: tuple[int, int, int, int] | None = None) -> Any:
    """One layer's lookup indices (each (n*n,) into a lut plane of ``planes[t]`` entries) and value-side buckets
    ((n*n,) in [-1, kv), or None), checked and laid out once; ``grid`` (prefix tokens, grid rows, grid columns,
    column buckets) lets the kernel add the product method's separable bucket sums as vectors."""
    return _kernel().plan(n, tuple(np.ascontiguousarray(i, dtype=np.int32).reshape(-1) for i in indices),
                          tuple(int(p) for p in planes),
                          None if bucket is None else np.ascontiguousarray(bucket, dtype=np.int32).reshape(-1),
                          int(kv), grid)


def op(q: Any, kt: Any, v: Any, luts: list[Any], layer_plan: Any, kv: int, threads: int) -> Any:
    """The custom op node: bf16 q (N, H, n, d), kᵀ (N, H, d, n), v, and the luts -> (context (N, H, n, d) in
    bf16, and with ``kv`` the bucket sums (n, N*H, kv) in f32)."""
    return _op_class()([q, kt, v, *luts], layer_plan, kv, threads)


@lru_cache(maxsize=1)
def _op_class() -> type:
    import openvino as ov

    kernel = _kernel()

    class IrpeAttention(ov.Op):
        """softmax(q kᵀ + lookups) v and the value-side bucket sums, in one pass (see the module docstring)."""

        def __init__(self, inputs: list | None = None, layer_plan: Any = None, kv: int = 0, threads: int = 1):
            self.plan, self.kv, self.threads = layer_plan, kv, threads
            super().__init__(self, inputs)

        def validate_and_infer_types(self) -> None:
            shape = self.get_input_partial_shape(0)
            self.set_output_type(0, ov.Type.bf16, shape)
            if self.kv:
                n, b, h = shape[2], shape[0], shape[1]
                planes = b.get_length() * h.get_length() if b.is_static and h.is_static else ov.Dimension()
                self.set_output_type(1, ov.Type.f32, ov.PartialShape([n, planes, ov.Dimension(self.kv)]))

        def clone_with_new_inputs(self, new_inputs: list) -> Any:
            return IrpeAttention(new_inputs, self.plan, self.kv, self.threads)

        def has_evaluate(self) -> bool:
            return True

        def visit_attributes(self, visitor: Any) -> bool:
            return True

        def evaluate(self, outputs: list, inputs: list) -> bool:
            data = [t.data for t in inputs]
            kernel.attention(data[0], data[1], data[2], outputs[0].data, tuple(data[3:]), self.plan,
                             outputs[1].data if self.kv else None, self.threads)
            return True

    return IrpeAttention
