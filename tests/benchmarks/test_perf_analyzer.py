"""bench/perf_analyzer.py: how ``irpe bench triton`` runs NVIDIA's perf_analyzer: the command, one run's
arguments and request count, its report, a failed run's repeat (a stand-in command records the calls: the real
one fails only now and then)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from irpe.bench import perf_analyzer as pa

# perf_analyzer 2.60's report of one run against tritonserver (concurrency 8, this machine)
REPORT = """Request concurrency: 8
  Client:
    Request count: 2864
    Throughput: 250.731 infer/sec
    Avg latency: 30015 usec (standard deviation 14854 usec)
    p50 latency: 27986 usec
    p90 latency: 47742 usec
    p95 latency: 56197 usec
    p99 latency: 73803 usec
    Avg HTTP time: 29935 usec (send/recv 1471 usec + response wait 28464 usec)
  Server:
    Inference count: 2870
    Execution count: 1130
    Successful request count: 2870
    Avg request latency: 17639 usec (overhead 11 usec + queue 5948 usec + compute input 403 usec + compute infer \
11010 usec + compute output 266 usec)
Inferences/Second vs. Client Average Batch Latency
Concurrency: 8, throughput: 250.731 infer/sec, latency 30015 usec
"""


def test_report_figures_and_client_minus_server() -> None:
    m = pa.parse_output(REPORT)
    assert (m.rps, m.p50_ms, m.p99_ms, m.inferences, m.executions) == (250.731, 27.986, 73.803, 2870, 1130)
    assert m.outside_ms == pytest.approx(30.015 - 17.639)
    assert m.batch == pytest.approx(2870 / 1130)
    with pytest.raises(pa.BenchError, match="no 'Execution count'"):
        pa.parse_output(REPORT.replace("Execution count", "Runs"))
    client = pa.parse_output(REPORT.split("  Server:")[0], client_only=True)  # a server without statistics
    assert (client.rps, client.inferences, client.executions) == (250.731, 0, 0) and client.server_ms != 0.0


def test_perf_analyzer_command_order(monkeypatch: pytest.MonkeyPatch) -> None:
    assert pa.perf_analyzer_command("pa --x 'a b'") == ["pa", "--x", "a b"]
    monkeypatch.setenv("IRPE_PERF_ANALYZER", "/opt/pa/bin/perf_analyzer")
    assert pa.perf_analyzer_command() == ["/opt/pa/bin/perf_analyzer"]


def _stand_in(tmp_path: Path, first: str) -> tuple[list[str], Path]:
    """A command that records its arguments and prints ``first`` on its first call, the report after: it
    stands in for perf_analyzer's two failure modes, which the real one shows only now and then."""
    log = tmp_path / "calls.txt"
    script = tmp_path / "pa.py"
    script.write_text("import pathlib, sys\n"
                      f"log = pathlib.Path({str(log)!r})\n"
                      "calls = log.read_text().splitlines() if log.exists() else []\n"
                      "log.write_text('\\n'.join([*calls, ' '.join(sys.argv[1:])]) + '\\n')\n"
                      f"print({first!r} if not calls else {REPORT!r})\n")
    return [sys.executable, str(script)], log


@pytest.mark.parametrize(("first", "second_window"), [
    ("Request concurrency: 32\n", "1500"),  # stopped mid-run (its memory cap): windows half as long
    ("Failed to obtain stable measurement within 3 measurement windows for concurrency 32.", "3000")])
def test_a_failed_run_is_repeated_once_with_windows_that_fit_the_failure(tmp_path: Path, first: str,
                                                                       second_window: str) -> None:
    command, log = _stand_in(tmp_path, first)
    target = pa.Target("irpe", "http", "127.0.0.1:1", "m")
    m = pa.run_pa(command, pa.pa_args(target, 32, 3000))
    calls = log.read_text().splitlines()
    assert m.rps == 250.731 and len(calls) == 2
    assert calls[0].split("--measurement-interval ")[1].split()[0] == "3000"
    assert calls[1].split("--measurement-interval ")[1].split()[0] == second_window


def test_windows_are_halved_down_to_100_ms_and_every_try_failing_names_its_arguments(tmp_path: Path) -> None:
    script, log = tmp_path / "stopped.py", tmp_path / "calls.txt"
    script.write_text("import pathlib, sys\n"  # every call stops without a report, as a killed run does
                      f"log = pathlib.Path({str(log)!r})\n"
                      "log.write_text((log.read_text() if log.exists() else '') + ' '.join(sys.argv[1:]) + '\\n')\n"
                      "print('Request concurrency: 8')\n")
    args = pa.pa_args(pa.Target("irpe", "grpc", "127.0.0.1:1", "m"), 8, 300)
    with pytest.raises(pa.BenchError, match=r"failed \(0\) on -m m .*--measurement-interval 100 .*its output: ") as e:
        pa.run_pa([sys.executable, str(script)], args, tries=3)
    windows = [c.split("--measurement-interval ")[1].split()[0] for c in log.read_text().splitlines()]
    assert windows == ["300", "150", "100"]
    kept = Path(str(e.value).split("its output: ")[1].split(")")[0])
    assert "Request concurrency: 8" in kept.read_text()
    kept.unlink()


def test_a_run_is_three_short_time_windows_accepted_whatever_their_spread() -> None:
    args = pa.pa_args(pa.Target("floor", "grpc", "127.0.0.1:9", "m"), 32, 500)
    flags = dict(zip(args[::2], args[1::2], strict=True))
    assert flags["--measurement-mode"] == "time_windows" and flags["--measurement-interval"] == "500"
    assert (flags["-s"], flags["--max-trials"], flags["-b"], flags["-i"]) == ("1000", "3", "1", "grpc")
    assert flags["--concurrency-range"] == "32" and "--request-count" not in flags


def test_lists_statistics_reads_the_server_metadata() -> None:
    import http.server
    import json
    import threading

    answers = iter([["binary_tensor_data", "statistics"], ["binary_tensor_data"], None])

    class Metadata(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            assert self.path == "/v2"
            extensions = next(answers)
            body = json.dumps({"name": "s"} if extensions is None else {"name": "s", "extensions": extensions})
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Metadata)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"127.0.0.1:{server.server_address[1]}"
        assert [pa.lists_statistics(url) for _ in range(3)] == [True, False, False]
    finally:
        server.shutdown()
        server.server_close()
