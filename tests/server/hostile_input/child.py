"""Client code run in a child interpreter, as this uid or another: never in a fork of the test process.

grpcio leaves its threads and fork handlers in a process that opened a channel or started a server, and a fork of
such a process can end it or the child with SIGSEGV (docs/testing.md). A child here is a new interpreter started
as this uid; it imports what it needs, then drops to the asked uid (which need not be able to read the repository
or the interpreter), and dies with the test process (``procs.dies_with_this_thread``). tritonclient.grpc is
imported in children only: its protobuf messages clash with the kserve package's, which tests/server/http imports
into the test process.
"""

from __future__ import annotations

import contextlib
import json
import pwd
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tests.reliability.procs import dies_with_this_thread

ROOT = Path(__file__).resolve().parents[3]

# The child: the function's module imported, and for another uid all of grpc and tritonclient.grpc too, before
# the uid changes (that uid may not read the repository or the interpreter, and a call imports lazily); the
# function's JSON-able result or its traceback on the last line of stdout.
RUNNER = """
import contextlib, importlib, json, os, pkgutil, sys, traceback
job = json.loads(sys.stdin.read())
try:
    import tritonclient.grpc
    if job["uid"] is not None:
        import encodings.idna, queue, grpc
        for package in (grpc, tritonclient.grpc):
            for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
                with contextlib.suppress(ImportError):  # an optional part of grpc: no call here needs it
                    importlib.import_module(module.name)
    fn = getattr(importlib.import_module(job["module"]), job["name"])
    if job["uid"] is not None:
        os.setgroups([])
        os.setgid(job["gid"])
        os.setuid(job["uid"])
    out = {"ok": fn(*job["args"])}
except BaseException:
    out = {"error": traceback.format_exc()}
sys.stdout.write("\\n" + json.dumps(out) + "\\n")
"""


def as_user(uid: int | None, fn: Callable[..., Any], *args: Any, timeout: float = 240) -> Any:
    """``fn(*args)`` in a child interpreter running as ``uid`` (None: this uid) and that user's group.

    Args:
        uid: the user the call runs as; None keeps this process's.
        fn: a module-level function of an importable module; its arguments and result are JSON-able.
        args: its arguments.
        timeout: seconds before the child is killed and the call fails.

    Returns:
        What ``fn`` returned, through JSON.

    Raises:
        AssertionError: the child raised (its traceback is the message) or printed no result.
    """
    job = {"module": fn.__module__, "name": fn.__qualname__, "args": list(args), "uid": uid,
           "gid": None if uid is None else pwd.getpwuid(uid).pw_gid}
    done = subprocess.run(dies_with_this_thread([sys.executable, "-c", RUNNER]), input=json.dumps(job),
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    lines = done.stdout.strip().splitlines()
    assert lines and done.returncode == 0, f"the child exited {done.returncode}: {done.stderr[-3000:]}"
    got = json.loads(lines[-1])
    assert "error" not in got, got.get("error")
    return got["ok"]


@contextlib.contextmanager
def holding(script: str, *args: str) -> Iterator[str]:
    """A child interpreter running ``script`` with ``args`` while the block runs; killed at its end (and with
    the test process).

    Args:
        script: Python source; it prints one line once it holds what it was asked to, then waits.
        args: its ``sys.argv[1:]``.

    Yields:
        The child's first line of stdout, read before the block starts.
    """
    proc = subprocess.Popen(dies_with_this_thread([sys.executable, "-c", script, *args]), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert proc.stdout is not None
        yield proc.stdout.readline()
    finally:
        proc.kill()
        proc.wait()
