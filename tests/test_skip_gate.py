"""The CI skip gate (tests/conftest.py): only no-GPU / no-TensorRT skips pass when IRPE_CI=1."""

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


def _run(tmp_path: Path, body: str, ci: str) -> subprocess.CompletedProcess:
    shutil.copy(REPO / "tests" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_sample.py").write_text(body)
    env = {**os.environ, "IRPE_CI": ci}
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
