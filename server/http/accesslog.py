"""The access log line (logger ``irpe.access``, INFO), written for a fraction of what ``Logger.info`` costs.

The line is what :func:`~irpe.server.runtime.configure_logging`'s handler writes for the record
``access.info(ACCESS_FORMAT, *args)``, byte for byte: ``asctime levelname name: message`` on stderr. When logging
is set up exactly that way (one plain ``StreamHandler`` on the root with that format, nothing on the way from
``irpe.access`` to it), the line is formatted here (the date and time part once per second) and written to the
handler's stream under its lock, as ``StreamHandler.emit`` would; otherwise (another handler, a filter, a
formatter of the embedding application's, a record factory) the record goes through ``logging`` as before.
The level is ``logging``'s own check, so ``--log-level warning`` and Triton's ``/v2/logging`` silence the line.

On an event loop, the lines of one loop turn are written together at its end (one ``write`` and one flush for
them all, scheduled with ``call_soon`` by the turn's first line): a write per line was a system call that also
gave the GIL away on every request. Each line keeps the time it was formatted at; a record another logger writes
in the same turn can precede them. Off a loop (a thread, a script) a line is written at once; lines still held
when the interpreter exits are written then.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import sys
import threading
import time
from typing import Any

from ..runtime import LOG_FORMAT

access = logging.getLogger("irpe.access")
ACCESS_FORMAT = '%s "%s %s" %d %.1fms request_id=%s trace_id=%s'
_INFO = logging.INFO
_PREFIX = f" {logging.getLevelName(_INFO)} {access.name}: "
_DATE = "%Y-%m-%d %H:%M:%S"  # logging.Formatter.default_time_format
_NS_TIME = sys.version_info >= (3, 13)  # LogRecord's time from time.time_ns()
_stamp: list[tuple[int, Any, str]] = [(-1, None, "")]  # (second, converter, its date and time), renewed each second


def _msecs(ct: float) -> int:
    """The milliseconds ``LogRecord`` keeps for a record created at ``ct`` (Python before 3.13)."""
    return int((ct - int(ct)) * 1000)


def _msecs_ns(ct_ns: int) -> int:
    """The same from Python 3.13, which takes the record's time from ``time.time_ns()``."""
    return (ct_ns % 1_000_000_000) // 1_000_000


def format_line(ct: float, converter: Any, args: tuple[Any, ...], msecs: int | None = None) -> str:
    """The formatted record (no terminator) for a record created at ``ct`` (seconds since the epoch).

    Args:
        ct: the record's ``created``.
        converter: the formatter's ``converter`` (``time.localtime``).
        args: the arguments of :data:`ACCESS_FORMAT`.
        msecs: the record's ``msecs``; computed from ``ct`` as Python before 3.13 does when None.

    Returns:
        What ``logging.Formatter(LOG_FORMAT).format`` returns for that record.
    """
    second, entry = int(ct), _stamp[0]
    if entry[0] != second or entry[1] is not converter:
        entry = _stamp[0] = (second, converter, time.strftime(_DATE, converter(ct)))
    return f"{entry[2]},{_msecs(ct) if msecs is None else msecs:03d}{_PREFIX}{ACCESS_FORMAT % args}"


def plain_handler() -> logging.StreamHandler | None:  # type: ignore[type-arg]
    """The root's handler when logging is as ``configure_logging`` sets it up and the access record would reach
    that handler only, unfiltered and unchanged; else None (the record then goes through ``logging``)."""
    if access.disabled or access.filters or access.handlers or not access.propagate:
        return None
    root = logging.root
    parent = access.parent
    while parent is not root and parent is not None:
        if parent.handlers or not parent.propagate:
            return None
        parent = parent.parent
    if len(root.handlers) != 1 or logging.getLogRecordFactory() is not logging.LogRecord:
        return None
    handler = root.handlers[0]
    if (type(handler) is not logging.StreamHandler or handler.filters or handler.level > _INFO
            or handler.terminator != "\n" or not _plain_formatter(handler.formatter)):
        return None
    return handler


def _plain_formatter(formatter: logging.Formatter | None) -> bool:
    """Whether ``formatter`` is ``logging.Formatter(LOG_FORMAT)`` with its defaults (the converter aside)."""
    return (type(formatter) is logging.Formatter and formatter._fmt == LOG_FORMAT and formatter.datefmt is None
            and type(formatter._style) is logging.PercentStyle and formatter.default_time_format == _DATE
            and formatter.default_msec_format == "%s,%03d")


def log_access(*args: Any) -> None:
    """Log one access line: ``access.info(ACCESS_FORMAT, *args)``, the same bytes for less CPU (module docstring).

    Args:
        args: client address, method, path, status, milliseconds, request id, trace id.
    """
    if not access.isEnabledFor(_INFO):
        return
    handler = plain_handler()
    if handler is None:
        access.info(ACCESS_FORMAT, *args)
        return
    if _NS_TIME:
        ct_ns = time.time_ns()
        line = format_line(ct_ns / 1e9, handler.formatter.converter, args, _msecs_ns(ct_ns))  # type: ignore[union-attr]
    else:
        line = format_line(time.time(), handler.formatter.converter, args)  # type: ignore[union-attr]
    held = _held
    if held.loop is not None and held.loop.is_running():  # this thread's loop, in the turn that holds lines
        held.lines.append(line)
        return
    try:
        loop = asyncio.get_running_loop()  # a getpid system call on Python 3.11: once per turn, not per line
    except RuntimeError:
        _write(handler, line + "\n")
        return
    if held.lines:  # held on a loop that stopped before its turn ended: written now, before this one
        _write_held()
    held.loop, held.lines = loop, [line]
    loop.call_soon(_write_held, handler)


class _Held(threading.local):
    """The access lines of this thread's current loop turn, not yet written, and that loop (None: none held)."""

    loop: asyncio.AbstractEventLoop | None = None
    lines: list[str] = []  # noqa: RUF012 (replaced, never changed in place, while loop is None)


_held = _Held()


def _write_held(handler: logging.StreamHandler | None = None) -> None:  # type: ignore[type-arg]
    """Write this thread's held lines to ``handler`` (None: the root's, as at exit), in one write."""
    held = _held
    lines, held.loop, held.lines = held.lines, None, []
    if lines and (handler := handler or plain_handler()) is not None:
        _write(handler, "\n".join(lines) + "\n")


atexit.register(_write_held)


def _write(handler: logging.StreamHandler, text: str) -> None:  # type: ignore[type-arg]
    """Write ``text`` (whole lines) to the handler's stream under its lock and flush it, as ``emit`` does."""
    try:
        with handler.lock:  # type: ignore[union-attr]
            stream = handler.stream
            stream.write(text)
            if hasattr(stream, "flush"):
                stream.flush()
    except RecursionError:
        raise
    except Exception:
        handler.handleError(access.makeRecord(access.name, _INFO, "(access log)", 0, text.rstrip("\n"), None, None))
