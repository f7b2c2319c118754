"""Fixtures for the reliability tests: a handmade artifact, a real ``irpe serve`` process, an answer log."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.reliability.procs import ServerProcess, serving
from tests.reliability.record import RECORDS, summary_table, write_summary
from tests.server.helpers import make_artifact


@pytest.fixture(scope="session")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A torch-free ONNX model + model.json (32x32 input, 10 classes, resize 36)."""
    return make_artifact(tmp_path_factory.mktemp("reliability-artifact"))


@pytest.fixture(scope="session")
def server(artifact: Path) -> Iterator[ServerProcess]:
    """``irpe serve`` with the default limits (20 MB body, 40M pixels, queue 256), shared by the battery."""
    with serving(artifact, "--max-wait-ms", "2") as proc:
        yield proc


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print (and save under test-artifacts/) the inputs tried and the answers by status."""
    if not RECORDS:
        return
    terminalreporter.section("reliability: inputs tried and answers")
    for line in summary_table().splitlines():
        terminalreporter.write_line(line)
    terminalreporter.write_line(f"(saved to {write_summary()})")
