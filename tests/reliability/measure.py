"""Time and server memory of each issue-22 hostile request against a fresh ``irpe serve`` per scenario.

    PYTHONPATH=. .venv/bin/python -m tests.reliability.measure [SCENARIO ...]

Prints one row per scenario: answers, wall time, peak RSS growth (VmHWM after - VmRSS before), RSS kept
after, and whether /healthz still answers. ``IRPE_MEASURE_PYTHONPATH`` serves another checkout (before/after).
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from tests.reliability import hostile
from tests.reliability.procs import ServerProcess, start_server
from tests.server.helpers import make_artifact


def _status(proc: ServerProcess, key: str) -> float:
    for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def _post(url: str, **kw: object) -> str:
    try:
        r = httpx.post(url + "/classify", timeout=300, **kw)  # type: ignore[arg-type]
        return str(r.status_code)
    except httpx.HTTPError as e:
        return type(e).__name__


def header(url: str) -> str:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=120) as s:
        try:
            s.sendall(hostile.huge_header_request(host, int(port), 32 << 20))
        except OSError:  # answered and closed while we were sending
            pass
        try:
            return s.recv(200).split(b"\r\n")[0].decode() or "closed"
        except OSError as e:
            return type(e).__name__


def scans(url: str) -> str:
    return _post(url, content=hostile.scan_bomb(4096, 20_000), headers={"content-type": "image/jpeg"})


def one_bit(url: str) -> str:
    return _post(url, content=hostile.one_bit_png(), headers={"content-type": "image/png"})


def one_bit_x16(url: str) -> str:
    blob = hostile.one_bit_png()
    return _post(url, files=[("file", (f"{i}.png", blob, "image/png")) for i in range(16)])


def png16(url: str) -> str:
    return _post(url, content=hostile.sixteen_bit_png(), headers={"content-type": "image/png"})


def tiff32(url: str) -> str:
    return _post(url, content=hostile.int32_tiff(), headers={"content-type": "image/tiff"})


def strips(url: str) -> str:
    answers = {_post(url, content=b, headers={"content-type": "image/png"}) for b in hostile.tall_strips(32)}
    return "/".join(sorted(answers))


def tiffs(url: str) -> str:
    out: dict[str, int] = {}
    for _, blob in hostile.tiff_odd_tags():
        code = _post(url, content=blob, headers={"content-type": "image/tiff"})
        out[code] = out.get(code, 0) + 1
    return " ".join(f"{k}x{v}" for k, v in sorted(out.items()))


def many(url: str) -> str:
    blob = hostile.flat_png_rows(64, 64)
    return _post(url, files=[("file", (f"{i}.png", blob, "image/png")) for i in range(256)])


def slow_header(url: str) -> str:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        try:
            data = s.recv(200)
        except TimeoutError:
            return "open after 30s"
        return data.split(b"\r\n")[0].decode() or "closed"


def connections(url: str) -> str:
    host, port = url.removeprefix("http://").split(":")
    socks = [socket.create_connection((host, int(port)), timeout=5) for _ in range(300)]
    time.sleep(1)
    refused = 0
    for s in socks:
        s.setblocking(False)
        try:
            refused += s.recv(100).startswith(b"HTTP/1.1 503")
        except BlockingIOError:
            pass
        s.close()
    return f"{300 - refused} kept, {refused} refused"


SCENARIOS: dict[str, Callable[[str], str]] = {
    "H2 32 MB header": header, "H3 JPEG 20k scans": scans, "H4 1-bit 40 Mpx PNG": one_bit,
    "H4 16 x 1-bit 40 Mpx": one_bit_x16, "H4 16-bit 40 Mpx PNG": png16, "H4 int32 40 Mpx TIFF": tiff32,
    "H5 32 tall strips": strips, "M2 odd TIFFs": tiffs, "M3 slow header": slow_header,
    "M3 300 idle connections": connections, "M4 256 images": many}


def measure(artifact: Path, name: str) -> str:
    extra = os.environ.get("IRPE_MEASURE_PYTHONPATH")
    env = {k: v for k, v in os.environ.items() if not k.startswith("IRPE_")}
    if extra:
        env["PYTHONPATH"] = extra
    proc = start_server(artifact, "--decode-threads", "8", env=env)
    try:
        before = _status(proc, "VmRSS")
        start = time.perf_counter()
        answer = SCENARIOS[name](proc.url)
        took = time.perf_counter() - start
        peak, kept = _status(proc, "VmHWM") - before, _status(proc, "VmRSS") - before
        t0 = time.perf_counter()
        alive = httpx.get(proc.url + "/healthz", timeout=30).status_code
        return (f"| {name} | {answer} | {took:.2f} s | +{peak:.0f} MB | +{kept:.0f} MB | {alive} "
                f"({(time.perf_counter() - t0) * 1e3:.0f} ms) |")
    finally:
        proc.stop()


def main(names: list[str]) -> None:
    artifact = make_artifact(Path(tempfile.mkdtemp(prefix="irpe-measure-")))
    print("| scenario | answer | time | peak RSS | RSS kept | /healthz after |\n|---|---|---|---|---|---|")
    for name in names or list(SCENARIOS):
        print(measure(artifact, name), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
