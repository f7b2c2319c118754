"""Shared fixtures (the reference data in tests/data) and the CI skip gate.

Skip gate: with ``IRPE_CI=1`` (set by scripts/test.sh and .ci/run) a test skipped for any reason that does not
match ``CI_ALLOWED_SKIPS`` fails the run, and the terminal summary lists every skip with its verdict. A skip
is how a missing dependency hides a broken claim, so CI accepts only what its machine cannot have.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
REFERENCE = REPO / "tests" / "data" / "reference"

# The one allow-list of skip reasons CI accepts: no NVIDIA GPU, no TensorRT. Add nothing else here; a test
# that needs a package, a binary or data must get it from scripts/test.sh / .ci/run instead of skipping.
CI_ALLOWED_SKIPS = (
    r"\bno (CUDA |NVIDIA )?GPU\b",
    r"\b(needs|requires) an? (CUDA |NVIDIA )?GPU\b",
    r"\bGPU (is )?not (available|visible|found)\b",
    r"\bno TensorRT\b",
    r"\bTensorRT (is )?not (installed|available|found)\b",
)
_ALLOWED = re.compile("|".join(CI_ALLOWED_SKIPS), re.IGNORECASE)
_SKIPS: list[tuple[str, str]] = []


def ci_gate_enabled() -> bool:
    return os.environ.get("IRPE_CI", "") not in ("", "0")


def skip_allowed(reason: str) -> bool:
    """True when CI accepts a skip with this reason (see ``CI_ALLOWED_SKIPS``)."""
    return bool(_ALLOWED.search(reason))


@pytest.fixture(scope="session")
def reference_dir() -> Path:
    """tests/data/reference: the authors' facts copied into the repository (PROVENANCE.md, SHA256SUMS)."""
    return REFERENCE


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        _SKIPS.append((report.nodeid, reason.removeprefix("Skipped: ")))


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:  # noqa: ARG001
    if not _SKIPS:
        return
    gate = "on" if ci_gate_enabled() else "off (set IRPE_CI=1)"
    terminalreporter.section(f"skip gate ({gate}): {len(_SKIPS)} skipped")
    for nodeid, reason in _SKIPS:
        verdict = "allowed" if skip_allowed(reason) else "NOT ALLOWED"
        terminalreporter.write_line(f"{verdict:11s} {nodeid}: {reason}")
    bad = sum(not skip_allowed(reason) for _, reason in _SKIPS)
    if bad and ci_gate_enabled():
        terminalreporter.write_line(f"skip gate: {bad} skip(s) not allowed in CI -> the run fails "
                                    "(install what the test needs in scripts/test.sh or .ci/run)", red=True)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    bad = [s for s in _SKIPS if not skip_allowed(s[1])]
    if ci_gate_enabled() and bad and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
