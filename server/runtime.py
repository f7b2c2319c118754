"""What every server process shares: logging, the startup announcement, the open-file limit, and the setup of a
child process of ``--frontends`` (no FastAPI or uvicorn here: the engine process uses this)."""

from __future__ import annotations

import logging
import os
import resource
import signal
import sys
import threading

from .config import Settings

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_logging(settings: Settings) -> None:
    """Log lines with time and logger name at the configured level."""
    logging.basicConfig(level=settings.log_level.upper(), format=LOG_FORMAT)


def raise_open_file_limit() -> int:
    """Raise this process's soft open-file limit (RLIMIT_NOFILE) to its hard limit, so connections, not a
    default of 1,024 descriptors, meet the connection caps first; child processes inherit it.

    Returns:
        The soft limit now in force.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as e:  # RLIM_INFINITY refused (macOS): keep the soft limit
            logging.getLogger("irpe.server").warning("could not raise the open-file limit from %d to %s: %s",
                                                     soft, hard, e)
    return soft


def announce(sock_name: tuple) -> None:
    """One stderr line with the bound address, whatever the log level (``--port 0`` picks a free port)."""
    print(f"irpe serve: listening on http://{sock_name[0]}:{sock_name[1]}", file=sys.stderr, flush=True)


def announce_grpc(host: str, port: int) -> None:
    """The same for the gRPC front end (``--grpc-port 0``: the port picked), as ``HOST:PORT`` for gRPC clients."""
    host = host.strip("[]")
    print(f"irpe serve: gRPC listening on {f'[{host}]' if ':' in host else host}:{port}", file=sys.stderr, flush=True)


def child_setup(name: str, settings: Settings) -> None:
    """In a child: its own session (a terminal's Ctrl-C or a group-wide SIGTERM reaches the supervisor
    only, which stops the front ends before the engine), die with the supervisor, name the OS threads
    (``top -H``, CPU accounting), log."""
    import ctypes

    os.setsid()
    try:
        libc = ctypes.CDLL(None)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        libc.prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)
        original = threading.Thread._bootstrap_inner  # type: ignore[attr-defined]

        def named(self: threading.Thread) -> None:
            libc.prctl(_PR_SET_NAME, ctypes.c_char_p(self.name.encode()[:15]), 0, 0, 0)
            original(self)

        threading.Thread._bootstrap_inner = named  # type: ignore[attr-defined]
    except (OSError, AttributeError):  # not Linux: no parent-death signal, no thread names
        pass
    configure_logging(settings)
