"""``irpe bench cpu``: every CPU path for the same DeiT-S model, side by side in one run.

Per model (random weights, RPE tables random): ``irpe export`` fp32, and ``--int8`` calibrated on crops of
scikit-image's photographs (an image directory, as a user would pass); then, interleaved round by round so
that load from other processes hits every path alike, the median latency of: ONNX Runtime fp32, OpenVINO
fp32 and bf16, our int8 QDQ model.onnx on ONNX Runtime and on OpenVINO (bf16 elsewhere), and OpenVINO NNCF
int8 (``ModelType.TRANSFORMER``, bf16 elsewhere) quantized by the bench from the same fp32 model as the
anchor; ``ort-fp32-std`` is ONNX Runtime fp32 on the file as exported, without the irpe.ort custom ops the
server's engine puts in (:mod:`irpe.artifact.ort_graph`). Each round runs the paths in a fresh random order
and ONNX Runtime does not spin after a run, so no path inherits another's busy threads. Ratios are to ONNX
Runtime fp32 of the same model and batch. ``--served`` adds served req/s of the fp32 artifact on ONNX Runtime
vs the int8 artifact on the default backend (``irpe serve``, real JPEGs). Every model runs in the same
rounds: the table gives each path's iRPE/plain ratio too (:func:`format_plain_ratios`).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

Runner = Callable[[np.ndarray], Any]
PATHS = ("ort-fp32", "ort-fp32-std", "ov-fp32", "ov-bf16", "ort-int8", "ov-int8", "nncf-int8")
PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "cat", "immunohistochemistry", "hubble_deep_field",
          "camera", "coins", "horse", "moon", "page")


@dataclass
class Row:
    """Median latency of one path, one model, one batch size."""

    model: str
    path: str
    batch: int
    median_ms: float
    runs: int
    best_ms: float = 0.0  # fastest round: on a loaded machine the closest to the idle figure


def _log(text: str) -> None:
    print(f"irpe bench cpu: {text}", file=sys.stderr, flush=True)


def photo_dir(root: Path, count: int, seed: int = 0) -> Path:
    """``count`` random crops (flipped half the time) of scikit-image's bundled photographs as JPEGs."""
    from PIL import Image
    from skimage import data

    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    photos = [Image.fromarray(getattr(data, n)()).convert("RGB") for n in PHOTOS]
    for i in range(count):
        img = photos[i % len(photos)]
        w, h = img.size
        s = int(min(w, h) * rng.uniform(0.5, 1.0))
        x, y = int(rng.integers(0, w - s + 1)), int(rng.integers(0, h - s + 1))
        crop = img.crop((x, y, x + s, y + s))
        if rng.random() < 0.5:
            crop = crop.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        crop.save(root / f"{i:04d}.jpg", quality=92)
    return root


def export_pair(model: str, tmp: Path, calib: Path, *, img_size: int, calibration_size: int,
                scope: str) -> tuple[Path, Path]:
    """(fp32 artifact, int8 artifact) of a random-weight ``model`` (fidelity floors off: random weights)."""
    import torch

    from irpe.export import ExportOptions, export_artifact
    from irpe.export.bench import random_model

    ckpt = tmp / f"{model}.pth"
    torch.save({"model": random_model(model, img_size).state_dict()}, ckpt)
    fp32_options = ExportOptions(name=model, overrides={"img_size": img_size}, progress=False)
    fp32 = export_artifact(ckpt, tmp / f"{model}-fp32", fp32_options)
    floors = {"top1_agreement": 0.0, "cosine_mean": 0.0, "accuracy_drop": 1.0}
    int8_options = dataclasses.replace(
        fp32_options, int8=True, calibration=str(calib),
        calibration_options={"calibration_size": calibration_size, "heldout": 16, "scope": scope, "floors": floors})
    int8 = export_artifact(ckpt, tmp / f"{model}-int8", int8_options)
    return fp32, int8


def _ort(path: Path, threads: int, ops: bool = True) -> Runner:
    """``ops``: the graph as the server's ONNX Runtime engine reads it (the iRPE lookups as irpe.ort custom ops
    where the library is built); else the file as exported (standard ops only)."""
    import onnxruntime as ort

    from irpe.artifact.ort_graph import prepare

    so = ort.SessionOptions()
    so.intra_op_num_threads, so.log_severity_level = threads, 3
    # ONNX Runtime's pool spins after each run, taking the cores from whichever path runs next
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    source, library = prepare(path) if ops else (str(path), None)
    if library:
        so.register_custom_ops_library(library)
    sess = ort.InferenceSession(source, so, providers=["CPUExecutionProvider"])
    return lambda x: sess.run(None, {"images": x})


