"""scripts/perf-analyzer.sh passes perf_analyzer's exit code on: a failed run is a failed command."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "perf-analyzer.sh"
IMAGE = "localhost/irpe-perf-analyzer:2.60.0"  # the script's image (built by scripts/test.sh; minutes to build)


def _image_here() -> bool:
    if not shutil.which("podman"):
        return False
    found = subprocess.run(["podman", "--runtime", "runc", "image", "exists", IMAGE], capture_output=True)
    return found.returncode == 0


@pytest.mark.perf_analyzer
@pytest.mark.skipif(not _image_here(), reason=f"podman or the image {IMAGE} is not here")
def test_a_failed_perf_analyzer_run_exits_non_zero() -> None:
    with socket.socket() as closed:  # a free 127.0.0.1 port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    done = subprocess.run([str(SCRIPT), "-m", "digits", "-u", f"127.0.0.1:{port}"], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "IRPE_PA_TIMEOUT": "120"})
    assert done.returncode not in (0, 124), done.stderr
    assert "error: failed to get model metadata" in done.stderr + done.stdout, done.stderr
