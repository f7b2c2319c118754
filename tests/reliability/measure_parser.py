"""Server CPU per request for the HTTP protocol choices, measured side by side in one run.

    PYTHONPATH=. .venv/bin/python -m tests.reliability.measure_parser [ROUNDS [VARIANT ...]]

Variants: uvicorn's httptools protocol (no header limit), the bounded subclass irpe serves with, and h11
with its 64 KB ``h11_max_incomplete_event_size``. Each serves the same app in its own process; the client
sends keep-alive GET /healthz and POST /classify (a 64x48 PNG); CPU = utime + stime of the server process.
Rounds alternate the variants so drift on a shared machine hits all of them alike; medians are printed.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from tests.server.helpers import encode, free_port, image, make_artifact

SERVER = """
import sys, uvicorn
from irpe.server.http.app import create_app
from irpe.server.config import Settings
from irpe.server.http.protocol import protocol_factory
settings = Settings(artifact_dir=sys.argv[1], port=int(sys.argv[2]), max_wait_ms=0, log_level="warning")
http = {"httptools": "httptools", "bounded": protocol_factory(settings), "h11": "h11"}[sys.argv[3].split("-")[0]]
uvicorn.run(create_app(settings), host="127.0.0.1", port=settings.port, log_level="warning", http=http,
            h11_max_incomplete_event_size=64 * 1024)
"""
VARIANTS = ("httptools", "bounded", "h11")


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _one(artifact: Path, variant: str, n_get: int, n_post: int) -> tuple[float, float]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(artifact), str(port), variant])
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        png = encode(image())
        with httpx.Client(base_url=url, timeout=30) as c:
            for _ in range(50):
                c.get("/healthz")
            start = _cpu_s(proc.pid)
            for _ in range(n_get):
                c.get("/healthz")
            mid = _cpu_s(proc.pid)
            for _ in range(n_post):
                c.post("/classify", content=png, headers={"content-type": "image/png"})
            end = _cpu_s(proc.pid)
        return (mid - start) / n_get * 1e3, (end - mid) / n_post * 1e3
    finally:
        proc.terminate()
        proc.wait(10)


def main(rounds: int = 3, variants: tuple[str, ...] = VARIANTS) -> None:
    artifact = make_artifact(Path(tempfile.mkdtemp(prefix="irpe-parser-")))
    got: dict[str, list[tuple[float, float]]] = {v: [] for v in variants}
    for r in range(rounds):
        for v in variants[r % len(variants):] + variants[:r % len(variants)]:  # rotate the order
            got[v].append(_one(artifact, v, 2000, 300))
    print("| protocol | server CPU per GET /healthz | per POST /classify | ratio to httptools (POST) |")
    print("|---|---|---|---|")
    base = statistics.median(p for _, p in got["httptools"])
    for v in variants:
        g, p = statistics.median(x for x, _ in got[v]), statistics.median(x for _, x in got[v])
        print(f"| {v} | {g:.3f} ms | {p:.3f} ms | {p / base:.2f} |")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3, tuple(sys.argv[2:]) or VARIANTS)
