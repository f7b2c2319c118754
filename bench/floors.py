"""What no server can go below on this machine: the CPU of decode + preprocess and of the engine alone.

Measured in the bench process, one thread, the same 512x512 JPEG and artifact as the served runs,
interleaved with nothing else of ours; the HTTP floor (an empty ASGI app under the same load) is a
served variant of :mod:`.frontend`. :class:`BareSession` is ``irpe bench triton``'s engine floor (the KServe
front-end floor there is :mod:`.empty_kserve`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np


def cpu_ms(fn: Callable[[], object], repeats: int = 200) -> float:
    """Median over 5 blocks of the calling thread's CPU-ms per call."""
    fn()
    blocks = []
    for _ in range(5):
        start = time.thread_time()
        for _ in range(max(1, repeats // 5)):
            fn()
        blocks.append(1e3 * (time.thread_time() - start) / max(1, repeats // 5))
    return float(np.median(blocks))


def measure_floors(artifact: Path, payload: bytes) -> dict[str, float]:
    """CPU-ms of: bit-exact decode + preprocess (the server's path, and Pillow's), engine per image at
    batch 1 and 4 (the session as the server builds it)."""
    from irpe.artifact import load_artifact
    from irpe.artifact.preprocess import preprocess_image
    from irpe.server.config import Settings
    from irpe.server.engines import load_engine
    from irpe.server.memory import fix_mmap_threshold
    from irpe.server.pipeline.decode import decode_image, prepare

    fix_mmap_threshold()
    art = load_artifact(artifact)
    pp = art.preprocess
    s = Settings.from_env(env={}, artifact_dir=str(artifact))
    engine = load_engine(artifact, art, threads=s.resolved_threads(), max_batch=4)
    x = prepare(payload, pp, s.max_pixels)
    out = {"decode+preprocess": cpu_ms(lambda: prepare(payload, pp, s.max_pixels)),
           "decode+preprocess (Pillow)": cpu_ms(lambda: preprocess_image(decode_image(payload, s.max_pixels), pp))}
    for b in (1, 4):
        batch = np.stack([x] * b)
        out[f"engine, batch {b} (per image)"] = cpu_ms(lambda batch=batch: engine.run(batch)) / b
    return out


def format_floors(floors: dict[str, float]) -> str:
    """One line per floor."""
    return "\n".join(f"  {k:<30} {v:6.2f} CPU-ms" for k, v in floors.items())


class BareSession:
    """The engine alone: an ONNX Runtime session on every usable core at batch 1 (what a lone request
    could get), timed between the rounds (the servers idle then); beside it a one-thread session whose CPU
    per image is the engine's floor of the CPU per request."""

    def __init__(self, artifact: Path, runs: int = 30):
        import numpy as np
        import onnxruntime as ort

        from irpe.artifact import load_artifact
        from irpe.server.config import usable_cpus

        art = load_artifact(artifact)
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads, self.threads = usable_cpus(), 1, usable_cpus()
        self.session = ort.InferenceSession(str(artifact / art.onnx_file), so, providers=["CPUExecutionProvider"])
        one = ort.SessionOptions()
        one.intra_op_num_threads = one.inter_op_num_threads = 1
        self.one = ort.InferenceSession(str(artifact / art.onnx_file), one, providers=["CPUExecutionProvider"])
        self.feed = {art.input_name: np.zeros((1, 3, art.preprocess.crop, art.preprocess.crop), np.float32)}
        self.runs, self.times, self.cpu = runs, [], []
        self.session.run(None, self.feed)
        self.one.run(None, self.feed)

    def time(self) -> None:
        """``runs`` timed calls."""
        import time

        for _ in range(self.runs):
            start = time.perf_counter()
            self.session.run(None, self.feed)
            self.times.append(time.perf_counter() - start)
            start = time.thread_time()
            self.one.run(None, self.feed)
            self.cpu.append(time.thread_time() - start)

    def p50_ms(self) -> float:
        """Median wall time of the every-core session (nan before any round)."""
        return 1e3 * statistics.median(self.times) if self.times else float("nan")

    def cpu_us(self) -> float:
        """Median CPU-us per image of the one-thread session (nan before any round)."""
        return 1e6 * statistics.median(self.cpu) if self.cpu else float("nan")
