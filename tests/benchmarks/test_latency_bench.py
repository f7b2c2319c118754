"""``irpe bench latency`` machinery on the tiny handmade artifact (short run; the figures are not asserted)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from irpe.bench.latency import bench_latency, format_latency, v2_request
from irpe.bench.loadgen import run_load
from tests.server.helpers import make_artifact, running_server


def test_v2_request_is_a_valid_binary_infer(tmp_path: Path) -> None:
    art = make_artifact(tmp_path / "a")
    with running_server(art) as url:
        host, port = url.removeprefix("http://").split(":")
        x = np.ones((1, 3, 32, 32), np.float32)
        ok = run_load(host, int(port), v2_request("tiny-mean", f"{host}:{port}", x), 6, 2)
        bad = run_load(host, int(port), v2_request("nope", f"{host}:{port}", x), 2, 1)
    assert ok.statuses == {200: 6} and bad.statuses == {404: 2}


def test_bench_latency_reports_both_servers(tmp_path: Path) -> None:
    art = make_artifact(tmp_path / "a")
    rep = bench_latency(art, requests=8, concurrency=(1, 4), rounds=1, baseline_pythonpath="")
    assert len(rep.raw_ms) == 1 and rep.raw_ms[0] >= 0 and set(rep.servers) == {"this"}
    assert all(r.errors == 0 and len(r.latencies) == 8 for r in rep.servers["this"].values())
    assert "raw engine batch-1 p50" in format_latency(rep)
