"""The CI skip gate (tests/conftest.py): only no-GPU / no-TensorRT skips pass when IRPE_CI=1, and the skips of
the groups opted out on purpose with IRPE_TEST_WITHOUT."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, skip_allowed

SAMPLE = '''
import pytest

def test_runs():
    assert True

def test_gpu():
    pytest.skip("no CUDA GPU visible")

@pytest.mark.skipif(True, reason="TensorRT is not installed (use nvcr.io/nvidia/tensorrt)")
def test_trt():
    pass
'''


def _run(tmp_path: Path, body: str, ci: str, without: str = "") -> subprocess.CompletedProcess:
    shutil.copy(REPO / "tests" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_sample.py").write_text(body)
    env = {**os.environ, "IRPE_CI": ci, "IRPE_TEST_WITHOUT": without}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir",
                           str(tmp_path), str(tmp_path)], capture_output=True, text=True, env=env, timeout=120,
                          cwd=tmp_path)


@pytest.mark.parametrize("reason", ["no CUDA GPU visible", "no GPU on this machine", "TensorRT is not installed",
                                    "needs an NVIDIA GPU", "no TensorRT here"])
def test_hardware_reasons_are_allowed(reason):
    assert skip_allowed(reason)


@pytest.mark.parametrize("reason", ["reference data not found at ../shared", "no chromium at /usr/bin/chromium",
                                    "exact resize kernels not built", "torch is not installed",
                                    "irpe.export.export_artifact is not available yet", "TensorRT is installed here"])
def test_other_reasons_are_not(reason):
    assert not skip_allowed(reason)


def test_gpu_and_tensorrt_skips_pass_the_gate(tmp_path):
    out = _run(tmp_path, SAMPLE, ci="1")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "skip gate (on): 2 skipped" in out.stdout and "NOT ALLOWED" not in out.stdout


def test_any_other_skip_fails_the_run_and_is_named(tmp_path):
    body = SAMPLE + '\ndef test_browser():\n    pytest.skip("no chromium at /usr/bin/chromium")\n'
    out = _run(tmp_path, body, ci="1")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "NOT ALLOWED test_sample.py::test_browser: no chromium at /usr/bin/chromium" in out.stdout
    assert "1 skip(s) not allowed in CI" in out.stdout
    relaxed = _run(tmp_path, body, ci="0")
    assert relaxed.returncode == 0 and "skip gate (off" in relaxed.stdout


OPTED = SAMPLE + '''
@pytest.mark.browser
def test_page():
    pytest.skip("no chromium at /usr/bin/chromium")

@pytest.mark.container
def test_image():
    pytest.skip("no container engine")
'''


def test_opting_out_accepts_the_skips_of_those_groups_and_names_them(tmp_path):
    out = _run(tmp_path, OPTED, ci="1", without="browser,container")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "opted out   test_sample.py::test_page: no chromium" in out.stdout
    assert "opted out   test_sample.py::test_image: no container engine" in out.stdout
    assert "opted out on purpose: IRPE_TEST_WITHOUT=browser,container" in out.stdout


def test_opting_out_of_one_group_leaves_the_other_gated(tmp_path):
    out = _run(tmp_path, OPTED, ci="1", without="browser")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "opted out   test_sample.py::test_page" in out.stdout
    assert "NOT ALLOWED test_sample.py::test_image: no container engine" in out.stdout
    assert "1 skip(s) not allowed in CI" in out.stdout


def test_opting_out_covers_only_tests_with_the_marker(tmp_path):
    body = OPTED + '\ndef test_unmarked():\n    pytest.skip("no chromium at /usr/bin/chromium")\n'
    out = _run(tmp_path, body, ci="1", without="browser,container")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "NOT ALLOWED test_sample.py::test_unmarked" in out.stdout


def test_an_unknown_opt_out_name_is_a_usage_error(tmp_path):
    out = _run(tmp_path, SAMPLE, ci="1", without="browsers")
    assert out.returncode == pytest.ExitCode.USAGE_ERROR, out.stdout + out.stderr
    assert "IRPE_TEST_WITHOUT names browsers; it takes browser, container" in out.stdout + out.stderr
