"""bench/server_cpu.py: the process tree's CPU from /proc and the window the answered count moved in."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from irpe.bench.server_cpu import ServerCpu, tree_cpu_s


def test_tree_cpu_counts_a_busy_child() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time\nt = time.process_time()\n"
                              "while time.process_time() - t < 0.3: pass\ntime.sleep(30)"])
    try:
        before = tree_cpu_s(os.getpid())
        deadline = time.monotonic() + 20
        while tree_cpu_s(child.pid) < 0.25 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert tree_cpu_s(child.pid) >= 0.25  # the child's own spin (clock ticks: 10 ms)
        assert tree_cpu_s(os.getpid()) >= before + 0.2  # a live descendant counts in its parent's tree
    finally:
        child.kill()
        child.wait()
    assert tree_cpu_s(child.pid) == 0.0  # gone


def test_window_runs_from_the_last_still_sample_to_the_first_settled_one() -> None:
    meter = ServerCpu(0, "127.0.0.1:1", "m")
    meter.samples = [(1.0, 5), (1.1, 5), (1.2, 5), (2.2, 105), (3.2, 205), (3.3, 205), (3.4, 205)]
    cpu, n = meter.window()
    assert (round(cpu, 6), n) == (2.0, 200)  # 1.2 -> 3.2 s of CPU, 5 -> 205 answered
    assert meter.us_per_request() == 10_000
    meter.samples = [(1.0, 5), (2.0, 5)]
    assert meter.window() == (0.0, 0) and meter.us_per_request() != meter.us_per_request()  # nan: none answered
