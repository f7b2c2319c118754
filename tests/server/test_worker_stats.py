"""server/worker_stats.py: each process counts into its own row of a shared file and any process answers with
the sum of the rows, with the same answer a single process's ModelStats gives for the same calls."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from irpe.server import worker_stats
from irpe.server.stats import BatchPhases, ModelStats
from irpe.server.worker_stats import DIRECTORY_ENV, SharedStats, shared_directory, shared_stats

REPO = Path(__file__).resolve().parents[2]
SIZES = [1, 2, 4]
PHASES = BatchPhases(stack_s=0.001, infer_s=0.002, output_s=0.0005)

# one worker's traffic: two answered requests in a batch of 4, one refused (queue full), one that timed out
_WORKER = """
import sys
from pathlib import Path
from irpe.server.stats import BatchPhases
from irpe.server.worker_stats import SharedStats
stats = SharedStats(Path(sys.argv[1]), "m/1", [1, 2, 4])
size = int(sys.argv[2])
stats.batch(size=size, queue_s=[0.01] * (size // 2), requests=size // 2, phases=BatchPhases(0.001, 0.002, 0.0005))
for _ in range(size // 2):
    stats.request(True, 0.02)
stats.request(False, 0.0, "REJECTED")
"""


@pytest.fixture(autouse=True)
def _fresh_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """This test process claims its row anew in each test."""
    monkeypatch.setattr(worker_stats, "_rows", {})


def _feed(stats: ModelStats) -> None:
    stats.batch(size=4, queue_s=[0.01, 0.02], requests=2, phases=PHASES)
    stats.batch(size=1, queue_s=[0.03], requests=1, phases=PHASES)
    for _ in range(3):
        stats.request(True, 0.02)
    stats.request(False, 0.5, "CANCELED")


def _without_time(entry: dict) -> dict:
    return {k: v for k, v in entry.items() if k != "last_inference"}


def test_one_process_answers_as_model_stats_does(tmp_path: Path) -> None:
    local, shared = ModelStats(), SharedStats(tmp_path, "m/1", SIZES)
    _feed(local)
    _feed(shared)
    ours = shared.to_triton("m", "1", reasons=True)
    assert _without_time(ours) == _without_time(local.to_triton("m", "1", reasons=True))
    assert ours["last_inference"] >= local.to_triton("m")["last_inference"] > 0
    assert "fail_reasons" not in shared.to_triton("m")


def test_the_rows_of_two_processes_are_summed(tmp_path: Path) -> None:
    reader = SharedStats(tmp_path, "m/1", SIZES)  # mapped first and kept: the others open the file meanwhile
    for size in (4, 2):  # two worker processes, each its own row
        subprocess.run([sys.executable, "-c", _WORKER, str(tmp_path), str(size)], cwd=REPO, check=True, timeout=30)
    stats = reader.to_triton("m", "1", reasons=True)  # a third process's view
    infer = stats["inference_stats"]
    assert (stats["inference_count"], stats["execution_count"]) == (6, 2)
    assert infer["success"]["count"] == 3 and infer["queue"]["count"] == 3 and infer["fail"]["count"] == 2
    assert infer["success"]["ns"] == 3 * 20_000_000 and stats["fail_reasons"]["REJECTED"] == 2
    assert [(b["batch_size"], b["compute_infer"]["count"]) for b in stats["batch_stats"]] == [(2, 1), (4, 1)]
    assert (tmp_path / "rows").read_text().strip() == "3" and stats["fail_reasons"]["CANCELED"] == 0


def test_a_version_gets_its_own_file(tmp_path: Path) -> None:
    one, two = SharedStats(tmp_path, "m/1", SIZES), SharedStats(tmp_path, "m/2", SIZES)
    _feed(one)
    assert two.to_triton("m", "2")["inference_count"] == 0 and one.to_triton("m")["inference_count"] == 5
    assert len(list(tmp_path.glob("*.stats"))) == 2


def test_outside_workers_each_version_counts_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DIRECTORY_ENV, raising=False)
    assert shared_stats("m", 1, SIZES) is None


def test_a_file_of_other_batch_sizes_leaves_the_worker_counting_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv(DIRECTORY_ENV, str(tmp_path))
    assert isinstance(shared_stats("m", 1, [1, 2]), SharedStats)
    with caplog.at_level(logging.WARNING, logger="irpe.server"):
        assert shared_stats("m", 1, SIZES) is None
    assert "count this worker only" in caplog.text and "another batch size list" in caplog.text


def test_the_shared_directory_is_private_and_removed() -> None:
    with shared_directory() as path:
        assert path is not None and os.environ[DIRECTORY_ENV] == str(path)
        assert path.stat().st_mode & 0o777 == 0o700
        SharedStats(path, "m/1", SIZES)
        assert all(f.stat().st_mode & 0o777 == 0o600 for f in path.iterdir())
    assert not path.exists() and DIRECTORY_ENV not in os.environ


def test_without_a_writable_temporary_directory_workers_count_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(worker_stats.tempfile, "tempdir", str(tmp_path / "missing"))
    with caplog.at_level(logging.WARNING, logger="irpe.server"), shared_directory() as path:
        assert path is None and DIRECTORY_ENV not in os.environ
    assert "set TMPDIR" in caplog.text


def test_a_link_planted_in_place_of_a_version_file_is_not_followed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    target = tmp_path / "elsewhere"
    target.write_bytes(b"")  # empty: a followed link would be grown to the rows' size
    SharedStats(tmp_path, "m/1", SIZES)
    planted = next(tmp_path.glob("*.stats"))
    planted.unlink()
    planted.symlink_to(target)  # what another process of the user could plant before a worker opens the file
    monkeypatch.setenv(DIRECTORY_ENV, str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="irpe.server"):
        assert shared_stats("m", 1, SIZES) is None
    assert target.stat().st_size == 0 and "count this worker only" in caplog.text
