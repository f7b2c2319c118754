"""``irpe bench serve``: the served throughput against the raw engine and a naive server, same run.

1. raw: the engine alone on preprocessed input, batch 8 and 16 (best of: the engine as the server runs it,
   i.e. its session options and inference-thread count, and ONNX Runtime's default session), no load;
2. served: ``irpe serve`` in a subprocess, driven with real 512x512 JPEG uploads at each concurrency;
3. naive: a one-request-per-inference FastAPI server, same load at the highest concurrency.
Without ``--artifact`` a DeiT-Tiny iRPE-K artifact with random weights is exported first (needs torch).
"""

from __future__ import annotations

import contextlib
import io
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .loadgen import LoadResult, multipart_request, run_load

DEFAULT_MODEL = "deit_tiny_patch16_224_ctx_product_50_shared_k"


@dataclass
class BenchReport:
    """Everything ``irpe bench serve`` measured."""

    model: str
    raw: dict[int, float]
    served: dict[int, LoadResult]
    naive: LoadResult
    raw_cpu_ms: dict[int, float]

    @property
    def raw_best(self) -> float:
        """Best raw images/s over the batch sizes."""
        return max(self.raw.values())

    def ratios(self) -> dict[str, float]:
        """Throughput ratios at the top concurrency, and the same in CPU time per image (robust to other
        load on the machine: wall-clock shares shift with whatever else runs, CPU cost per image does not)."""
        top = self.served[max(self.served)]
        return {"served/raw": top.rps / self.raw_best, "served/naive": top.rps / max(self.naive.rps, 1e-9),
                "cpu served/raw": min(self.raw_cpu_ms.values()) / top.cpu_ms_per_request,
                "cpu served/naive": self.naive.cpu_ms_per_request / top.cpu_ms_per_request}


def build_artifact(out_dir: Path, model: str = DEFAULT_MODEL) -> Path:
    """Export ``model`` with random weights (torch and irpe.export are imported here only)."""
    import torch

    from irpe.export import ExportOptions, export_artifact
    from irpe.models import create_model

    torch.manual_seed(0)
    ckpt = out_dir / "random.pth"
    torch.save(create_model(model).state_dict(), ckpt)
    return Path(export_artifact(ckpt, out_dir / "artifact", ExportOptions(name=model, progress=False)))


def sample_jpeg(size: int = 512, seed: int = 0) -> bytes:
    """A photo-like (smooth, noisy) RGB JPEG."""
    from PIL import Image, ImageFilter

    rng = np.random.default_rng(seed)
    base = Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8), "RGB").resize((size, size),
                                                                                         Image.BICUBIC)
    noise = Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8), "RGB")
    img = Image.blend(base, noise.filter(ImageFilter.GaussianBlur(1)), 0.25)
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=90)
    return buf.getvalue()


Runner = tuple[Callable[[np.ndarray], np.ndarray], int]


def raw_runners(artifact_dir: Path, max_batch: int = 16) -> list[Runner]:
    """(run, parallel callers): the engine as the server runs it, and ORT's default session options."""
    import onnxruntime as ort

    from irpe.artifact import load_artifact
    from irpe.server.config import Settings
    from irpe.server.engines import load_engine

    art = load_artifact(artifact_dir)
    s = Settings.from_env(env={}, artifact_dir=str(artifact_dir))
    engine = load_engine(artifact_dir, art, max_batch=max_batch, threads=s.resolved_threads())  # same options
    default = ort.InferenceSession(str(artifact_dir / art.onnx_file), providers=["CPUExecutionProvider"])
    return [(engine.run, s.resolved_inference_threads()),
            (lambda x: default.run(None, {art.input_name: x})[0], 1)]


def raw_throughput(runners: list[Runner], crop: int, batches: tuple[int, ...] = (8, 16),
                   seconds: float = 2.0) -> dict[int, tuple[float, float]]:
    """(images/s, CPU ms/image) of the engine alone per batch size, best runner, preprocessed input."""
    out: dict[int, tuple[float, float]] = {}
    for b in batches:
        x = np.random.default_rng(0).standard_normal((b, 3, crop, crop), dtype=np.float32)
        out[b] = max(_time_runs(run, x, seconds / len(runners), par) for run, par in runners)
    return out


def _time_runs(run: Callable[[np.ndarray], np.ndarray], x: np.ndarray, seconds: float,
               parallel: int = 1) -> tuple[float, float]:
    """(images/s, CPU ms per image) with ``parallel`` threads calling ``run(x)`` for ``seconds``."""
    run(x)
    counts = [0] * parallel
    start, cpu = time.perf_counter(), time.process_time()

    def loop(i: int) -> None:
        """One caller thread."""
        while time.perf_counter() - start < seconds or counts[i] < 2:
            run(x)
            counts[i] += 1

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(parallel)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    images = sum(counts) * len(x)
    return images / (time.perf_counter() - start), 1e3 * (time.process_time() - cpu) / images


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(port: int, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode} before it was ready")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    raise TimeoutError(f"server on port {port} not ready within {timeout}s")


