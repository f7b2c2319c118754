"""``irpe bench triton``: its options, how it reads perf_analyzer's report, and one short real run (the real
tritonserver and ``irpe serve`` under NVIDIA's perf_analyzer; timing itself is a benchmark, not a test)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from irpe.bench import triton as tb
from irpe.bench.perf_analyzer import REPO_SCRIPT
from irpe.cli import build_parser, main
from irpe.commands.bench import triton_options
from tests.server.helpers import make_artifact


def _options(*argv: str) -> tb.Options:
    return triton_options(build_parser().parse_args(["bench", "triton", *argv]))


def test_defaults_are_both_models_http_three_levels_and_a_fair_triton() -> None:
    o = _options()
    assert (o.models, o.protocols, o.levels, o.rounds, o.interval_ms) == (["near-free", "deit-tiny"], ["http"],
                                                                       [1, 8, 32], 3, 500)
    assert (o.instances, o.threads, o.max_batch, o.artifact) == (0, 1, 32, None)
    o = _options("--protocols", "HTTP,grpc", "--concurrency", "2,4", "--server-arg=--max-batch=8",
                 "--server-arg=--log-level=warning", "--artifact", "/a", "--triton-instances", "3")
    assert (o.protocols, o.levels, o.artifact, o.instances) == (["http", "grpc"], [2, 4], "/a", 3)
    assert o.server_args == ("--max-batch=8", "--log-level=warning")


@pytest.mark.parametrize("argv, message", [
    (["--models", "resnet"], "unknown resnet: --models from near-free, tiny, deit-tiny"),
    (["--protocols", "http,quic"], "unknown quic"),
    (["--concurrency", "0,8"], "--concurrency needs positive integers"),
    (["--concurrency", "a"], "--concurrency must be a comma list of integers"),
    (["--models", ","], "--models (or --artifact) a name"),
    (["--rounds", "0"], "--rounds, --triton-threads, --triton-max-batch must be >= 1"),
    (["--triton-instances", "-1"], "--triton-instances >= 0"),
    (["--interval-ms", "50"], "--interval-ms >= 100"),
])
def test_bad_options_exit_2_naming_the_flag(argv: list[str], message: str, capsys) -> None:
    assert main(["bench", "triton", *argv]) == 2
    assert message in capsys.readouterr().err


def test_ratio_is_the_median_of_per_round_ratios_and_the_table_shows_it() -> None:
    def m(rps: float, cpu_us: float) -> tb.Measure:
        return tb.Measure(rps, 1.0, 2.0, 1.5, 1.0, 10, 5, cpu_us)

    cell = tb.Cell("http", 8, {"triton": [m(100, 400), m(200, 410), m(1000, 900)],
                               "irpe": [m(90, 500), m(300, 520), m(500, 300)]})
    assert cell.ratio() == pytest.approx(0.9)  # per round 0.9, 1.5, 0.5 (medians alone would give 1.5)
    assert cell.cpu_ratio() == pytest.approx(500 / 410)  # CPU: the ratio of the medians
    line = tb.format_cells("t", [cell]).splitlines()[-1].split()
    assert line[:5] == ["http", "8", "200", "300", "0.90"]
    assert line[-7:] == ["2.0", "/", "2.0", "410", "/", "500", "1.22"]


def _perf_analyzer_runs() -> bool:
    if shutil.which("perf_analyzer"):
        return True
    if not shutil.which("podman") or not REPO_SCRIPT.is_file():
        return False
    image = subprocess.run(["podman", "--runtime", "runc", "image", "exists",
                            "localhost/irpe-perf-analyzer:2.60.0"], capture_output=True)
    return image.returncode == 0


@pytest.mark.perf_analyzer
@pytest.mark.skipif(not _perf_analyzer_runs(), reason="perf_analyzer (or its podman image) is not here")
def test_one_short_real_run_measures_both_servers(tmp_path: Path, capsys) -> None:
    pytest.importorskip("tritonclient.http", reason="tritonclient is in the dev extra")
    artifact = make_artifact(tmp_path / "a")
    opts = tb.Options(artifact=str(artifact), levels=[2], rounds=1, interval_ms=300, instances=2,
                   server_args=("--log-level", "warning"))
    (cell,) = tb.run_triton_bench(opts)[str(artifact)]
    for server in ("triton", "irpe"):
        (m,) = cell.runs[server]
        assert m.rps > 0 and m.inferences > 0 and 1.0 <= m.batch <= 2.0 and m.p99_ms >= m.p50_ms > 0
        # the whole server tree's CPU per answered request: a tiny model's request costs some tens of us at
        # least and, on 2 loaded cores, well under 50 ms (the idle periods at the window's ends included)
        assert 20 < m.cpu_us < 50_000, (server, m.cpu_us)
    # the minimal KServe handler on irpe's stack, without a model and running the engine: no times in their
    # statistics (perf_analyzer's server figures left out), their answered counts read by the CPU meter
    for name in ("floor", "floor+engine"):
        (floor,) = cell.runs[name]
        assert floor.rps > 0 and 5 < floor.cpu_us < 50_000 and floor.inferences == 0, (name, floor)
    out = capsys.readouterr().out
    assert "irpe/Triton" in out and "CPU us/req T/i" in out and "engine floor" in out and "floor CPU us" in out
    assert "floor+eng inf/s" in out and "floor+eng CPU us" in out



def test_bare_session_times_every_core_at_batch_one(tmp_path: Path) -> None:
    from irpe.server.config import usable_cpus

    bare = tb.BareSession(make_artifact(tmp_path / "a"), runs=3)
    assert bare.p50_ms() != bare.p50_ms() and bare.cpu_us() != bare.cpu_us()  # nan before any round
    bare.time()
    bare.time()
    assert len(bare.times) == 6 and bare.p50_ms() > 0 and bare.threads == usable_cpus()
    assert len(bare.cpu) == 6 and 0 < bare.cpu_us() < 1e6


def test_a_missed_run_is_left_out_of_medians_and_ratios() -> None:
    def m(rps: float) -> tb.Measure:
        return tb.Measure(rps, 1.0, 2.0, 1.5, 1.0, 10, 5)

    cell = tb.Cell("http", 8, {"triton": [m(100), tb.MISSED, m(300)], "irpe": [m(50), m(400), m(600)]})
    assert cell.median("triton", "rps") == 200 and cell.median("irpe", "rps") == 400
    assert cell.ratio() == pytest.approx(1.25)  # rounds 1 and 3 only: 0.5 and 2.0
    assert "nan" in tb.format_cells("t", [tb.Cell("http", 1, {"triton": [tb.MISSED], "irpe": [m(1)]})])


def test_both_floors_print_their_infer_rate_and_cpu_beside_the_servers() -> None:
    def m(rps: float, cpu_us: float) -> tb.Measure:
        return tb.Measure(rps, 1.0, 2.0, 1.5, 1.0, 10, 5, cpu_us)

    cell = tb.Cell("grpc", 32, {"triton": [m(100, 400)], "irpe": [m(90, 500)], "floor": [m(3000, 120)],
                                "floor+engine": [m(1500, 350)]})
    head, line = tb.format_cells("t", [cell]).splitlines()[1:]
    assert "floor inf/s" in head and head.index("floor inf/s") < head.index("floor+eng inf/s")
    assert head.endswith("floor+eng CPU us  f+e/Triton irpe/f+e")
    assert line.split()[-6:] == ["3000", "120", "1500", "350", "15.00", "0.06"]


def test_the_engine_floor_ratios_are_medians_of_the_per_round_ratios() -> None:
    def m(rps: float) -> tb.Measure:
        return tb.Measure(rps, 1.0, 2.0, 1.5, 1.0, 10, 5, 300.0)

    cell = tb.Cell("http", 8, {"triton": [m(100), m(200), m(400)], "irpe": [m(90), m(100), m(500)],
                               "floor+engine": [m(100), m(100), m(400)]})
    # per round floor+engine/Triton 1.0, 0.5, 1.0 and irpe/floor+engine 0.9, 1.0, 1.25
    assert tb.format_cells("t", [cell]).splitlines()[-1].split()[-2:] == ["1.00", "1.00"]
    assert "f+e/Triton" not in tb.format_cells("t", [tb.Cell("http", 8, {"triton": [m(1)], "irpe": [m(1)]})])


def test_a_server_without_whole_server_statistics_is_measured_from_the_client(tmp_path: Path) -> None:
    """No ``stats_url`` (``irpe serve --workers N``: each worker counts its own): perf_analyzer's report has no
    server section, and no CPU per request is made up from one worker's count."""
    import os
    import sys

    from tests.benchmarks.test_perf_analyzer import REPORT

    script = tmp_path / "pa.py"
    script.write_text(f"print({REPORT.split('  Server:')[0]!r})\n")
    target = tb.Target("irpe", "http", "127.0.0.1:1", "m", pid=os.getpid(), stats_url="")
    m = tb.run_measured([sys.executable, str(script)], target, 8, 300)
    assert m.rps == 250.731 and (m.inferences, m.executions) == (0, 0)
    assert m.cpu_us != m.cpu_us  # nan: not measured
