"""Shared fixtures (the reference data in tests/data) and the CI skip gate.

Skip gate: with ``IRPE_CI=1`` (set by scripts/test.sh and .ci/run) a test skipped for any reason that does not
match ``CI_ALLOWED_SKIPS`` fails the run, and the terminal summary lists every skip with its verdict. A skip
is how a missing dependency hides a broken claim, so CI accepts only what its machine cannot have.

Opting out on purpose: ``IRPE_TEST_WITHOUT=browser,container`` (names from ``OPT_OUT_GROUPS``; scripts/test.sh
then leaves out their set-up) makes the gate accept the skips of tests carrying those markers, and only theirs;
the summary lists each one as ``opted out``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
REFERENCE = REPO / "tests" / "data" / "reference"
# Ray reads it once, when it is first imported: "0" keeps the Ray tests' nodes on 127.0.0.1 whichever module
# imports Ray first (on Linux Ray otherwise turns 127.0.0.1 into the machine's outward address)
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

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
# What IRPE_TEST_WITHOUT may name: a marker each, carried by the tests that need that set-up step.
OPT_OUT_GROUPS = {
    "browser": "needs Debian's chromium (scripts/install-browser.sh)",
    "container": "builds and runs the serving image (docker, or podman + runc: scripts/container-setup.sh)",
    "perf_analyzer": "runs NVIDIA's perf_analyzer (on PATH, or its podman image: scripts/perf-analyzer.sh --image)",
    "balancer": "runs HAProxy in front of irpe serve hosts in network namespaces (root; scripts/install-haproxy.sh)",
}
_SKIPS: list[tuple[str, str, bool]] = []  # (nodeid, reason, opted out)


def ci_gate_enabled() -> bool:
    return os.environ.get("IRPE_CI", "") not in ("", "0")


def opted_out() -> set[str]:
    """The groups named in IRPE_TEST_WITHOUT (comma-separated)."""
    return {g.strip() for g in os.environ.get("IRPE_TEST_WITHOUT", "").split(",") if g.strip()}


def pytest_configure(config: pytest.Config) -> None:
    for group, what in OPT_OUT_GROUPS.items():
        config.addinivalue_line("markers", f"{group}: {what}; IRPE_TEST_WITHOUT={group} opts out")
    unknown = opted_out() - OPT_OUT_GROUPS.keys()
    if unknown:
        raise pytest.UsageError(f"IRPE_TEST_WITHOUT names {', '.join(sorted(unknown))}; "
                                f"it takes {', '.join(OPT_OUT_GROUPS)}")


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
        opted = any(group in report.keywords for group in opted_out() & OPT_OUT_GROUPS.keys())
        _SKIPS.append((report.nodeid, reason.removeprefix("Skipped: "), opted))


def _verdict(reason: str, opted: bool) -> str:
    if skip_allowed(reason):
        return "allowed"
    return "opted out" if opted else "NOT ALLOWED"


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:  # noqa: ARG001
    if not _SKIPS:
        return
    gate = "on" if ci_gate_enabled() else "off (set IRPE_CI=1)"
    terminalreporter.section(f"skip gate ({gate}): {len(_SKIPS)} skipped")
    for nodeid, reason, opted in _SKIPS:
        terminalreporter.write_line(f"{_verdict(reason, opted):11s} {nodeid}: {reason}")
    bad = sum(_verdict(reason, opted) == "NOT ALLOWED" for _, reason, opted in _SKIPS)
    if any(opted and not skip_allowed(reason) for _, reason, opted in _SKIPS):
        terminalreporter.write_line(f"skip gate: opted out on purpose: IRPE_TEST_WITHOUT="
                                    f"{os.environ.get('IRPE_TEST_WITHOUT', '')}", yellow=True)
    if bad and ci_gate_enabled():
        terminalreporter.write_line(f"skip gate: {bad} skip(s) not allowed in CI -> the run fails (scripts/test.sh "
                                    "sets up what the tests need; IRPE_TEST_WITHOUT opts out on purpose)", red=True)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    bad = [s for s in _SKIPS if _verdict(s[1], s[2]) == "NOT ALLOWED"]
    if ci_gate_enabled() and bad and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
