"""``irpe bench serve --frontend`` pieces: process-tree CPU accounting, multi-image requests, the table."""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import time
from pathlib import Path

from irpe.bench.baseline import import_tree
from irpe.bench.floors import cpu_ms
from irpe.bench.frontend import (
    Row,
    Variant,
    bench_frontend,
    default_variants,
    format_rows,
    httpx_request,
    multipart_images,
    thread_cpu,
    tree_pids,
)


def test_tree_cpu_sees_a_busy_child() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time\nt=time.process_time()\n"
                              "while time.process_time()-t<0.3: pass\ntime.sleep(30)"])
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and sum(thread_cpu(child.pid).values()) < 0.25:
            time.sleep(0.05)
        assert child.pid in tree_pids(os.getpid())
        assert sum(thread_cpu(os.getpid()).values()) >= sum(thread_cpu(child.pid).values()) >= 0.25
    finally:
        child.kill()
        child.wait()


def test_multipart_with_several_images() -> None:
    req = multipart_images("/classify", "h", b"JPEGDATA", 3)
    head, body = req.split(b"\r\n\r\n", 1)
    assert body.count(b"JPEGDATA") == 3 and f"Content-Length: {len(body)}".encode() in head


def test_requests_are_sent_as_httpx_sends_them() -> None:
    """The bench's request is httpx's: its headers, a valid multipart body the server's parser splits into
    the images, and the head apart from the body pieces (each its own write)."""
    from irpe.server.http.body import split_files

    pieces = httpx_request("/classify?top_k=5", "127.0.0.1:9", b"JPEGDATA", 2)
    head, body = pieces[0], b"".join(pieces[1:])
    assert head.startswith(b"POST /classify?top_k=5 HTTP/1.1\r\nHost: 127.0.0.1:9\r\n") and head.endswith(b"\r\n\r\n")
    headers = dict(line.split(b": ", 1) for line in head.split(b"\r\n")[1:-2])
    assert headers[b"User-Agent"].startswith(b"python-httpx/") and int(headers[b"Content-Length"]) == len(body)
    assert len(pieces) > 3 and split_files(body, headers[b"Content-Type"].decode(), 4) == [b"JPEGDATA"] * 2


def test_table_and_variants() -> None:
    names = [v.label for v in default_variants([1, 2], "/old", [1, 4])]
    assert names == ["baseline", "single", "single no-log", "single x4", "frontends=1", "frontends=2", "http floor"]
    row = Row("single", 4, answered=100, seconds=2.0, statuses=collections.Counter({200: 100, 503: 3}),
              cpu=collections.Counter({"main-loop": 0.1, "irpe-decode": 0.3}))
    text = format_rows([row])
    assert "single" in text and " 50.0 " in text and "4.00" in text and "1.00" in text and " 3 " in text


def test_import_tree_runs_another_commit(tmp_path: Path) -> None:
    """The baseline is a commit laid out as the installed package, with its own compiled resize kernels."""
    tree = import_tree("HEAD", tmp_path / "b")
    assert tree is not None and (tree / "irpe" / "server" / "http" / "app.py").is_file()
    assert (tree / "irpe" / "cli.py").is_file()  # the top-level package is the checkout's cli/ folder
    out = subprocess.run([sys.executable, "-c", "import irpe.server.http.app as a, irpe.artifact.resample as r;"
                          "print(a.__file__, r.available())"], cwd=tmp_path, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(tree)}, check=True).stdout.split()
    assert out[0].startswith(str(tree)) and out[1] == "True"
    assert import_tree("no-such-ref-anywhere", tmp_path / "c") is None


def test_http_floor_is_served_and_measured(tmp_path: Path) -> None:
    floor = [v for v in default_variants([], None, []) if v.label == "http floor"]
    rows = bench_frontend(tmp_path, floor, requests=400, concurrency=4, rounds=2)
    assert rows[0].answered == 400 and rows[0].statuses[200] == 400 and rows[0].seconds > 0
    assert sum(rows[0].cpu.values()) < 40  # the server's CPU is accounted (ticks of 10 ms), and it is small


def test_cpu_ms_counts_this_threads_work() -> None:
    def spin() -> None:
        t = time.thread_time()
        while time.thread_time() - t < 0.002:
            pass

    assert 1.9 <= cpu_ms(spin, repeats=20) < 20
    assert cpu_ms(lambda: None, repeats=20) < 0.5
    assert Variant("x", []).command is None
