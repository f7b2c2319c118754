"""``irpe bench export``: ONNX Runtime CPU latency of exported DeiT-S variants, measured side by side.

Every model is exported twice with random weights (RPE tables non-zero): by :func:`onnx_from_model`
and, for comparison, by ``torch.onnx.export`` of the PyTorch port of the published forward (that graph
bakes in the traced batch size, so it is traced once per batch). Sessions run round-robin so that load
from other processes hits all models alike; the median of the repeats is reported.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from irpe.models import create_model

from .onnx import onnx_from_model

BENCH_MODELS = {
    "plain": "deit_small_patch16_224",
    "k": "deit_small_patch16_224_ctx_product_50_shared_k",
    "qk": "deit_small_patch16_224_ctx_product_50_shared_qk",
    "qkv": "deit_small_patch16_224_ctx_product_50_shared_qkv",
}


@dataclass
class Timing:
    """Median latency of one graph at one batch size."""

    model: str
    kind: str  # "irpe" (this exporter) or "reference" (torch.onnx.export)
    batch: int
    median_ms: float
    runs: int
    kernel_ms: float = 0.0  # sum over graph nodes of each node's median kernel time (robust to load)


def random_model(name: str, img_size: int = 224, seed: int = 0, rpe_std: float = 0.02,
                 **overrides: object) -> torch.nn.Module:
    """A registered variant (create_model overrides allowed) in eval mode, RPE tables random too."""
    torch.manual_seed(seed)
    model = create_model(name, img_size=img_size, **overrides)
    with torch.no_grad():
        for key, p in model.named_parameters():
            if "lookup_table" in key:
                p.normal_(0.0, rpe_std)
    return model.eval()


def reference_onnx(model: torch.nn.Module, path: Path, batch: int, opset: int = 17) -> Path:
    """torch.onnx.export (TorchScript tracer) of the PyTorch port, at a fixed batch size."""
    size = model.cfg.img_size
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.zeros(batch, 3, size, size),), str(path), dynamo=False,
                          opset_version=opset, input_names=["images"], output_names=["logits"])
    return path


def _session(path: Path, threads: int, profile: bool = True):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.log_severity_level = 3
    if profile:
        so.enable_profiling = True
        so.profile_file_prefix = str(path.with_suffix("")) + f"_t{threads}"
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def kernel_ms(session, skip_runs: int) -> float:
    """Sum over nodes of the median per-run kernel time, from the session's profile (ends profiling).

    Wall-clock medians on a shared machine swing with other processes; per-node medians do much less.
    """
    events = json.loads(Path(session.end_profiling()).read_text())
    per_node: dict[str, list[float]] = {}
    for ev in events:
        if ev.get("cat") == "Node" and ev.get("name", "").endswith("_kernel_time"):
            per_node.setdefault(ev["name"], []).append(ev["dur"] / 1000.0)
    return float(sum(np.median(t[skip_runs:] or t) for t in per_node.values()))


def time_round_robin(sessions: dict[tuple[str, str], object], x: np.ndarray, repeats: int,
                     warmup: int) -> dict[tuple[str, str], list[float]]:
    """Run every session once per round (after ``warmup`` rounds); seconds per run, per session."""
    feed = {"images": x}
    for _ in range(warmup):
        for sess in sessions.values():
            sess.run(None, feed)
    times: dict[tuple[str, str], list[float]] = {k: [] for k in sessions}
    for _ in range(repeats):
        for key, sess in sessions.items():
            start = time.perf_counter()
            sess.run(None, feed)
            times[key].append(time.perf_counter() - start)
    return times


def run_export_bench(models: Sequence[str] = tuple(BENCH_MODELS), batches: Sequence[int] = (1, 8), *,
                     repeats: int = 10, warmup: int = 2, threads: int | None = None, img_size: int = 224,
                     reference: bool = True, log: Callable[[str], None] | None = None) -> list[Timing]:
    """Export each model (and its reference graph per batch), time them side by side; all timings."""
    unknown = [m for m in models if m not in BENCH_MODELS]
    if unknown:
        raise ValueError(f"unknown bench model(s) {unknown}; choose from {', '.join(BENCH_MODELS)}")
    threads = threads or os.cpu_count() or 1
    log = log or (lambda s: print(s, file=sys.stderr, flush=True))
    results: list[Timing] = []
    with tempfile.TemporaryDirectory(prefix="irpe-bench-") as tmp:
        nets = {m: random_model(BENCH_MODELS[m], img_size) for m in models}
        paths = {}
        for m, net in nets.items():
            log(f"exporting {m} ({BENCH_MODELS[m]})")
            paths[(m, "irpe")] = onnx_from_model(net, Path(tmp) / f"{m}.onnx")
        for batch in batches:
            sessions = {key: _session(p, threads) for key, p in paths.items()}
            if reference:
                for m, net in nets.items():
                    log(f"torch.onnx.export reference of {m} at batch {batch}")
                    ref = reference_onnx(net, Path(tmp) / f"{m}_ref_b{batch}.onnx", batch)
                    sessions[(m, "reference")] = _session(ref, threads)
            log(f"timing batch {batch}: {len(sessions)} graphs x {repeats} runs, round-robin")
            x = np.random.default_rng(0).standard_normal((batch, 3, img_size, img_size), dtype=np.float32)
            for (m, kind), t in time_round_robin(sessions, x, repeats, warmup).items():
                results.append(Timing(m, kind, batch, float(np.median(t) * 1e3), len(t),
                                      kernel_ms(sessions[(m, kind)], warmup)))
    return results


def _ratio(value: float, base: Timing | None, attr: str) -> str:
    den = getattr(base, attr) if base else 0.0
    return f"{value / den:8.3f}x" if den else f"{'n/a':>9s}"


def format_table(results: list[Timing]) -> str:
    """Wall-clock median and summed per-node kernel medians, each as a ratio to plain DeiT-S (this exporter)."""
    lines = [f"{'model':8s} {'export':10s} {'batch':>5s} {'median ms':>10s} {'vs plain':>9s} "
             f"{'kernel ms':>10s} {'vs plain':>9s}"]
    order = {m: i for i, m in enumerate(BENCH_MODELS)}
    for batch in sorted({r.batch for r in results}):
        base = next((r for r in results if r.batch == batch and r.model == "plain" and r.kind == "irpe"), None)
        for r in sorted((r for r in results if r.batch == batch), key=lambda r: (r.kind != "irpe", order[r.model])):
            lines.append(f"{r.model:8s} {r.kind:10s} {r.batch:5d} {r.median_ms:10.1f} "
                         f"{_ratio(r.median_ms, base, 'median_ms')} {r.kernel_ms:10.1f} "
                         f"{_ratio(r.kernel_ms, base, 'kernel_ms')}")
    return "\n".join(lines)
