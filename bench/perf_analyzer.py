"""NVIDIA's ``perf_analyzer`` as ``irpe bench triton`` runs it: the command, one run's arguments, its report.

A run is three time windows of ``--measurement-interval`` ms accepted whatever their spread (``-s 1000``: this
machine is shared, the rounds and the medians do the smoothing). Short windows (500 ms by default), because
perf_analyzer 2.60 holds about 1.5x the request's tensor for every request it sends until its windows are
summarised, and summarising takes longer the more requests a window holds, so against a fast server a run
of long windows grows until its memory cap stops it. Measured here (2-core VM, HTTP, concurrency 32, the
minimal KServe server of :mod:`.empty_kserve`): 224 px tensors, 1500 ms windows: past 6 GB in 35 s without
finishing (in the full bench it met the 12 GB cap in every round); 500 ms windows: finished in 22 s, 5.2 GB
at the peak. 32 px tensors: 1500 ms windows 158-711 MB, 500 ms windows 112 MB. A run stopped without a
report is repeated with windows half as long. ``--request-count`` (a fixed number of requests) bounds the
memory exactly but is no way out in 2.60: its throughput is taken over whole seconds of polling (9,024
requests reported as 4,483/s where the average latency gives 5,281/s at concurrency 32), and runs of 6,000
and of 6,016 requests at concurrency 32 each waited once for ever. Against ``irpe serve`` and Triton on the
224 px model at HTTP concurrency 8 (5 interleaved rounds, machine at load 8-16), 500 and 1500 ms windows gave
irpe 2,548 and 2,554 server CPU-us per request, Triton 3,257 and 2,947, and irpe/Triton throughput medians of
1.30 and 1.04 from per-round ratios of 0.75-1.69 under both: at that load the rounds spread wider than the
window length moves them; a quiet machine is what tells the two apart.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REPO_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "perf-analyzer.sh"


class BenchError(RuntimeError):
    """perf_analyzer is missing or failed; the message names the fix."""


@dataclass(frozen=True)
class Measure:
    """One perf_analyzer run at one concurrency (latencies in ms)."""

    rps: float
    p50_ms: float
    p99_ms: float
    avg_ms: float
    server_ms: float
    inferences: int
    executions: int
    cpu_us: float = float("nan")  # the server's whole process tree, CPU-us per answered request

    @property
    def outside_ms(self) -> float:
        """Client-minus-server latency: what the front end and the wire add outside the server's own clock."""
        return self.avg_ms - self.server_ms

    @property
    def batch(self) -> float:
        """Images per model execution."""
        return self.inferences / self.executions if self.executions else float("nan")


MISSED = Measure(*(float("nan"),) * 5, 0, 0)  # a run that failed twice: shown as nan, the bench goes on

_FIELDS = {"rps": r"Throughput: ([\d.]+) infer/sec", "p50_ms": r"p50 latency: (\d+) usec",
           "p99_ms": r"p99 latency: (\d+) usec", "avg_ms": r"Avg latency: (\d+) usec",
           "server_ms": r"Avg request latency: (\d+) usec", "inferences": r"Inference count: (\d+)",
           "executions": r"Execution count: (\d+)"}


def parse_output(text: str, client_only: bool = False) -> Measure:
    """The figures of one perf_analyzer run from its report (the last value of each field).

    Args:
        text: perf_analyzer's standard output.
        client_only: a server without the statistics extension (its server figures nan and 0).

    Raises:
        BenchError: a field is missing (the report's tail is in the message).
    """
    values: dict[str, float] = {"server_ms": float("nan"), "inferences": 0, "executions": 0}
    for name, pattern in _FIELDS.items():
        found = re.findall(pattern, text)
        if not found and client_only and name in values:
            continue
        if not found:
            raise BenchError(f"perf_analyzer printed no {pattern.split(':')[0]!r}:\n{text[-2000:]}")
        v = float(found[-1])
        values[name] = v / 1e3 if name.endswith("_ms") else v
    return Measure(values["rps"], values["p50_ms"], values["p99_ms"], values["avg_ms"], values["server_ms"],
                   int(values["inferences"]), int(values["executions"]))


