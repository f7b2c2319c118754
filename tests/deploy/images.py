"""The serving image for the container tests: which engine runs it (docker with a daemon, else podman with runc),
building a variant once (the engine caches its layers) and the figures each build records in
test-artifacts/container.json. The session fixtures in conftest.py build the CPU image once for every module."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TAG = "localhost/irpe-serve:cpu-test"
MODEL = "deit_micro_patch4_32_ctx_product_shared_k"  # the variant of the exported test artifact
FIGURES = REPO / "test-artifacts" / "container.json"


def find_engine() -> list[str] | None:
    """The first container engine that runs here: docker (with a daemon), else podman with runc.

    Returns:
        The command prefix (``["docker"]`` or ``["podman", "--runtime", "runc"]``), or None when neither runs.
    """
    for cmd in (["docker"], ["podman", "--runtime", "runc"]):
        if shutil.which(cmd[0]):
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                if subprocess.run([*cmd, "info"], capture_output=True, timeout=60).returncode == 0:
                    return cmd
    return None


def run(cmd: list[str], timeout: float = 120, check: bool = True, **kwargs: object) -> subprocess.CompletedProcess:
    """Run a command, capturing its text output.

    Args:
        cmd: the command and its arguments.
        timeout: seconds before it is killed.
        check: raise when it exits non-zero.
        kwargs: passed on to subprocess.run (input=...).

    Returns:
        The completed process.

    Raises:
        AssertionError: ``check`` and a non-zero exit, with the command and the tail of its output.
    """
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)
    if check and out.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} -> {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return out


def record(**figures: object) -> None:
    """Merge figures into test-artifacts/container.json."""
    FIGURES.parent.mkdir(exist_ok=True)
    old = json.loads(FIGURES.read_text()) if FIGURES.is_file() else {}
    FIGURES.write_text(json.dumps({**old, **figures}, indent=1))


def build(engine: list[str], variant: str, tag: str, *build_args: str) -> int:
    """Build a variant on the pinned python:3.11-slim, or the local stand-in when no registry answers; record the
    build time and image size (layers are cached by the engine, so rebuilds are quick).

    Args:
        engine: the command prefix from find_engine.
        variant: the Dockerfile's VARIANT (cpu, gpu).
        tag: the image's name.
        build_args: more NAME=VALUE build arguments.

    Returns:
        The image's size in bytes.
    """
    start = time.monotonic()
    base = run(["bash", str(REPO / "scripts" / "container-base.sh"), engine[0]], timeout=900).stdout.strip()
    base_s = time.monotonic() - start
    cmd = [*engine, "build", "--build-arg", f"VARIANT={variant}", "--build-arg", f"PYTHON_IMAGE={base}", "-t", tag]
    for arg in build_args:
        cmd += ["--build-arg", arg]
    if engine[0] == "podman":  # HEALTHCHECK is a Docker-format field; the host's CA bundle for pip
        cmd += ["--format", "docker", "--network", "host", "-v", "/etc/ssl/certs:/etc/ssl/certs:ro"]
    start = time.monotonic()
    run([*cmd, str(REPO)], timeout=1500)
    size = int(run([*engine, "image", "inspect", "--format", "{{.Size}}", tag]).stdout.strip())
    record(**{"engine": engine[0], "base_image": base, "base_s": round(base_s, 1),
              f"{variant}_build_s": round(time.monotonic() - start, 1), f"{variant}_image_mb": round(size / 1e6, 1)})
    return size
