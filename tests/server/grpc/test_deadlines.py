"""server/grpc/deadlines.py and the call gate's unary path, in a child interpreter.

The cases (``deadlines_cases.py``) start real grpc.aio servers behind the real CallGate. grpc.aio leaves its
threads and fork handlers in the process that started a server, and a fork of that process can crash it (the
tests fork nothing themselves: ``hostile_input/child.py``); run apart, the cases leave nothing behind.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
CASES = Path(__file__).with_name("deadlines_cases.py")


def test_the_deadline_cases_pass_in_a_child_interpreter() -> None:
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(CASES)],
                         capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "4 passed" in out.stdout, out.stdout[-2000:]
