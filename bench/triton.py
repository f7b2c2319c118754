"""``irpe bench triton``: ``irpe serve`` against the real NVIDIA Triton (2.51), side by side, one run.

Both serve the same exported artifact on 127.0.0.1: ``irpe serve`` with the defaults a user gets (plus
``--server-arg``), Triton through :mod:`tritonserver` (its Python backend running the same ``model.onnx`` with
ONNX Runtime) configured fairly: as many instances as ``irpe serve`` has inference threads, as many ONNX
Runtime threads each, the exported ``max_batch_size`` and preferred batch sizes, and no batching delay (a lone
request runs at once). NVIDIA's ``perf_analyzer`` (batch 1, zero-filled binary tensors, one concurrency level
per call, three short time windows, the same arguments for every server of a cell: :mod:`.perf_analyzer`)
drives each server in turn; every round runs every (protocol, concurrency, server) once, the order of the
servers reversed between rounds, so load from elsewhere on the machine hits them alike.

Per cell: infer/s, p50 and p99 (client), the client-minus-server latency (perf_analyzer's average latency
minus the server's own average request latency from its statistics extension), images per execution
(inference count / execution count from those statistics) and the server's CPU-us per answered request (its
whole process tree: :mod:`.server_cpu`); a server whose metadata lists no statistics extension (``irpe serve
--workers N``, whose workers each count their own) gets perf_analyzer's client figures only. The ratio
irpe/Triton is the median over the rounds of the per-round ratio (the two measured seconds apart), next to the
medians of each figure.

Beside them, measured in the same rounds (``Options.floor``), two floors on the same Python stack as ``irpe
serve`` (uvicorn with httptools on uvloop, grpc.aio): "floor", a minimal KServe handler with no model
(:mod:`.empty_kserve`), and "floor+engine", the same handler running the artifact's engine per request at
batch 1 in a pool of one thread per usable core (:mod:`.engine_floor`): what any Python server on this stack
reaches with this engine on this machine. The bare engine (one thread, batch 1) is timed between the rounds.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from .floors import BareSession
from .perf_analyzer import (
    MISSED,
    BenchError,
    Measure,
    Target,
    lists_statistics,
    pa_args,
    perf_analyzer_command,
    run_pa,
)

SERVERS = ("triton", "irpe")
PROTOCOLS = ("http", "grpc")
MODELS = ("near-free", "tiny", "deit-tiny")


@dataclass
class Cell:
    """Every round's measure of one (protocol, concurrency), both servers."""

    protocol: str
    concurrency: int
    runs: dict[str, list[Measure]] = field(default_factory=lambda: {s: [] for s in SERVERS})

    def ratio_to(self, server: str, other: str) -> float:
        """``server``/``other`` throughput: the median of the per-round ratios."""
        ratios = [a.rps / b.rps for a, b in zip(self.runs[server], self.runs[other], strict=True)
                  if MISSED not in (a, b) and b.rps]
        return statistics.median(ratios) if ratios else float("nan")

    def median(self, server: str, attr: str) -> float:
        """The median over the rounds that measured something (nan when none did)."""
        values = [getattr(m, attr) for m in self.runs[server] if m is not MISSED]
        return statistics.median(values) if values else float("nan")

    def ratio(self) -> float:
        """irpe/Triton throughput: the median of the per-round ratios."""
        return self.ratio_to("irpe", "triton")

    def cpu_ratio(self) -> float:
        """irpe/Triton server CPU per request: the ratio of the medians."""
        return self.median("irpe", "cpu_us") / self.median("triton", "cpu_us")


