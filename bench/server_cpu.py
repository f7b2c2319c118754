"""Server CPU per request over the window a load generator drove it: the whole process tree of a server (its
root and every descendant: irpe's front ends and engine host, Triton and its Python stubs), user + system time
from /proc, divided by the requests the server answered in that window.

A background thread samples, every ``period_s``, the tree's CPU seconds and the server's answered count (its
statistics extension, ``GET /v2/models/{name}/stats`` over HTTP, which irpe and Triton both serve). The window
runs from the last sample before the count first moved to the first sample after it last moved, so the load
generator's start-up (perf_analyzer's container start, its metadata calls) and the idle time after are left out
but for one period at each end.

    with ServerCpu(pid, "127.0.0.1:8000", "irpe") as meter:
        ...drive the server...
    meter.us_per_request()
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import urllib.request
from pathlib import Path

from .frontend import tree_pids

_TICK = os.sysconf("SC_CLK_TCK")


def tree_cpu_s(root: int) -> float:
    """User + system CPU seconds of ``root`` and its live descendants, plus what ``root`` reaped of its
    children (cutime + cstime); 0.0 when ``root`` is gone."""
    total = 0.0
    for pid in tree_pids(root):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += sum(int(fields[i]) for i in ((11, 12, 13, 14) if pid == root else (11, 12))) / _TICK
    return total


def answered(http_url: str, model: str, timeout_s: float = 5.0) -> int:
    """Successful inferences ``model`` has answered, from the server's statistics extension.

    Raises:
        OSError: the server did not answer the statistics call.
        ValueError: the answer had no ``inference_stats.success.count``.
    """
    with urllib.request.urlopen(f"http://{http_url}/v2/models/{model}/stats", timeout=timeout_s) as r:
        stats = json.loads(r.read())
    try:
        return sum(int(m["inference_stats"]["success"]["count"]) for m in stats["model_stats"])
    except (KeyError, TypeError) as e:
        raise ValueError(f"no inference_stats.success.count in {model}'s statistics: {str(stats)[:300]}") from e


class ServerCpu:
    """Sample a server's CPU and answered count while the ``with`` block runs (see the module docstring)."""

    def __init__(self, pid: int, http_url: str, model: str, period_s: float = 0.25):
        self.pid, self.http_url, self.model, self.period_s = pid, http_url, model, period_s
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="server-cpu", daemon=True)

    def _sample(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            count = answered(self.http_url, self.model)
            self.samples.append((tree_cpu_s(self.pid), count))

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self._sample()

    def __enter__(self) -> ServerCpu:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def window(self) -> tuple[float, int]:
        """(CPU seconds, requests answered) from the last sample before the count moved to the first after it
        last moved; (0.0, 0) when it never moved."""
        s = self.samples
        if len(s) < 2 or s[-1][1] == s[0][1]:
            return 0.0, 0
        first = max(i for i, (_, n) in enumerate(s) if n == s[0][1])
        last = min(i for i, (_, n) in enumerate(s) if n == s[-1][1])
        return s[last][0] - s[first][0], s[last][1] - s[first][1]

    def us_per_request(self) -> float:
        """Server CPU microseconds per answered request over the window (nan when nothing was answered)."""
        cpu, n = self.window()
        return 1e6 * cpu / n if n else float("nan")
