"""A lean closed-loop HTTP/1.1 load generator (asyncio streams, keep-alive, one connection per client).

It costs far less CPU per request than a full client library, which matters when the server under test
and the load share two cores.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from dataclasses import dataclass, field


@dataclass
class LoadResult:
    """Throughput and latency of one load run."""

    requests: int
    concurrency: int
    seconds: float
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    statuses: dict[int, int] = field(default_factory=dict)
    server_cpu_s: float = 0.0

    @property
    def cpu_ms_per_request(self) -> float:
        """Server CPU time (all threads) per answered request."""
        return 1e3 * self.server_cpu_s / len(self.latencies) if self.latencies else float("nan")

    @property
    def rps(self) -> float:
        """Answered (200) requests per second."""
        return len(self.latencies) / self.seconds if self.seconds else 0.0

    def percentile(self, q: float) -> float:
        """Latency percentile of the answered requests (seconds)."""
        if not self.latencies:
            return float("nan")
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def multipart_request(path: str, host: str, data: bytes, filename: str = "image.jpg",
                      content_type: str = "image/jpeg") -> bytes:
    """A complete HTTP/1.1 POST with one multipart ``file`` field."""
    boundary = uuid.uuid4().hex
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{filename}\"\r\n"
            f"Content-Type: {content_type}\r\n\r\n").encode() + data + f"\r\n--{boundary}--\r\n".encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: multipart/form-data; boundary={boundary}"
            f"\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    return head + body


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes, bool]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return status, body, headers.get("connection", "").lower() == "close"


def _write(writer: asyncio.StreamWriter, payload: bytes | list[bytes]) -> None:
    """The request in one write, or (a list) one write per piece, as a client library sends it."""
    if isinstance(payload, bytes):
        writer.write(payload)
        return
    for piece in payload:  # each goes out at once (asyncio sets TCP_NODELAY): one segment per write
        writer.write(piece)


async def _client(host: str, port: int, payload: bytes | list[bytes], todo: list[int], result: LoadResult) -> None:
    conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
    while todo:
        todo.pop()
        start = time.perf_counter()
        try:
            if conn is None:
                conn = await asyncio.open_connection(host, port)
            _write(conn[1], payload)
            status, _, close = await _read_response(conn[0])
        except (OSError, asyncio.IncompleteReadError, ValueError):
            result.errors += 1
            conn = None
            continue
        result.statuses[status] = result.statuses.get(status, 0) + 1
        if status == 200:
            result.latencies.append(time.perf_counter() - start)
        else:
            result.errors += 1
        if close:
            conn[1].close()
            conn = None
    if conn is not None:
        conn[1].close()


async def run_load_async(host: str, port: int, payload: bytes | list[bytes], requests: int,
                         concurrency: int) -> LoadResult:
    """Async form of :func:`run_load`."""
    todo = list(range(requests))
    result = LoadResult(requests, concurrency, 0.0)
    start = time.perf_counter()
    await asyncio.gather(*(_client(host, port, payload, todo, result) for _ in range(concurrency)))
    result.seconds = time.perf_counter() - start
    return result


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads), from /proc (0.0 where unavailable)."""
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_load(host: str, port: int, payload: bytes | list[bytes], requests: int, concurrency: int,
             server_pid: int | None = None) -> LoadResult:
    """Send ``requests`` copies of ``payload`` (bytes, or the pieces written one by one) from ``concurrency``
    closed-loop clients."""
    before = process_cpu_seconds(server_pid) if server_pid else 0.0
    result = asyncio.run(run_load_async(host, port, payload, requests, concurrency))
    if server_pid:
        result.server_cpu_s = process_cpu_seconds(server_pid) - before
    return result