def _ov(model: Any, precision: str, threads: int) -> Runner:
    import openvino as ov

    compiled = ov.Core().compile_model(model, "CPU", {
        "INFERENCE_PRECISION_HINT": "bf16" if precision == "bf16" else "f32", "PERFORMANCE_HINT": "LATENCY",
        "INFERENCE_NUM_THREADS": str(threads)})
    req = compiled.create_infer_request()
    return lambda x: req.infer({0: x})


def nncf_model(fp32_onnx: Path, calib: np.ndarray) -> Any:
    """OpenVINO NNCF int8 of the fp32 model (transformer preset), or None without nncf."""
    try:
        import nncf
        import openvino as ov
    except ImportError:
        _log("nncf is not installed: no NNCF anchor (pip install '.[bench-cpu]' from the irpe-deploy checkout's root)")
        return None
    model = ov.Core().read_model(str(fp32_onnx))
    dataset = nncf.Dataset([calib[i:i + 1] for i in range(len(calib))])
    return nncf.quantize(model, dataset, model_type=nncf.ModelType.TRANSFORMER, subset_size=len(calib))


def runners(fp32: Path, int8: Path, calib: np.ndarray, threads: int, paths: Sequence[str]) -> dict[str, Runner]:
    """Every requested path that can run here (OpenVINO paths need the [cpu] extra)."""
    import openvino as ov

    from irpe.artifact.openvino_graph import read_model

    out: dict[str, Runner] = {}
    core = ov.Core()

    def read(path: str) -> Any:  # as the server's OpenVINO engine reads model.onnx
        return read_model(core, path)
    table: dict[str, Callable[[], Runner | None]] = {
        "ort-fp32": lambda: _ort(fp32 / "model.onnx", threads),
        "ort-fp32-std": lambda: _ort(fp32 / "model.onnx", threads, ops=False),
        "ov-fp32": lambda: _ov(read(str(fp32 / "model.onnx")), "fp32", threads),
        "ov-bf16": lambda: _ov(read(str(fp32 / "model.onnx")), "bf16", threads),
        "ort-int8": lambda: _ort(int8 / "model.onnx", threads),
        "ov-int8": lambda: _ov(read(str(int8 / "model.onnx")), "bf16", threads),
        "nncf-int8": lambda: (lambda m: _ov(m, "bf16", threads) if m is not None else None)(
            nncf_model(fp32 / "model.onnx", calib))}
    for p in paths:
        r = table[p]()
        if r is not None:
            out[p] = r
    return out


def time_interleaved(runs: dict[str, Runner], x: np.ndarray, repeats: int, warmup: int,
                     seed: int = 0) -> dict[str, list[float]]:
    """Each path once per round, in a fresh random order (no path always follows the same one), ``repeats``
    rounds after ``warmup``; seconds per run."""
    for _ in range(warmup):
        for r in runs.values():
            r(x)
    times: dict[str, list[float]] = {k: [] for k in runs}
    rng = np.random.default_rng(seed)
    for _ in range(repeats):
        for k in rng.permutation(list(runs)):
            r = runs[k]
            start = time.perf_counter()
            r(x)
            times[k].append(time.perf_counter() - start)
    return times


