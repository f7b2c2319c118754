"""``irpe bench repository``: one server, one model vs two models under load, measured side by side.

The repository holds the same artifact twice (``a/1`` and ``b/1``). Interleaved over rounds, on one
``irpe serve REPO`` process: (1) all clients on model ``a``; (2) the clients split between ``a`` and ``b``
at once (total req/s, and each model's share); (3) a quiet client on ``b`` alone, then next to ``a``
flooded by every other client (how much a busy neighbour delays a quiet model: fair inference slots).
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from irpe.bench.loadgen import LoadResult, multipart_request, run_load_async
from irpe.bench.serve import _free_port, _merge, sample_jpeg, server_process


@dataclass
class RepoBench:
    """Pooled results per scenario."""

    concurrency: int
    runs: dict[str, list[LoadResult]] = field(default_factory=dict)

    def add(self, name: str, result: LoadResult) -> None:
        self.runs.setdefault(name, []).append(result)

    def merged(self, name: str) -> LoadResult:
        return _merge(self.runs[name])


def _payload(port: int, model: str, image: bytes) -> bytes:
    return multipart_request(f"/classify?model={model}", f"127.0.0.1:{port}", image)


async def _round(port: int, image: bytes, requests: int, conc: int, bench: RepoBench) -> None:
    a, b = _payload(port, "a", image), _payload(port, "b", image)
    await run_load_async("127.0.0.1", port, a, conc, conc)  # warm connections
    bench.add("one model", await run_load_async("127.0.0.1", port, a, requests, conc))
    half = max(1, conc // 2)
    ra, rb = await asyncio.gather(run_load_async("127.0.0.1", port, a, requests // 2, half),
                                  run_load_async("127.0.0.1", port, b, requests // 2, half))
    bench.add("two models: a", ra)
    bench.add("two models: b", rb)
    quiet = max(8, requests // 16)
    bench.add("quiet b alone", await run_load_async("127.0.0.1", port, b, quiet, 1))
    flood = asyncio.ensure_future(run_load_async("127.0.0.1", port, a, requests, max(1, conc - 1)))
    await asyncio.sleep(0.2)
    bench.add("quiet b, a flooded", await run_load_async("127.0.0.1", port, b, quiet, 1))
    bench.add("flooding a", await flood)


def bench_repository(artifact_dir: Path, requests: int = 400, concurrency: int = 16, rounds: int = 3,
                     server_args: tuple[str, ...] = ()) -> RepoBench:
    """Run the three scenarios ``rounds`` times, interleaved, against one server."""
    image = sample_jpeg(256)
    bench = RepoBench(concurrency)
    with tempfile.TemporaryDirectory(prefix="irpe-bench-repo-") as tmp:
        for name in ("a", "b"):
            shutil.copytree(artifact_dir, Path(tmp) / name / "1")
        port = _free_port()
        with server_process(["-m", "irpe.cli", "serve", tmp, "--port", str(port), "--log-level", "warning",
                             "--default-model", "a", *server_args], port):
            for _ in range(rounds):
                asyncio.run(_round(port, image, requests, concurrency, bench))
    return bench


def format_repo_report(bench: RepoBench) -> str:
    """The table and the ratios ``irpe bench repository`` prints."""
    lines = [f"{'scenario':<22} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7}"]
    for name in bench.runs:
        r = bench.merged(name)
        lines.append(f"{name:<22} {r.rps:>8.1f} {r.percentile(50) * 1e3:>8.1f} {r.percentile(99) * 1e3:>8.1f} "
                     f"{r.errors:>7}")
    one = bench.merged("one model").rps
    ta, tb = bench.merged("two models: a"), bench.merged("two models: b")
    alone, crowded = bench.merged("quiet b alone"), bench.merged("quiet b, a flooded")
    lines.append(f"two models / one model (total req/s, concurrency {bench.concurrency}): "
                 f"{(ta.rps + tb.rps) / one:.2f}; share b/a: {tb.rps / ta.rps:.2f} (1.00 = even)")
    flood = bench.merged("flooding a")
    lines.append(f"quiet model p50 next to a flooded one: / the flooding model's p50 "
                 f"{crowded.percentile(50) / flood.percentile(50):.2f} (<= 1: not starved), / alone "
                 f"{crowded.percentile(50) / alone.percentile(50):.2f}")
    return "\n".join(lines)


def run_repo_bench(artifact: str, requests: int, concurrency: int, server_args: tuple[str, ...] = ()) -> RepoBench:
    """Entry point of ``irpe bench repository``."""
    from irpe.artifact.builtin import resolve_artifact_dir

    bench = bench_repository(resolve_artifact_dir(artifact), requests, concurrency, server_args=server_args)
    print(format_repo_report(bench))
    return bench
