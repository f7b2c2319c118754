"""The access log line written without ``Logger.info`` is the line ``logging`` writes, byte for byte: the
formatter's output for the same record, and, in a process logging as ``irpe serve`` does, the same stderr bytes
as ``access.info`` for the same request; other logging set-ups, filters and levels still get what ``logging``
gives them."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import time

import pytest

from irpe.server.http.accesslog import ACCESS_FORMAT, format_line, log_access, plain_handler
from irpe.server.runtime import LOG_FORMAT

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
REQUESTS = [  # client, method, path (as printable() leaves it), status, ms, request id, trace id
    ("127.0.0.1", "POST", "/v2/models/tiny/infer", 200, 1.25, "req-42", TRACE),
    ("::1", "GET", '/a\\"b\\x00\\u00e9', 404, 0.04999, "a" * 32, TRACE),
    ("-", "PATCH", "/" + "x" * 200 + "...(300 chars)", 503, 123456.789, "r:1/2+3=@", TRACE),
]
STAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ")


@pytest.mark.parametrize("converter", [time.localtime, time.gmtime])
def test_line_is_the_formatters_output_for_the_same_record(converter: object) -> None:
    formatter = logging.Formatter(LOG_FORMAT)
    formatter.converter = converter  # type: ignore[assignment]
    for i in range(40):  # records a few ms apart: the per-second date part is reused and renewed
        args = REQUESTS[i % len(REQUESTS)]
        record = logging.LogRecord("irpe.access", logging.INFO, __file__, 1, ACCESS_FORMAT, args, None)
        expected = formatter.format(record)
        assert format_line(record.created, converter, args, int(record.msecs)) == expected
        if sys.version_info < (3, 13):  # the milliseconds are taken from the time as LogRecord takes them
            assert format_line(record.created, converter, args) == expected
        time.sleep(0.03)


SERVER_LIKE = """
import logging, sys
from irpe.server.config import Settings
from irpe.server.runtime import configure_logging
from irpe.server.http.accesslog import ACCESS_FORMAT, access, log_access, plain_handler
configure_logging(Settings(log_level=sys.argv[1]))
print(plain_handler() is not None, flush=True)
for args in {requests!r}:
    log_access(*args)
    access.info(ACCESS_FORMAT, *args)
access.addFilter(lambda record: False)  # a filter on the logger: the direct line honours it
log_access(*{requests!r}[0])
"""


def run_server_like(level: str) -> tuple[str, list[str]]:
    code = SERVER_LIKE.format(requests=REQUESTS)
    done = subprocess.run([sys.executable, "-c", code, level], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip(), done.stderr.splitlines()


def test_a_process_logging_as_irpe_serve_writes_the_bytes_logging_writes() -> None:
    direct, lines = run_server_like("info")
    assert direct == "True"  # configure_logging's set-up takes the direct path
    assert len(lines) == 2 * len(REQUESTS)
    for mine, logged in zip(lines[::2], lines[1::2], strict=True):
        assert STAMP.match(mine) and STAMP.match(logged)
        assert mine[23:] == logged[23:]  # all but the time: same level, logger, message, escaping
        assert mine[:23] <= logged[:23]  # written first, same clock and format
    assert lines[0].endswith(' INFO irpe.access: 127.0.0.1 "POST /v2/models/tiny/infer" 200 1.2ms '
                             f"request_id=req-42 trace_id={TRACE}")


def test_log_level_warning_silences_the_line() -> None:
    direct, lines = run_server_like("warning")
    assert direct == "True" and lines == []


def test_another_logging_set_up_gets_the_record(caplog: pytest.LogCaptureFixture) -> None:
    assert plain_handler() is None  # pytest's capture handlers sit beside the root's
    with caplog.at_level(logging.INFO, logger="irpe.access"):
        log_access(*REQUESTS[1])
    (record,) = [r for r in caplog.records if r.name == "irpe.access"]
    assert record.msg == ACCESS_FORMAT and record.args == REQUESTS[1] and record.levelno == logging.INFO
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="irpe.access"):
        log_access(*REQUESTS[0])
    assert not [r for r in caplog.records if r.name == "irpe.access"]


ON_A_LOOP = """
import asyncio, logging, sys
from irpe.server.config import Settings
from irpe.server.runtime import configure_logging
from irpe.server.http.accesslog import ACCESS_FORMAT, access, log_access
configure_logging(Settings(log_level="info"))
requests = {requests!r}

async def main():
    for args in requests:
        log_access(*args)
    print("same turn", file=sys.stderr, flush=True)
    await asyncio.sleep(0)
    print("next turn", file=sys.stderr, flush=True)

asyncio.run(main())
for args in requests:
    access.info(ACCESS_FORMAT, *args)
stranded = asyncio.new_event_loop()  # a loop closed before the turn's end: its lines are written at exit
stranded.call_soon(log_access, *requests[0])
stranded.call_soon(stranded.stop)
stranded.run_forever()
stranded.close()
print("closed", file=sys.stderr, flush=True)
"""


def test_lines_of_one_loop_turn_are_written_at_its_end_with_the_bytes_logging_writes() -> None:
    code = ON_A_LOOP.format(requests=REQUESTS)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    n = len(REQUESTS)
    assert lines[0] == "same turn" and lines[n + 1] == "next turn"  # held to the turn's end, then written
    for mine, logged in zip(lines[1:n + 1], lines[n + 2:2 * n + 2], strict=True):
        assert STAMP.match(mine) and mine[23:] == logged[23:]
    assert lines[2 * n + 2] == "closed" and lines[2 * n + 3][23:] == lines[1][23:]  # written at exit
    assert len(lines) == 2 * n + 4
