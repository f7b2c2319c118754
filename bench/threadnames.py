"""Run ``irpe`` with every Python thread's name given to the OS thread (``/proc/<pid>/task/<tid>/comm``).

Used by ``irpe bench serve --frontend`` to split a server's CPU time per thread; run as a script path
(``python .../threadnames.py serve ...``) so it also works with another checkout on PYTHONPATH.
"""

from __future__ import annotations

import ctypes
import runpy
import sys
import threading

_PR_SET_NAME = 15


def set_os_thread_name(name: str) -> None:
    """Name the calling OS thread (first 15 bytes; Linux only, silently ignored elsewhere)."""
    try:
        ctypes.CDLL(None).prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def install() -> None:
    """Name every thread started from now on after its ``threading`` name."""
    start = threading.Thread._bootstrap_inner  # type: ignore[attr-defined]

    def named(self: threading.Thread) -> None:
        set_os_thread_name(self.name)
        start(self)

    threading.Thread._bootstrap_inner = named  # type: ignore[attr-defined]


if __name__ == "__main__":
    sys.path.pop(0)  # this directory: its module names must not shadow anything
    install()
    set_os_thread_name("main-loop")
    sys.argv = ["irpe", *sys.argv[1:]]
    runpy.run_module("irpe.cli", run_name="__main__")
