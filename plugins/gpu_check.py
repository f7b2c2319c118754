"""``python -m irpe.plugins.gpu_check OUTDIR [--quick]``: what scripts/gpu-check.sh runs on a GPU host.

Each step prints ``PASS``/``FAIL``/``SKIP`` with its time and figures as it finishes, and the results so far
are rewritten to ``OUTDIR/gpu-check.json`` and appended to ``OUTDIR/gpu-check.txt`` after every step, so a run
cut short still leaves them. A step whose dependency is missing (no CUDA device, no CuPy, no TensorRT, even no
NumPy) is ``SKIP`` with the reason. ``--device cpu`` rehearses steps 2 and 4 on the CPU (Triton's interpreter).
Steps (the GPU ones live in :mod:`irpe.plugins.gpu_steps`):

1. nvidia-smi: GPU name, compute capability, driver, memory.
2. The Triton kernels on the GPU against NumPy, fp32 and fp16, at the shape corners of tests/plugins (us/call).
3. The ahead-of-time PTX loaded and launched with CuPy with exactly the grid, block, dynamic shared memory and
   argument list the TensorRT plugin declares, against NumPy.
4. The PyTorch model on CUDA against ONNX Runtime CPU on the exported graph, fp32 and fp16, and img/s.
5. ONNX Runtime's CUDA execution provider on the same graph (onnxruntime-gpu only).
6. Where TensorRT imports: engine build from the exported ONNX and parity with ONNX Runtime.

This module needs only the standard library: it runs (and says why every step skips) on any Python.
Exit status 1 if a step failed (a skipped step is not a failure).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import Any, TextIO

JSON_NAME = "gpu-check.json"
TEXT_NAME = "gpu-check.txt"
# import name -> what the report lists; the distributions are found by import name
PACKAGES = ("numpy", "torch", "triton", "cupy", "onnxruntime", "onnx", "tensorrt")
OVERRUN_S = 60.0  # a step still running this long after the budget ended is stopped (FAIL)


class Status(Enum):
    """How one step ended."""

    PASS = "PASS"
    FAIL = "FAIL"
    SKIP = "SKIP"


class Skip(Exception):
    """A step that cannot run on this host; the message is the reason."""


@dataclass(frozen=True)
class Profile:
    """How much each step does: shape corners, timing repetitions, model and batch sizes, time budget."""

    name: str
    corners: tuple[tuple[int, int, int, int], ...]  # (B, H, L, K), L = skip + grid^2
    reps: int
    model: str
    img_size: int
    batches: tuple[int, ...]
    budget_s: float


# tests/plugins/test_kernels.py's corners plus DeiT-S at 224 px (8, 6, 197, 82)
ALL_CORNERS = ((1, 1, 49, 9), (64, 1, 51, 82), (1, 2, 578, 82), (64, 1, 197, 9), (2, 3, 576, 9), (8, 6, 197, 82))
PROFILES = {
    "full": Profile("full", ALL_CORNERS, reps=50, model="deit_small_patch16_224_ctx_product_50_shared_qkv",
                    img_size=224, batches=(1, 8, 64), budget_s=300.0),
    "quick": Profile("quick", (ALL_CORNERS[0], ALL_CORNERS[-1]), reps=10,
                     model="deit_tiny_patch16_224_ctx_product_50_shared_k", img_size=224, batches=(1, 8),
                     budget_s=150.0),
    # --device cpu: the steps' own code with Triton's interpreter and PyTorch on the CPU, to rehearse a setup
    "cpu": Profile("cpu", (ALL_CORNERS[0],), reps=1, model="deit_micro_patch4_32_ctx_product_shared_k",
                   img_size=32, batches=(1,), budget_s=150.0),
}


@dataclass(frozen=True)
class Finding:
    """What a passing step found: one line for people, figures for the JSON."""

    detail: str
    figures: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class StepContext:
    """What every step gets: a scratch folder (shared between steps), the profile and the torch device."""

    workdir: Path
    profile: Profile
    device: str = "cuda"


@dataclass(frozen=True)
class StepResult:
    """One finished step, as printed and as written to the JSON."""

    name: str
    status: Status
    seconds: float
    detail: str
    figures: dict[str, Any]

    def line(self) -> str:
        """``STATUS name (t s): detail``, the form printed and written to the text file."""
        return f"{self.status.value} {self.name} ({self.seconds:.1f} s): {self.detail}"


def step_nvidia_smi(context: StepContext) -> Finding:
    """GPU name, compute capability, driver and memory from nvidia-smi.

    Raises:
        Skip: nvidia-smi is not on PATH.
        RuntimeError: nvidia-smi failed.
    """
    if shutil.which("nvidia-smi") is None:
        raise Skip("nvidia-smi not found (no NVIDIA driver on this host)")
    res = subprocess.run(["nvidia-smi", "--query-gpu=name,compute_cap,driver_version,memory.total",
                          "--format=csv,noheader"], capture_output=True, text=True, timeout=60)
    if res.returncode != 0:
        raise RuntimeError(f"nvidia-smi failed: {res.stderr.strip()}")
    gpus = [line.strip() for line in res.stdout.strip().splitlines()]
    return Finding("; ".join(gpus), {"gpus": gpus})


def _gpu_step(name: str) -> Callable[[StepContext], Finding]:
    """A step of :mod:`irpe.plugins.gpu_steps`, imported when it runs (it needs NumPy)."""

    def run(context: StepContext) -> Finding:
        try:
            steps = importlib.import_module("irpe.plugins.gpu_steps")
        except ModuleNotFoundError as e:
            if e.name and not e.name.startswith("irpe"):
                raise Skip(f"{e.name} is not installed (the GPU steps need NumPy)") from None
            raise
        return getattr(steps, name)(context)

    return run


def steps() -> list[tuple[str, Callable[[StepContext], Finding]]]:
    """The steps in the order they run: (name, function)."""
    return [("nvidia-smi", step_nvidia_smi),
            ("Triton kernels vs NumPy", _gpu_step("step_triton_kernels")),
            ("AOT PTX launched with CuPy", _gpu_step("step_ptx_with_cupy")),
            ("PyTorch CUDA vs ONNX Runtime CPU", _gpu_step("step_torch_vs_onnxruntime")),
            ("ONNX Runtime CUDA provider", _gpu_step("step_onnxruntime_cuda")),
            ("TensorRT engine + parity", _gpu_step("step_tensorrt"))]


def package_versions() -> dict[str, str]:
    """Installed version of each of :data:`PACKAGES` (by import name), or ``"not installed"``; imports none."""
    dists = importlib.metadata.packages_distributions()
    found = {}
    for name in PACKAGES:
        if importlib.util.find_spec(name) is None:
            found[name] = "not installed"
            continue
        versions = [f"{dist} {importlib.metadata.version(dist)}" for dist in sorted(set(dists.get(name, [])))]
        found[name] = ", ".join(versions) or "installed (no distribution metadata)"
    return found


def _plain(value: Any) -> Any:
    """A figure json cannot write as it is: a NumPy scalar or array as Python numbers, anything else as text."""
    return value.tolist() if hasattr(value, "tolist") else str(value)


class Report:
    """The results so far, printed and kept in ``OUTDIR`` (JSON rewritten, text appended, after every step)."""

    def __init__(self, outdir: Path, profile: Profile, out: TextIO) -> None:
        self.outdir, self.out = outdir, out
        outdir.mkdir(parents=True, exist_ok=True)
        self.header = {"tool": "irpe gpu-check", "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                       "host": platform.node(), "python": f"{sys.version.split()[0]} ({sys.executable})",
                       "profile": asdict(profile), "packages": package_versions()}
        self.results: list[StepResult] = []
        (outdir / TEXT_NAME).write_text("", encoding="utf-8")
        self._emit(f"irpe gpu-check {self.header['started']} on {self.header['host']}, profile {profile.name} "
                   f"(budget {profile.budget_s:.0f} s), Python {self.header['python']}")
        self._emit("packages: " + "; ".join(f"{k}: {v}" for k, v in self.header["packages"].items()))
        self._write_json(running=None, exit_status=None)

    def _emit(self, line: str) -> None:
        print(line, file=self.out, flush=True)
        with open(self.outdir / TEXT_NAME, "a", encoding="utf-8") as text:
            text.write(line + "\n")

    def _write_json(self, *, running: str | None, exit_status: int | None) -> None:
        steps = [{**asdict(r), "status": r.status.value} for r in self.results]
        doc = {**self.header, "running": running, "steps": steps, "finished": exit_status is not None,
               "exit_status": exit_status}
        partial = self.outdir / (JSON_NAME + ".partial")
        partial.write_text(json.dumps(doc, indent=2, default=_plain) + "\n", encoding="utf-8")
        os.replace(partial, self.outdir / JSON_NAME)

    def starting(self, name: str) -> None:
        """Record which step is running (so a run cut short shows where)."""
        self._write_json(running=name, exit_status=None)

    def record(self, result: StepResult) -> None:
        """Print one finished step and write it to both files."""
        self.results.append(result)
        self._emit(result.line())
        self._write_json(running=None, exit_status=None)

    def finish(self) -> int:
        """Write the closing line; 1 if a step failed, else 0."""
        counts = {status: sum(r.status is status for r in self.results) for status in Status}
        exit_status = 1 if counts[Status.FAIL] else 0
        self._emit(", ".join(f"{n} {s.value}" for s, n in counts.items()) + f"; exit status {exit_status}")
        self._write_json(running=None, exit_status=exit_status)
        return exit_status


class Overrun(Exception):
    """A step still running :data:`OVERRUN_S` seconds after the time budget ended."""


@contextlib.contextmanager
def overrun_alarm(seconds: float) -> Iterator[None]:
    """Raise :class:`Overrun` in the step if it is still running after ``seconds`` (SIGALRM, main thread only;
    a call blocked inside C code is interrupted when it returns to Python)."""
    if not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def overrun(signum: int, frame: Any) -> None:
        raise Overrun(f"still running {OVERRUN_S:.0f} s after the time budget ended; stopped (raise --budget)")

    previous = signal.signal(signal.SIGALRM, overrun)
    start = time.monotonic()
    outer, _ = signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer:  # an alarm set by the caller (a test runner's timeout) keeps its time left
            signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - start), 0.01))


def run_step(name: str, function: Callable[[StepContext], Finding], context: StepContext) -> StepResult:
    """Run one step: PASS with its finding, SKIP with the reason, or FAIL with the error (never raises)."""
    start = time.perf_counter()
    try:
        finding = function(context)
        status, detail, figures = Status.PASS, finding.detail, finding.figures
    except Skip as e:
        status, detail, figures = Status.SKIP, str(e), {}
    except ModuleNotFoundError as e:  # a dependency is missing: SKIP; a module of ours: a broken checkout
        missing = e.name is not None and e.name.split(".")[0] != "irpe"
        status = Status.SKIP if missing else Status.FAIL
        detail, figures = (f"needs {e.name}, which is not installed" if missing else f"{type(e).__name__}: {e}"), {}
    except Exception as e:  # noqa: BLE001 - report it and go on with the next step
        status, detail, figures = Status.FAIL, f"{type(e).__name__}: {str(e)[:600]}", {}
    return StepResult(name, status, round(time.perf_counter() - start, 2), detail, figures)


def run_all(outdir: Path, profile: Profile, out: TextIO = sys.stdout, device: str = "cuda") -> int:
    """Run every step within the profile's time budget, reporting each as it ends.

    Args:
        outdir: where gpu-check.json and gpu-check.txt go (created if missing).
        profile: how much each step does (:data:`PROFILES`).
        out: where the lines are printed.
        device: the torch device the GPU steps use.

    Returns:
        1 if any step failed, else 0.
    """
    report = Report(outdir, profile, out)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="irpe-gpu-check-") as tmp:
        context = StepContext(Path(tmp), profile, device)
        for name, function in steps():
            spent = time.perf_counter() - start
            if spent > profile.budget_s:
                report.record(StepResult(name, Status.SKIP, 0.0, f"time budget spent ({spent:.0f} s of "
                                         f"{profile.budget_s:.0f} s; raise it with --budget)", {}))
                continue
            report.starting(name)
            with overrun_alarm(profile.budget_s - spent + OVERRUN_S):
                report.record(run_step(name, function, context))
    return report.finish()


def main(argv: list[str] | None = None) -> int:
    """Command line: ``OUTDIR [--quick] [--budget SECONDS] [--device cuda|cpu]``."""
    parser = argparse.ArgumentParser(prog="gpu-check.sh", description="irpe GPU check: every step prints "
                                     "PASS / FAIL / SKIP with figures; exit status 1 if a step failed")
    parser.add_argument("outdir", type=Path, help=f"folder for {JSON_NAME} and {TEXT_NAME} (created if missing)")
    parser.add_argument("--quick", action="store_true", help="fewer shapes, the tiny model, batches 1 and 8")
    parser.add_argument("--budget", type=float, help="seconds after which the remaining steps skip "
                        "(default: 300 full, 150 --quick)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: rehearse the Triton and "
                        "PyTorch steps on the CPU (Triton's interpreter, the smallest shapes and model)")
    args = parser.parse_args(argv)
    profile = PROFILES["cpu" if args.device == "cpu" else "quick" if args.quick else "full"]
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # read when triton is first imported, which no step has done yet
    if args.budget is not None:
        profile = replace(profile, budget_s=args.budget)
    return run_all(args.outdir, profile, device=args.device)


if __name__ == "__main__":
    # Run through the package's module so Skip and Finding are the classes irpe.plugins.gpu_steps imports.
    from irpe.plugins.gpu_check import main as package_main

    sys.exit(package_main())
