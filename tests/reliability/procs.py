"""``irpe serve`` in a subprocess on 127.0.0.1: start, wait ready, read RSS, stop (always); a server started from
the test process's main thread dies with that process, also one that crashes before its fixtures stop it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.server.helpers import url_in_log

REPO = Path(__file__).resolve().parents[2]
# argv: the test process's pid, then the command to become: killed when that process's thread that started it
# ends (PR_SET_PDEATHSIG, kept across exec), and not started at all when the process is already gone
_LAUNCH = """
import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
if os.getppid() != int(sys.argv[1]):
    sys.exit("the test process that started this server is gone")
os.execvp(sys.argv[2], sys.argv[2:])
"""


@dataclass
class ServerProcess:
    """A running ``irpe serve``; ``log`` collects its stdout + stderr."""

    proc: subprocess.Popen
    url: str
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def rss_mb(self) -> float:
        """Resident set size (VmRSS) of the server process in MB."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise RuntimeError(f"no VmRSS for pid {self.pid}")

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, wait up to ``timeout``, then SIGKILL; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


def serve_command(artifact: Path, port: int, *flags: str, python: str | Path | None = None) -> list[str]:
    return [str(python or sys.executable), "-m", "irpe", "serve", str(artifact), "--host", "127.0.0.1",
            "--port", str(port), "--log-level", "warning", *flags]


def dies_with_this_thread(command: list[str]) -> list[str]:
    """``command`` behind a launcher that has it killed when the calling thread ends, when that is the main thread
    (it ends with the process); ``command`` unchanged from another thread, whose end would kill it too early."""
    if threading.current_thread() is not threading.main_thread():
        return command
    return [sys.executable, "-c", _LAUNCH, str(os.getpid()), *command]


def start_server(artifact: Path, *flags: str, timeout: float = 90.0, env: dict[str, str] | None = None,
                 python: str | Path | None = None) -> ServerProcess:
    """Start ``irpe serve`` (with ``python``, the test's own by default) from the repository root and wait until
    /readyz answers 200 (killed if it does not)."""
    log = Path(tempfile.mkstemp(prefix="irpe-serve-", suffix=".log")[1])
    with open(log, "wb") as out:
        proc = subprocess.Popen(dies_with_this_thread(serve_command(artifact, 0, *flags, python=python)), cwd=REPO,
                                stdout=out, stderr=subprocess.STDOUT, env=env or server_env())
    deadline = time.monotonic() + timeout
    try:
        url = url_in_log(proc, log, timeout)
    except TimeoutError:
        ServerProcess(proc, "", log).stop(5)
        raise
    server = ServerProcess(proc, url, log)
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"irpe serve exited with {proc.returncode}:\n{server.output()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(server.url + "/readyz", timeout=2).status_code == 200:
                return server
        time.sleep(0.1)
    server.stop(5)
    raise TimeoutError(f"irpe serve not ready within {timeout}s:\n{server.output()}")


def server_env(**extra: str) -> dict[str, str]:
    """The environment without IRPE_* settings (they would change the server under test)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("IRPE_")}
    env.update(extra)
    return env


@contextlib.contextmanager
def serving(artifact: Path, *flags: str, timeout: float = 90.0,
            env: dict[str, str] | None = None) -> Iterator[ServerProcess]:
    """``start_server`` as a context manager that always stops the process."""
    server = start_server(artifact, *flags, timeout=timeout, env=env)
    try:
        yield server
    finally:
        server.stop()
        server.log.unlink(missing_ok=True)