def run_cpu_bench(models: Sequence[str], batches: Sequence[int], *, paths: Sequence[str] = PATHS,
                  repeats: int = 10, warmup: int = 2, threads: int = 0, img_size: int = 224,
                  calibration_size: int = 32, scope: str = "linear",
                  served: int = 0) -> tuple[list[Row], list[str]]:
    """Latency rows for every (model, path, batch) and, with ``served`` requests, the served lines.

    Every (model, path) pair runs in the same interleaved rounds, so the iRPE/plain ratios on a path are side
    by side too."""
    from irpe.export.bench import BENCH_MODELS

    unknown = [m for m in models if m not in BENCH_MODELS] + [p for p in paths if p not in PATHS]
    if unknown:
        raise ValueError(f"unknown bench model/path {unknown}; models: {', '.join(BENCH_MODELS)}; "
                         f"paths: {', '.join(PATHS)}")
    threads = threads or os.cpu_count() or 1
    rows: list[Row] = []
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="irpe-bench-cpu-") as tmp:
        calib_dir = photo_dir(Path(tmp) / "photos", calibration_size + 16)
        runs: dict[str, Runner] = {}
        artifacts = {}
        for m in models:
            _log(f"exporting {m} fp32 and int8 (calibrating on {calibration_size} photo crops)")
            artifacts[m] = export_pair(BENCH_MODELS[m], Path(tmp), calib_dir, img_size=img_size,
                                       calibration_size=calibration_size, scope=scope)
            from irpe.artifact import load_artifact
            from irpe.export.fidelity import image_sets

            calib = image_sets(str(calib_dir), load_artifact(artifacts[m][0]),
                               calibration_size=calibration_size).calibration
            runs |= {f"{m}|{p}": r for p, r in runners(*artifacts[m], calib, threads, paths).items()}
        for b in batches:
            _log(f"batch {b}: {len(runs)} model x path pairs x {repeats} interleaved rounds")
            x = np.random.default_rng(0).standard_normal((b, 3, img_size, img_size), dtype=np.float32)
            for key, t in time_interleaved(runs, x, repeats, warmup).items():
                m, p = key.split("|")
                rows.append(Row(m, p, b, float(np.median(t) * 1e3), len(t), float(np.min(t) * 1e3)))
        if served:
            from .cpu_served import served_lines

            for m, (fp32, int8) in artifacts.items():
                notes += served_lines(m, fp32, int8, served, rows)
    return rows, notes


def format_table(rows: list[Row]) -> str:
    """One line per (model, batch, path): median ms with its ratios to ONNX Runtime fp32, to NNCF and to plain
    DeiT-S on the same path, then the fastest round's ms with the same three ratios."""
    head = f"{'vs ort-fp32':>11s} {'vs nncf':>8s} {'vs plain':>8s}"
    lines = [f"{'model':6s} {'batch':>5s} {'path':10s} {'median ms':>10s} {head} {'best ms':>8s} {head}"]
    keys = sorted({(r.model, r.batch) for r in rows}, key=lambda k: (k[0], k[1]))
    for model, batch in keys:
        group = {r.path: r for r in rows if (r.model, r.batch) == (model, batch)}
        plain = {r.path: r for r in rows if (r.model, r.batch) == ("plain", batch)}
        base, anchor = group.get("ort-fp32"), group.get("nncf-int8")
        for p in PATHS:
            if p in group:
                r, refs = group[p], (base, anchor, plain.get(p))
                lines.append(f"{model:6s} {batch:5d} {p:10s} {r.median_ms:10.1f} {_ratios(r, refs, 'median_ms')} "
                             f"{r.best_ms:8.1f} {_ratios(r, refs, 'best_ms')}")
    return "\n".join(lines)


def format_plain_ratios(rows: list[Row]) -> str:
    """Per batch and path: plain DeiT-S median ms and each iRPE model's median over it (same path, same rounds)."""
    others = sorted({r.model for r in rows} - {"plain"})
    lines = [f"{'batch':>5s} {'path':10s} {'plain ms':>9s} " + " ".join(f"{m + ' / plain':>12s}" for m in others)]
    for batch in sorted({r.batch for r in rows}):
        median = {(r.model, r.path): r.median_ms for r in rows if r.batch == batch}
        for p in PATHS:
            base = median.get(("plain", p))
            if base:
                cells = [f"{median[(m, p)] / base:11.2f}x" if (m, p) in median else f"{'n/a':>12s}" for m in others]
                lines.append(f"{batch:5d} {p:10s} {base:9.1f} " + " ".join(cells))
    return "\n".join(lines) if len(lines) > 1 else ""


def _ratios(r: Row, refs: tuple[Row | None, ...], attr: str) -> str:
    def ratio(ref: Row | None, width: int) -> str:
        den = getattr(ref, attr) if ref else 0.0
        return f"{getattr(r, attr) / den:{width - 1}.2f}x" if den else f"{'n/a':>{width}s}"

    return " ".join(ratio(ref, w) for ref, w in zip(refs, (11, 8, 8), strict=True))
