"""``irpe bench latency``: what the batcher adds to a lone request, and throughput under load, side by side.

1. raw: the engine alone at batch 1 (as the server builds it), p50 of single calls, no load;
2. served: ``irpe serve`` in a subprocess, ``POST /v2/models/{m}/infer`` with one preprocessed image
   (binary tensor extension, as tritonclient sends it): p50 at concurrency 1 and req/s at the top level;
3. optionally a baseline server (``--baseline-pythonpath``: another checkout's import tree, e.g. the
   previous release) driven identically, interleaved over rounds so both see the same machine load.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .loadgen import LoadResult, run_load
from .serve import _free_port, _merge, build_artifact, server_process


def v2_request(model: str, host: str, x: np.ndarray) -> bytes:
    """A complete HTTP/1.1 ``infer`` POST with ``x`` as a binary FP32 tensor and a binary output."""
    head = json.dumps({"inputs": [{"name": "images", "shape": list(x.shape), "datatype": "FP32",
                                   "parameters": {"binary_data_size": x.nbytes}}],
                       "outputs": [{"name": "logits", "parameters": {"binary_data": True}}]}).encode()
    body = head + np.ascontiguousarray(x, dtype=np.float32).tobytes()
    return (f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/octet-stream\r\n"
            f"Inference-Header-Content-Length: {len(head)}\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body


def raw_batch1_ms(artifact_dir: Path, calls: int = 100) -> float:
    """p50 latency (ms) of one batch-1 engine call, the engine built as ``irpe serve`` builds it."""
    from irpe.artifact import load_artifact
    from irpe.server.config import Settings
    from irpe.server.engines import load_engine

    art = load_artifact(artifact_dir)
    s = Settings.from_env(env={}, artifact_dir=str(artifact_dir))
    engine = load_engine(artifact_dir, art, max_batch=s.resolved_max_batch(), threads=s.resolved_threads())
    x = np.random.default_rng(0).standard_normal((1, 3, art.preprocess.crop, art.preprocess.crop), np.float32)
    engine.run(x)
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        engine.run(x)
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3


@dataclass
class LatencyReport:
    """Raw batch-1 p50s (one per round) and each server's pooled load results per concurrency."""

    model: str
    raw_ms: list[float]
    servers: dict[str, dict[int, LoadResult]] = field(default_factory=dict)
    queue_ms: dict[str, dict[int, float]] = field(default_factory=dict)  # mean batcher queue wait per image