def run_measured(command: list[str], t: Target, concurrency: int, interval_ms: int) -> Measure:
    """:func:`run_pa` with the server's CPU per answered request over the run (:mod:`.server_cpu`); a target
    without ``stats_url`` (no statistics that count the whole server) gets perf_analyzer's client figures only."""
    client_only = t.server.startswith("floor") or not t.stats_url
    if not t.pid or not t.stats_url:
        return run_pa(command, pa_args(t, concurrency, interval_ms), client_only=client_only)
    from .server_cpu import ServerCpu

    with ServerCpu(t.pid, t.stats_url, t.model) as meter:
        m = run_pa(command, pa_args(t, concurrency, interval_ms), client_only=client_only)
    return dataclasses.replace(m, cpu_us=meter.us_per_request())


def measure(targets: dict[tuple[str, str], Target], protocols: list[str], levels: list[int], rounds: int,
            interval_ms: int, command: list[str], between: Callable[[], None] | None = None) -> list[Cell]:
    """``rounds`` x (protocol, concurrency, every server in alternating order), the same perf_analyzer
    arguments for every server of a cell; ``between`` runs before each round."""
    servers = list(dict.fromkeys(s for s, _ in targets))
    cells = [Cell(p, c, {s: [] for s in servers}) for p in protocols for c in levels]
    for r in range(rounds):
        if between is not None:
            between()
        order = servers if r % 2 == 0 else servers[::-1]
        for cell in cells:
            for server in order:
                t = targets[(server, cell.protocol)]
                try:
                    m = run_measured(command, t, cell.concurrency, interval_ms)
                except BenchError as e:
                    print(f"irpe bench triton: {server} {cell.protocol} c={cell.concurrency} missed: "
                          f"{str(e).splitlines()[0]}", file=sys.stderr, flush=True)
                    m = MISSED
                cell.runs[server].append(m)
    return cells


FLOORS = {"floor": "floor", "floor+engine": "floor+eng"}  # the minimal servers' column titles


def format_cells(title: str, cells: list[Cell]) -> str:
    """One line per (protocol, concurrency): the medians of both servers and the ratio, then each floor's
    infer/s and CPU-us per request, the engine floor's throughput over Triton's and irpe's over the engine
    floor's (medians of the per-round ratios: whether a miss against Triton is the floor's), then the
    baseline's."""
    head = (f"{'proto':<5} {'conc':>4} {'Triton inf/s':>12} {'irpe inf/s':>10} {'irpe/Triton':>11} "
            f"{'p50 ms T/i':>12} {'p99 ms T/i':>12} {'outside ms T/i':>14} {'img/exec T/i':>12} "
            f"{'CPU us/req T/i':>15} {'CPU i/T':>7}")
    floors = [s for s in FLOORS if cells and s in cells[0].runs]
    for s in floors:
        head += f"  {FLOORS[s] + ' inf/s':>15} {FLOORS[s] + ' CPU us':>16}"
    engine_floor = "floor+engine" in floors
    if engine_floor:  # what a plain Python server with this engine reaches of Triton, and irpe of that server
        head += f"  {'f+e/Triton':>10} {'irpe/f+e':>8}"
    if cells and "base" in cells[0].runs:
        head += f"  {'base inf/s':>9} {'irpe/base':>9} {'base p50':>8}"
    lines = [title, head]
    for c in cells:
        def pair(attr: str, fmt: str = ".1f", c: Cell = c) -> str:
            return f"{c.median('triton', attr):{fmt}} / {c.median('irpe', attr):{fmt}}"

        base = (f"  {c.median('base', 'rps'):>9.0f} {c.ratio_to('irpe', 'base'):>9.2f} "
                f"{c.median('base', 'p50_ms'):>8.1f}" if "base" in c.runs else "")
        floor = "".join(f"  {c.median(s, 'rps'):>15.0f} {c.median(s, 'cpu_us'):>16.0f}" for s in floors)
        if engine_floor:
            floor += f"  {c.ratio_to('floor+engine', 'triton'):>10.2f} {c.ratio_to('irpe', 'floor+engine'):>8.2f}"
        lines.append(f"{c.protocol:<5} {c.concurrency:>4} {c.median('triton', 'rps'):>12.0f} "
                     f"{c.median('irpe', 'rps'):>10.0f} {c.ratio():>11.2f} {pair('p50_ms'):>12} "
                     f"{pair('p99_ms'):>12} {pair('outside_ms', '.2f'):>14} {pair('batch'):>12} "
                     f"{pair('cpu_us', '.0f'):>15} {c.cpu_ratio():>7.2f}{floor}{base}")
    return "\n".join(lines)


