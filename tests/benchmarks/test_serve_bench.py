"""``irpe bench serve`` machinery on the tiny handmade artifact (short run; the figures are not asserted)."""

from __future__ import annotations

from pathlib import Path

import pytest

from irpe.bench.loadgen import multipart_request, run_load
from irpe.bench.serve import bench_serve, format_report, sample_jpeg
from tests.server.helpers import make_artifact, running_server


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_artifact(tmp_path_factory.mktemp("bench"))


def test_loadgen_counts_statuses(artifact: Path) -> None:
    with running_server(artifact) as url:
        host, port = url.removeprefix("http://").split(":")
        ok = run_load(host, int(port), multipart_request("/classify", f"{host}:{port}", sample_jpeg(64)), 12, 3)
        bad = run_load(host, int(port), multipart_request("/classify", f"{host}:{port}", b"junk"), 4, 2)
    assert len(ok.latencies) == 12 and ok.errors == 0 and ok.rps > 0 and ok.percentile(99) >= ok.percentile(50)
    assert bad.statuses == {415: 4} and bad.errors == 4


def test_bench_serve_reports_every_figure(artifact: Path) -> None:
    rep = bench_serve(artifact, requests=16, concurrency=(1, 4), rounds=1, raw_seconds=0.2)
    assert set(rep.raw) == {8, 16} and min(rep.raw.values()) > 0
    assert set(rep.served) == {1, 4} and all(r.errors == 0 and len(r.latencies) == 16 for r in rep.served.values())
    assert rep.naive.errors == 0 and rep.naive.concurrency == 4
    text = format_report(rep)
    assert "served/raw" in text and "served/naive" in text and "naive" in text


@pytest.mark.parametrize(("argv", "message"), [
    (["serve", "--concurrency", "1,z"], "--concurrency must be a comma list of integers, got '1,z'"),
    (["latency", "--concurrency", "0"], "--concurrency needs positive integers"),
    (["serve", "--frontend", "--images-per-request", "1,four"], "--images-per-request must be a comma list"),
    (["export", "--batch", "1;8"], "--batch must be a comma list of integers, got '1;8'"),
])
def test_bad_lists_are_one_line_errors_naming_the_flag(argv: list[str], message: str, capsys) -> None:
    from irpe.cli import main

    assert main(["bench", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
