"""procs.py's servers die with the test process that started them, also one killed before it could stop them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.reliability.procs import REPO

# A test process that starts a server from its main thread, prints the server's pid and dies by SIGKILL.
CRASHING = """
import os, signal, sys
from pathlib import Path
from tests.reliability.procs import start_server
server = start_server(Path(sys.argv[1]))
print(server.pid, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_a_server_dies_with_the_test_process_that_started_it(artifact: Path) -> None:
    crashed = subprocess.run([sys.executable, "-c", CRASHING, str(artifact)], cwd=REPO, capture_output=True,
                             text=True, timeout=120)
    assert crashed.returncode == -9, crashed.stderr[-2000:]
    pid = int(crashed.stdout.split()[0])
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    outlived = _alive(pid)
    if outlived:
        os.kill(pid, signal.SIGKILL)
    assert not outlived, f"irpe serve (pid {pid}) outlived the test process that started it"