@contextlib.contextmanager
def server_process(args: list[str], port: int, env: dict[str, str] | None = None,
                   stop_timeout: float = 30, stderr: Any = None) -> Iterator[subprocess.Popen]:
    """Start ``python args...`` (``env`` added to the environment; ``stderr``: where its log goes, default
    ours) and wait for /readyz; SIGTERM on exit."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    proc = subprocess.Popen([sys.executable, *args], env=env, stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        _wait_ready(port, proc)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(stop_timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _drive(server: tuple[int, int], payload: bytes, requests: int, concurrency: int) -> LoadResult:
    port, pid = server
    run_load("127.0.0.1", port, payload, max(concurrency, 4), concurrency)  # warm connections and caches
    return run_load("127.0.0.1", port, payload, requests, concurrency, server_pid=pid)


def _merge(runs: list[LoadResult]) -> LoadResult:
    """Rounds of one measurement as one result (total requests over total time)."""
    out = LoadResult(sum(r.requests for r in runs), runs[0].concurrency, sum(r.seconds for r in runs),
                     server_cpu_s=sum(r.server_cpu_s for r in runs))
    for r in runs:
        out.latencies += r.latencies
        out.errors += r.errors
        for k, v in r.statuses.items():
            out.statuses[k] = out.statuses.get(k, 0) + v
    return out


def bench_serve(artifact_dir: Path, *, requests: int = 240, concurrency: tuple[int, ...] = (1, 8, 32),
                server_args: tuple[str, ...] = (), rounds: int = 3, raw_seconds: float = 2.0) -> BenchReport:
    """Raw, served (each concurrency) and naive (highest concurrency), interleaved over ``rounds``.

    Interleaving keeps the comparison fair when other work on the machine comes and goes; each figure is
    the median (raw) or the pooled rate (servers) over the rounds.
    """
    from irpe.artifact import load_artifact

    art = load_artifact(artifact_dir)
    runners = raw_runners(artifact_dir)
    payload = sample_jpeg()
    per_round = max(1, requests // rounds)
    ports = _free_port(), _free_port()
    raws: list[dict[int, tuple[float, float]]] = []
    served: dict[int, list[LoadResult]] = {c: [] for c in concurrency}
    naive: list[LoadResult] = []
    with server_process(["-m", "irpe.cli", "serve", str(artifact_dir), "--port", str(ports[0]),
                         "--log-level", "warning", *server_args], ports[0]) as p0, \
            server_process(["-m", "irpe.bench.naive_server", str(artifact_dir), str(ports[1])], ports[1]) as p1:
        for _ in range(rounds):
            raws.append(raw_throughput(runners, art.preprocess.crop, seconds=raw_seconds))
            for c in concurrency:
                served[c].append(_drive((ports[0], p0.pid), _request(ports[0], payload), per_round, c))
            naive.append(_drive((ports[1], p1.pid), _request(ports[1], payload), per_round, max(concurrency)))
    raw = {b: float(np.median([r[b][0] for r in raws])) for b in raws[0]}
    raw_cpu = {b: float(np.median([r[b][1] for r in raws])) for b in raws[0]}
    return BenchReport(art.name, raw, {c: _merge(v) for c, v in served.items()}, _merge(naive), raw_cpu)


def _request(port: int, payload: bytes) -> bytes:
    return multipart_request("/classify?top_k=5", f"127.0.0.1:{port}", payload)


def format_report(rep: BenchReport) -> str:
    """The table ``irpe bench serve`` prints."""
    lines = [f"model: {rep.model}",
             "raw engine (img/s, median of rounds): " + ", ".join(f"batch {b}: {v:.1f}" for b, v in rep.raw.items())
             + f"  -> best {rep.raw_best:.1f}; CPU ms/img: "
             + ", ".join(f"batch {b}: {v:.1f}" for b, v in rep.raw_cpu_ms.items()),
             f"{'server':<8} {'conc':>5} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7} {'/raw':>6} "
             f"{'CPU ms/req':>10}"]
    rows = [("served", r) for r in rep.served.values()] + [("naive", rep.naive)]
    for name, r in rows:
        lines.append(f"{name:<8} {r.concurrency:>5} {r.rps:>8.1f} {r.percentile(50) * 1e3:>8.1f} "
                     f"{r.percentile(99) * 1e3:>8.1f} {r.errors:>7} {r.rps / rep.raw_best:>6.2f} "
                     f"{r.cpu_ms_per_request:>10.1f}")
    ratios = rep.ratios()
    top = max(rep.served)
    lines.append(f"at concurrency {top}: served/raw = {ratios['served/raw']:.2f} (target >= 0.85), "
                 f"served/naive = {ratios['served/naive']:.2f} (target >= 1.25)")
    lines.append(f"CPU-time efficiency (img per CPU-second): served/raw = {ratios['cpu served/raw']:.2f}, "
                 f"served/naive = {ratios['cpu served/naive']:.2f}")
    return "\n".join(lines)


def run_bench(artifact: str | None, requests: int, concurrency: tuple[int, ...],
              server_args: tuple[str, ...] = ()) -> BenchReport:
    """Entry point of ``irpe bench serve`` (exports a DeiT-Tiny iRPE-K artifact when none is given)."""
    with tempfile.TemporaryDirectory(prefix="irpe-bench-") as tmp:
        if artifact is None:
            print(f"exporting {DEFAULT_MODEL} with random weights ...", flush=True)
            artifact_dir = build_artifact(Path(tmp))
        else:
            artifact_dir = Path(artifact)
        rep = bench_serve(artifact_dir, requests=requests, concurrency=concurrency, server_args=server_args)
    print(format_report(rep))
    return rep
