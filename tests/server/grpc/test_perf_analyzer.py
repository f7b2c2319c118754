"""NVIDIA's perf_analyzer over gRPC (``-i grpc``) against ``irpe serve --grpc-port`` at concurrency 1, 8 and 32,
in one process and with ``--frontends 2``: every request answered (perf_analyzer fails on any error). The
figures are printed, not asserted (timing is a benchmark's job: ``irpe bench triton --protocols grpc``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from irpe.bench.triton import Target, pa_args, perf_analyzer_command, run_pa
from tests.benchmarks.test_triton_bench import _perf_analyzer_runs
from tests.reliability.procs import ServerProcess, server_env, start_server
from tests.server.grpc.test_servicer import grpc_address

KEY = "pa-key"
pytestmark = [pytest.mark.perf_analyzer,  # IRPE_TEST_WITHOUT=perf_analyzer opts out (tests/conftest.py)
              pytest.mark.skipif(not _perf_analyzer_runs(), reason="perf_analyzer (or its podman image) is not here")]


@pytest.fixture(scope="module", params=["0", "2"], ids=["one-process", "frontends-2"])
def server(request: pytest.FixtureRequest, tiny_artifact: Path) -> Iterator[ServerProcess]:
    proc = start_server(tiny_artifact, "--grpc-port", "0", "--frontends", request.param,
                        env=server_env(IRPE_API_KEY=KEY))
    try:
        yield proc
    finally:
        proc.stop()
        proc.log.unlink(missing_ok=True)


@pytest.mark.parametrize("concurrency", [1, 8, 32])
def test_perf_analyzer_grpc(server: ServerProcess, concurrency: int) -> None:
    target = Target("irpe", "grpc", grpc_address(server), "tiny-mean")
    args = [*pa_args(target, concurrency, 500), "-H", f"authorization: Bearer {KEY}"]
    m = run_pa(perf_analyzer_command(), args, timeout_s=240)
    print(f"grpc concurrency {concurrency}: {m.rps:.0f} infer/s, p50 {m.p50_ms:.2f} ms, p99 {m.p99_ms:.2f} ms, "
          f"server {m.server_ms:.2f} ms, {m.inferences} inferences in {m.executions} executions")
    assert m.rps > 0 and m.inferences > 0 and m.executions > 0 and m.p99_ms >= m.p50_ms > 0
