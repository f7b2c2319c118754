"""``irpe bench serve --frontend`` pieces: process-tree CPU accounting, multi-image requests, the table."""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import time

from irpe.benchmarks.frontend import Row, default_variants, format_rows, multipart_images, thread_cpu, tree_pids


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


def test_table_and_variants() -> None:
    names = [v.label for v in default_variants([1, 2], "/old", [1, 4])]
    assert names == ["baseline", "single", "single x4", "frontends=1", "frontends=2"]
    row = Row("single", 4, answered=100, seconds=2.0, statuses=collections.Counter({200: 100, 503: 3}),
              cpu=collections.Counter({"main-loop": 0.1, "irpe-decode": 0.3}))
    text = format_rows([row])
    assert "single" in text and " 50.0 " in text and "4.00" in text and "1.00" in text and " 3 " in text