@contextmanager
def irpe_server(artifact: Path, server_args: tuple[str, ...], grpc: bool,
                pythonpath: str | None = None) -> Iterator[dict[str, str]]:
    """``irpe serve ARTIFACT`` with the defaults a user gets (access log on, into a temporary file), and
    ``--grpc-port`` when ``grpc``; ``pythonpath``: another import tree's irpe; yields the URL per protocol and
    the root process id ("pid")."""
    from .serve import _free_port, server_process

    port, grpc_port = _free_port(), _free_port()
    while grpc_port == port:
        grpc_port = _free_port()
    args = ["-m", "irpe.cli", "serve", str(artifact), "--port", str(port), *server_args]
    with tempfile.TemporaryFile() as log, \
            server_process([*args, "--grpc-port", str(grpc_port)] if grpc else args, port, stderr=log,
                           env={"PYTHONPATH": pythonpath} if pythonpath else None) as proc:
        yield {"http": f"127.0.0.1:{port}", **({"grpc": f"127.0.0.1:{grpc_port}"} if grpc else {}),
               "pid": str(proc.pid)}


@contextmanager
def triton_server(artifact: Path, instances: int, threads: int, max_batch: int) -> Iterator[dict[str, str]]:
    """The real tritonserver on the same artifact (no batching delay, the exported preferred batch sizes)."""
    from irpe.export.triton import preferred_batch_sizes

    from .tritonserver import TritonServer

    with TritonServer(artifact, model_name="irpe", max_batch=max_batch, max_delay_us=0, instances=instances,
                      threads=threads, preferred=tuple(preferred_batch_sizes(max_batch))) as s:
        yield {"http": s.http_url, "grpc": s.grpc_url, "pid": str(s.process.pid if s.process else 0)}


@dataclass
class Options:
    """What ``irpe bench triton`` was told."""

    models: list[str] = field(default_factory=lambda: list(MODELS))
    artifact: str | None = None
    protocols: list[str] = field(default_factory=lambda: ["http"])
    levels: list[int] = field(default_factory=lambda: [1, 8, 32])
    rounds: int = 3
    interval_ms: int = 500  # perf_analyzer's time window (3 per run; short: see bench/perf_analyzer.py)
    instances: int = 0  # Triton model instances (0: one per usable core, as irpe serve's inference threads)
    threads: int = 1  # ONNX Runtime threads per Triton instance
    max_batch: int = 32
    server_args: tuple[str, ...] = ()
    perf_analyzer: str | None = None
    baseline: str | None = None  # a git commit whose irpe serve runs beside as "base" (irpe/base printed)
    floor: bool = True  # minimal KServe handlers on the same stack measured beside: "floor" with no model
    # (bench/empty_kserve.py), "floor+engine" running the artifact's engine per request (bench/engine_floor.py)


