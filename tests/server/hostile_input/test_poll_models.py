"""A real ``irpe serve --model-control poll`` on 127.0.0.1 with hostile models in the repository
(tests/artifact/hostile_graphs.py): a model whose config.json is not JSON, one ONNX Runtime refuses (a Gather
with one input) and one whose load raises an error no check foresaw (a scalar output: an IndexError in the
engine's shape check) each fail once, with one log line and the reason in the index, and are not tried again
every poll; the graphs whose rewrite once hung or raised (48 chained Add(x, x), 1,500 chained Reshapes) serve as
exported; a good model sorted after them loads."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import httpx
import pytest
from onnx import helper, load, save

from irpe.artifact import file_sha256
from tests.artifact.hostile_graphs import HOSTILE
from tests.reliability.procs import serving
from tests.server.helpers import handmade_artifact
from tests.server.hosting.test_local import _classify, _top, constant_artifact

POLL_S = 0.1
MODELS = {"bad_one_input_gather": "one_input_gather", "bad_add_chain": "add_chain",
          "bad_reshape_chain": "reshape_chain"}  # sorted before "good"
# model -> its reason in the index (a regex). The ONNX Runtime engine's shape check raises IndexError on a scalar
# output, which the load turns into the version's failure; an EngineError saying "re-export" passes as well.
REFUSED = {"bad_config": "config.json", "bad_one_input_gather": "ONNX Runtime cannot load it",
           "bad_scalar_output": "raised IndexError|re-export"}


def _scalar_output_artifact(directory: Path) -> Path:
    """images -> ReduceSum -> a scalar "logits" (declared with no dims), with its model.json."""
    handmade_artifact(directory, "scalar", [helper.make_node("ReduceSum", ["images"], ["logits"], keepdims=0)], {})
    model = load(str(directory / "model.onnx"))
    model.graph.output[0].type.tensor_type.shape.ClearField("dim")
    save(model, str(directory / "model.onnx"))
    meta = json.loads((directory / "model.json").read_text())
    meta["onnx_sha256"] = file_sha256(directory / "model.onnx")
    (directory / "model.json").write_text(json.dumps(meta))
    return directory


def _wait(check: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "the repository change was not picked up in time"
        time.sleep(0.2)


@pytest.mark.timeout(240)
def test_a_bad_model_fails_once_and_the_models_after_it_still_load(tmp_path: Path) -> None:
    repo, staging = tmp_path / "repo", tmp_path / "staging"
    constant_artifact(repo / "alpha" / "1", 1, "alpha")
    for name, graph in MODELS.items():
        handmade_artifact(staging / name / "1", name, *HOSTILE[graph]())
    _scalar_output_artifact(staging / "bad_scalar_output" / "1")
    constant_artifact(staging / "bad_config" / "1", 2, "bad_config")
    (staging / "bad_config" / "config.json").write_text("{ not json")
    constant_artifact(staging / "good" / "1", 7, "good")
    with serving(repo, "--model-control", "poll", "--poll-interval-s", str(POLL_S), "--default-model", "alpha",
                 "--backend", "onnxruntime") as server:
        for name in ["bad_config", *MODELS, "bad_scalar_output", "good"]:  # each appears whole; the bad ones first
            (staging / name).rename(repo / name)
        _wait(lambda: _classify(server.url, "?model=good").status_code == 200, timeout=120)
        assert _top(_classify(server.url, "?model=good").json()) == 7
        for name in ("bad_add_chain", "bad_reshape_chain"):  # served as exported
            _wait(lambda name=name: _classify(server.url, f"?model={name}").status_code == 200, timeout=60)
        time.sleep(30 * POLL_S)  # thirty more polls
        rows = {r["name"]: r for r in httpx.post(f"{server.url}/v2/repository/index", json={}, timeout=10).json()}
        log = server.output()
    for name, reason in REFUSED.items():
        assert rows[name]["state"] == "UNAVAILABLE" and re.search(reason, rows[name]["reason"]), rows[name]
        said = [line for line in log.splitlines() if name in line]
        assert len(said) == 1 and "not loaded" in said[0], said
    assert "Traceback" not in log and "polling the model repository failed" not in log, log[-3000:]
    assert all(rows[name]["state"] == "READY" for name in ("good", "bad_add_chain", "bad_reshape_chain")), rows


@pytest.mark.timeout(120)
def test_a_graph_whose_rewrite_once_hung_serves_as_the_startup_model(tmp_path: Path) -> None:
    """48 chained Add(x, x) under the lookup pattern as the one model ``irpe serve`` starts with: ready at
    once, answering, and stopped by SIGTERM."""
    artifact = handmade_artifact(tmp_path / "add_chain", "add_chain", *HOSTILE["add_chain"]())
    start = time.monotonic()
    with serving(artifact, "--backend", "onnxruntime", timeout=60) as server:
        ready_s = time.monotonic() - start
        assert _classify(server.url).status_code == 200
    # stopped by SIGTERM (uvicorn re-raises it after its graceful stop), not killed after the stop's timeout
    assert server.proc.returncode in (0, -15) and ready_s < 60, (server.proc.returncode, ready_s)