def perf_analyzer_command(given: str | None = None) -> list[str]:
    """``given`` (a command line), else ``$IRPE_PERF_ANALYZER``, else ``perf_analyzer`` on PATH, else the
    repository's ``scripts/perf-analyzer.sh`` (the PyPI wheel in a podman container).

    Raises:
        BenchError: none of them is here.
    """
    given = given or os.environ.get("IRPE_PERF_ANALYZER")
    if given:
        return shlex.split(given)
    if shutil.which("perf_analyzer"):
        return ["perf_analyzer"]
    if REPO_SCRIPT.is_file():
        return [str(REPO_SCRIPT)]
    raise BenchError("perf_analyzer not found: pip install perf-analyzer (glibc >= 2.38), or pass "
                     "--perf-analyzer 'CMD' (for example scripts/perf-analyzer.sh from an irpe-deploy checkout)")


@dataclass(frozen=True)
class Target:
    """Where one server answers one protocol."""

    server: str
    protocol: str
    url: str
    model: str
    pid: int = 0  # the server's root process (0: no CPU figure)
    stats_url: str = ""  # where its HTTP statistics extension answers


def lists_statistics(http_url: str, timeout_s: float = 10.0) -> bool:
    """Whether the server at ``http_url`` (host:port) lists Triton's statistics extension in its metadata
    (``GET /v2``). perf_analyzer reads server figures only from a server that lists it, and only such a server's
    statistics count every request it answered (``irpe serve --workers N`` lists none: each worker counts its own).

    Raises:
        OSError: the server did not answer.
    """
    with urllib.request.urlopen(f"http://{http_url}/v2", timeout=timeout_s) as r:
        return "statistics" in (json.loads(r.read()).get("extensions") or [])


def pa_args(t: Target, concurrency: int, interval_ms: int) -> list[str]:
    """perf_analyzer's arguments for one run: batch 1, zero-filled binary inputs, one concurrency level,
    three time windows of ``interval_ms`` accepted whatever their spread."""
    return ["-m", t.model, "-u", t.url, "-i", t.protocol, "-b", "1", "--input-data", "zero",
            "--concurrency-range", str(concurrency), "--measurement-mode", "time_windows",
            "--measurement-interval", str(interval_ms), "-s", "1000", "--max-trials", "3"]


def run_pa(command: list[str], args: list[str], timeout_s: float = 150.0, tries: int = 2,
           client_only: bool = False) -> Measure:
    """Run perf_analyzer and parse its report, ``tries`` runs at most. A run that stopped without a report
    (its memory cap: exit 137) is repeated with windows half as long (not under 100 ms), since a window's
    length is what its memory grows with; one that hung past ``timeout_s`` or printed no stable figures, with
    the same arguments.

    Raises:
        BenchError: every try failed (the last one's output is kept in a temporary file, named).
    """
    for attempt in range(tries):
        try:
            out = subprocess.run([*command, *args], capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired as e:
            out = subprocess.CompletedProcess(e.cmd, 124, _text(e.stdout), f"ran past {timeout_s:.0f} s")
        except FileNotFoundError as e:
            raise BenchError(f"{command[0]} not found: pass --perf-analyzer 'CMD'") from e
        if out.returncode == 0 and "Throughput:" in out.stdout:
            try:
                return parse_output(out.stdout, client_only)
            except BenchError:
                pass
        if attempt + 1 < tries and "--measurement-interval" in args and _stopped(out):
            i = args.index("--measurement-interval") + 1
            args = [*args[:i], str(max(100, int(args[i]) // 2)), *args[i + 1:]]
    text = f"{out.stdout}\n{out.stderr}"
    with tempfile.NamedTemporaryFile("w", prefix="irpe-bench-triton-pa-", suffix=".txt", delete=False) as f:
        f.write(text)
    raise BenchError(f"perf_analyzer failed ({out.returncode}) on {' '.join(args)} (its output: {f.name}):\n"
                     f"{text[-2000:]}")


def _stopped(out: subprocess.CompletedProcess) -> bool:
    """perf_analyzer was stopped mid-run (killed, or its report cut short), not: hung or found no figures."""
    return out.returncode != 124 and "Throughput:" not in out.stdout and "stable" not in out.stdout + out.stderr


def _text(data: bytes | str | None) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")