def start_servers(stack: ExitStack, artifact: Path, opts: Options, base: str | None) -> dict[str, dict[str, str]]:
    """irpe, Triton, ``base`` (the import tree of another irpe) and the floors (``opts.floor``) on
    ``artifact``, each left running until ``stack`` closes; their URLs per protocol and root process id."""
    from irpe.server.config import usable_cpus

    grpc = "grpc" in opts.protocols
    urls = {"irpe": stack.enter_context(irpe_server(artifact, opts.server_args, grpc)),
            "triton": stack.enter_context(triton_server(artifact, opts.instances or usable_cpus(), opts.threads,
                                                        opts.max_batch))}
    if base:
        urls["base"] = stack.enter_context(irpe_server(artifact, opts.server_args, grpc, base))
    if opts.floor:
        from .empty_kserve import floor_server

        work = stack.enter_context(tempfile.TemporaryDirectory())
        urls["floor"] = stack.enter_context(floor_server(urls["irpe"]["http"], artifact, work))
        urls["floor+engine"] = stack.enter_context(floor_server(urls["irpe"]["http"], artifact, work, engine=True))
    missing = [f"{s} over {p}" for s in urls for p in opts.protocols if p not in urls[s]]
    if missing:
        raise BenchError(f"no {', '.join(missing)} here: choose --protocols from what both serve")
    return urls


def bench_artifact(artifact: Path, opts: Options, command: list[str], base: str | None = None) -> list[Cell]:
    """Every server on ``artifact`` (:func:`start_servers`), every cell measured ``opts.rounds`` times."""
    from irpe.artifact import load_artifact

    name = load_artifact(artifact).name
    with ExitStack() as stack:
        urls = start_servers(stack, artifact, opts, base)
        # whose /stats counts every request it answers: a floor's (its metadata lists no extension), and a server
        # that lists the statistics extension (not irpe serve --workers N)
        counted = {s: s.startswith("floor") or lists_statistics(urls[s]["http"]) for s in urls}
        targets = {(s, p): Target(s, p, urls[s][p], "irpe" if s == "triton" else name, int(urls[s]["pid"]),
                                  urls[s]["http"] if counted[s] else "") for s in urls for p in opts.protocols}
        bare = BareSession(artifact)
        cells = measure(targets, opts.protocols, opts.levels, opts.rounds, opts.interval_ms, command, bare.time)
        print(f"bare ONNX Runtime session, {bare.threads} intra-op threads (every core), batch 1, beside the "
              f"rounds: p50 {bare.p50_ms():.2f} ms; engine floor (one thread, batch 1): {bare.cpu_us():.0f} "
              "CPU-us per image", flush=True)
        return cells


def model_artifact(model: str, tmp: Path) -> Path:
    """Export ``near-free`` (the near-free model, 224 px), ``tiny`` (the same model at 32 px in 8 px patches:
    12 KB tensors, where the per-request cost shows) or ``deit-tiny`` (DeiT-Tiny iRPE-K, 224 px), random
    weights."""
    from .frontend import build_near_free
    from .serve import build_artifact

    out = tmp / model
    out.mkdir(parents=True)
    if model in ("near-free", "tiny"):
        return build_near_free(out, *((224, 32) if model == "near-free" else (32, 8)))
    return build_artifact(out)


def run_triton_bench(opts: Options) -> dict[str, list[Cell]]:
    """Entry point of ``irpe bench triton``: every model's table, printed as it completes."""
    command = perf_analyzer_command(opts.perf_analyzer)
    out: dict[str, list[Cell]] = {}
    with tempfile.TemporaryDirectory(prefix="irpe-bench-triton-") as tmp:
        base = None
        if opts.baseline:
            from .baseline import import_tree

            tree = import_tree(opts.baseline, Path(tmp) / "baseline")
            if tree is None:
                raise BenchError(f"--baseline {opts.baseline}: not a commit of this checkout (or no C compiler)")
            base = str(tree)
        for model in ([opts.artifact] if opts.artifact else opts.models):
            if opts.artifact:
                path = Path(opts.artifact)
            else:
                print(f"exporting {model} (random weights) ...", flush=True)
                path = model_artifact(model, Path(tmp))
            load = os.getloadavg()[0]
            out[model] = bench_artifact(path, opts, command, base)
            print(format_cells(f"{model}: {opts.rounds} interleaved rounds, perf_analyzer batch 1, load average "
                               f"{load:.1f} before / {os.getloadavg()[0]:.1f} after", out[model]), flush=True)
    return out
