"""The GPU check's runner: each step's line as it ends, OUTDIR's JSON and text after every step, the time budget.

tests/plugins/test_gpu_check_script.py runs the script itself with only a GPU machine's packages.
"""

import io
import json
import re
import subprocess
import sys
import time
from dataclasses import replace

import numpy as np
import pytest

from irpe.plugins import gpu_check, gpu_steps

TINY = replace(gpu_check.PROFILES["cpu"], name="test", budget_s=60.0)


def read_json(outdir):
    return json.loads((outdir / gpu_check.JSON_NAME).read_text(encoding="utf-8"))


def test_a_failing_step_is_reported_and_fails_the_run(monkeypatch, tmp_path):
    def fine(context):  # figures json cannot write as they are: NumPy numbers, a path
        return gpu_check.Finding("fine", {"x": 1, "diff": np.float32(0.5), "rates": np.array([1.5, 2.0]),
                                          "path": tmp_path})

    def boom(context):
        raise ValueError("mismatch 0.5")

    monkeypatch.setattr(gpu_check, "steps", lambda: [("ok", fine), ("bad", boom)])
    out = io.StringIO()
    assert gpu_check.run_all(tmp_path, TINY, out) == 1
    ok, bad = (line for line in out.getvalue().splitlines() if line[:4] in ("PASS", "FAIL"))
    assert ok.startswith("PASS ok (") and ok.endswith("fine")
    assert bad.startswith("FAIL bad (") and "ValueError: mismatch 0.5" in bad
    doc = read_json(tmp_path)
    assert [s["status"] for s in doc["steps"]] == ["PASS", "FAIL"] and doc["steps"][0]["figures"] == {
        "x": 1, "diff": 0.5, "rates": [1.5, 2.0], "path": str(tmp_path)}
    assert doc["exit_status"] == 1 and out.getvalue().splitlines()[-1] == "1 PASS, 1 FAIL, 0 SKIP; exit status 1"


def test_a_missing_dependency_skips_and_a_missing_module_of_ours_fails(tmp_path):
    def importing(name):
        def step(context):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

        return step

    context = gpu_check.StepContext(tmp_path, TINY, "cpu")
    skipped = gpu_check.run_step("s", importing("widgetlib.core"), context)
    assert skipped.status is gpu_check.Status.SKIP and skipped.detail == "needs widgetlib.core, which is not installed"
    failed = gpu_check.run_step("f", importing("irpe.nowhere"), context)
    assert failed.status is gpu_check.Status.FAIL and "No module named 'irpe.nowhere'" in failed.detail


def test_the_files_hold_every_finished_step_and_name_the_running_one(monkeypatch, tmp_path):
    seen = {}

    def second(context):
        seen["json"] = read_json(tmp_path)
        seen["text"] = (tmp_path / gpu_check.TEXT_NAME).read_text(encoding="utf-8")
        raise gpu_check.Skip("no widget here")

    monkeypatch.setattr(gpu_check, "steps", lambda: [("first", lambda context: gpu_check.Finding("done")),
                                                     ("second", second)])
    assert gpu_check.run_all(tmp_path, TINY, io.StringIO()) == 0
    assert seen["json"]["running"] == "second" and not seen["json"]["finished"]
    assert [s["name"] for s in seen["json"]["steps"]] == ["first"] and "PASS first (" in seen["text"]
    assert read_json(tmp_path)["steps"][1]["detail"] == "no widget here"


def test_steps_after_the_budget_is_spent_skip_with_the_reason(monkeypatch, tmp_path):
    def slow(context):
        time.sleep(0.3)
        return gpu_check.Finding("ran")

    monkeypatch.setattr(gpu_check, "steps", lambda: [("a", slow), ("b", slow)])
    out = io.StringIO()
    assert gpu_check.run_all(tmp_path, replace(TINY, budget_s=0.2), out) == 0
    assert [s["status"] for s in read_json(tmp_path)["steps"]] == ["PASS", "SKIP"]
    assert re.search(r"SKIP b \(0.0 s\): time budget spent \(0 s of 0 s; raise it with --budget\)", out.getvalue())


OVERRUN_CHILD = """
import io, sys, time
from dataclasses import replace
from pathlib import Path
from irpe.plugins import gpu_check
gpu_check.OVERRUN_S = 0.3
gpu_check.steps = lambda: [("hangs", lambda context: time.sleep(30))]
profile = replace(gpu_check.PROFILES["cpu"], name="test", budget_s=0.2)
sys.exit(gpu_check.run_all(Path(sys.argv[1]), profile, io.StringIO()))
"""


def test_a_step_still_running_after_the_budget_is_stopped_and_fails(tmp_path):
    """In a process of its own, as scripts/gpu-check.sh runs it: the overrun alarm is a SIGALRM, and in the test
    process, among the threads of every runtime the suite has loaded, a SIGALRM during a sleep crashed it once."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", OVERRUN_CHILD, str(tmp_path)], timeout=60)
    assert done.returncode == 1
    assert time.perf_counter() - start < 20
    (step,) = read_json(tmp_path)["steps"]
    assert step["status"] == "FAIL" and step["detail"].startswith("Overrun: still running 0 s after the time budget")


def test_a_model_mismatch_fails_with_the_bound(tmp_path):
    torch = pytest.importorskip("torch")
    context = gpu_check.StepContext(tmp_path, TINY, "cpu")
    model = gpu_steps._model(torch, context)
    x = np.zeros((1, 3, 32, 32), np.float32)
    with torch.no_grad():
        want = model(torch.from_numpy(x)).numpy() + 1.0
    with pytest.raises(AssertionError, match=r"float32: max\|PyTorch cpu - ONNX Runtime\| 1 exceeds"):
        gpu_steps._compare_dtype(torch, model, context, x, want, torch.float32)


def test_problem_covers_both_ends_of_the_bucket_range():
    lut, attn, index = gpu_steps.problem(2, 3, 49, 9)
    assert lut.shape == (2, 3, 49, 9) and attn.shape == (2, 3, 49, 49) and index.dtype == np.int32
    assert index.min() == 0 and index.max() == 8