def bench_latency(artifact_dir: Path, *, requests: int = 200, concurrency: tuple[int, ...] = (1, 32),
                  rounds: int = 3, baseline_pythonpath: str | None = None,
                  server_args: tuple[str, ...] = ()) -> LatencyReport:
    """Interleave raw, this server and (optionally) the baseline over ``rounds``."""
    from irpe.artifact import load_artifact

    art = load_artifact(artifact_dir)
    x = np.random.default_rng(1).standard_normal((1, 3, art.preprocess.crop, art.preprocess.crop), np.float32)
    labels = ["this"] + (["baseline"] if baseline_pythonpath else [])
    envs = {"this": {}, "baseline": {"PYTHONPATH": baseline_pythonpath or ""}}
    runs: dict[str, dict[int, list[LoadResult]]] = {k: {c: [] for c in concurrency} for k in labels}
    waits = {k: {c: [0.0, 0.0] for c in concurrency} for k in labels}
    rep = LatencyReport(art.name, [])
    ports = {k: _free_port() for k in labels}
    with contextlib.ExitStack() as stack:
        pids = {k: stack.enter_context(_server(["-m", "irpe.cli", "serve", str(artifact_dir), "--port", str(ports[k]),
                                                "--log-level", "warning", *server_args], ports[k], envs[k])).pid
                for k in labels}
        per_round = max(1, requests // rounds)
        for _ in range(rounds):
            rep.raw_ms.append(raw_batch1_ms(artifact_dir))
            for k in labels:
                payload = v2_request(art.name, f"127.0.0.1:{ports[k]}", x)
                for c in concurrency:
                    run_load("127.0.0.1", ports[k], payload, max(c, 4), c)  # warm connections
                    before = queue_wait_totals(ports[k])
                    runs[k][c].append(run_load("127.0.0.1", ports[k], payload, per_round, c, server_pid=pids[k]))
                    after = queue_wait_totals(ports[k])
                    waits[k][c] = [w + a - b for w, a, b in zip(waits[k][c], after, before, strict=True)]
    rep.servers = {k: {c: _merge(v) for c, v in per.items()} for k, per in runs.items()}
    rep.queue_ms = {k: {c: 1e3 * s / max(n, 1) for c, (s, n) in per.items()} for k, per in waits.items()}
    return rep


def queue_wait_totals(port: int) -> tuple[float, float]:
    """(seconds, images) of ``irpe_queue_wait_seconds`` so far, from the server's /metrics."""
    import httpx

    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    values = dict(line.rsplit(" ", 1) for line in text.splitlines() if line.startswith("irpe_queue_wait_seconds_"))
    return float(values.get("irpe_queue_wait_seconds_sum", 0)), float(values.get("irpe_queue_wait_seconds_count", 0))


@contextlib.contextmanager
def _server(args: list[str], port: int, env: dict[str, str]) -> Iterator[subprocess.Popen]:
    """:func:`server_process` started with ``env`` added to this process's environment."""
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        ctx = server_process(args, port)
        proc = ctx.__enter__()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    try:
        yield proc
    finally:
        ctx.__exit__(None, None, None)


def format_latency(rep: LatencyReport) -> str:
    """The table ``irpe bench latency`` prints."""
    raw = float(np.median(rep.raw_ms))
    lines = [f"model: {rep.model}; raw engine batch-1 p50: {raw:.3f} ms (median of rounds "
             f"{', '.join(f'{v:.3f}' for v in rep.raw_ms)})",
             f"{'server':<9} {'conc':>5} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'p50-raw':>8} {'errors':>7} "
             f"{'CPU ms/req':>10} {'queue ms':>8}"]
    for name, per in rep.servers.items():
        for c, r in per.items():
            p50 = r.percentile(50) * 1e3
            lines.append(f"{name:<9} {c:>5} {r.rps:>8.1f} {p50:>8.2f} {r.percentile(99) * 1e3:>8.2f} "
                         f"{p50 - raw:>8.2f} {r.errors:>7} {r.cpu_ms_per_request:>10.2f} "
                         f"{rep.queue_ms.get(name, {}).get(c, float('nan')):>8.2f}")
    if "baseline" in rep.servers:
        top = max(rep.servers["this"])
        low = min(rep.servers["this"])
        this, base = rep.servers["this"], rep.servers["baseline"]
        lines.append(f"this/baseline: p50 at concurrency {low} "
                     f"{this[low].percentile(50) / base[low].percentile(50):.2f}, "
                     f"req/s at concurrency {top} {this[top].rps / max(base[top].rps, 1e-9):.2f}, server CPU per "
                     f"request at concurrency {top} {this[top].cpu_ms_per_request / base[top].cpu_ms_per_request:.2f}")
    return "\n".join(lines)


def run_latency(artifact: str | None, requests: int, concurrency: tuple[int, ...],
                baseline_pythonpath: str | None, server_args: tuple[str, ...] = ()) -> LatencyReport:
    """Entry point of ``irpe bench latency`` (exports a DeiT-Tiny iRPE-K artifact when none is given)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="irpe-bench-") as tmp:
        artifact_dir = Path(artifact) if artifact else build_artifact(Path(tmp))
        rep = bench_latency(artifact_dir, requests=requests, concurrency=concurrency,
                            baseline_pythonpath=baseline_pythonpath, server_args=server_args)
    print(format_latency(rep))
    return rep
