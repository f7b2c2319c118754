"""Hostile graphs against the load-time rewrites (artifact/ort_graph.py, artifact/openvino_graph.py): 48 chained
Add(x, x) under the lookup pattern (2**48 paths back to the Gather), a Gather with one input and 1,500 chained
Reshapes. Each rewrite returns within seconds with the graph as exported (or refuses cleanly), and the engine
serves the model as exported or refuses it with an EngineError; a rewrite over its time budget falls back to the
file as exported with one warning line."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from irpe.artifact import load_artifact
from irpe.artifact.graph_limits import Budget, RewriteRefused
from irpe.artifact.ort_graph import DOMAIN, library, prepare, rewrite
from irpe.server.engines import EngineError, load_engine
from tests.artifact.hostile_graphs import HOSTILE, add_chain, lookup_graph, model_bytes, plain
from tests.server.helpers import handmade_artifact

FAST_S = 5.0  # every rewrite here: well under a second once bounded; the hostile ones never ended before
needs_ops = pytest.mark.skipif(library() is None, reason="the _ortops C extension is not built (no C compiler)")
IMAGES = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)


def _timed(call: object, *args: object) -> tuple[object, float]:
    start = time.monotonic()
    out = call(*args)  # type: ignore[operator]
    return out, time.monotonic() - start


def _custom_ops(data: bytes) -> list[str]:
    return [n.op_type for n in onnx.load_from_string(data).graph.node if n.domain == DOMAIN]


@needs_ops
def test_the_exported_form_is_still_rewritten() -> None:
    """The builders' plain lookup is the pattern (one LookupAdd), and two Add(x, x) links (four terms) are
    still one LookupAdd4 with ONNX Runtime's answer: the limits leave exported graphs alone."""
    for middle, op in ((plain, "LookupAdd"), (lambda name: add_chain(name, links=2), "LookupAdd4")):
        data = model_bytes(*lookup_graph(middle))
        out = rewrite(data)
        assert out is not None and _custom_ops(out) == [op]
        so = ort.SessionOptions()
        so.register_custom_ops_library(library())
        got = ort.InferenceSession(out, so).run(None, {"images": IMAGES})[0]
        np.testing.assert_array_equal(got, ort.InferenceSession(data).run(None, {"images": IMAGES})[0])


@needs_ops
@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_the_onnx_runtime_rewrite_returns_at_once_with_the_graph_as_exported(name: str, tmp_path: Path) -> None:
    data = model_bytes(*HOSTILE[name]())
    out, took = _timed(rewrite, data, Budget(FAST_S))
    assert out is None and took < FAST_S, (name, took)  # nothing the limits let through: left as exported
    path = tmp_path / "model.onnx"
    path.write_bytes(data)
    (source, lib), took = _timed(prepare, path)
    assert (source, lib) == (str(path), None) and took < FAST_S


@needs_ops
@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_the_engine_serves_the_file_as_exported_or_refuses_it_cleanly(name: str, tmp_path: Path) -> None:
    directory = handmade_artifact(tmp_path / name, name, *HOSTILE[name]())
    art = load_artifact(directory)
    if name == "one_input_gather":  # not a valid ONNX graph: ONNX Runtime refuses it, with the fix
        with pytest.raises(EngineError, match="ONNX Runtime cannot load it.*re-run `irpe export`"):
            load_engine(directory, art, backend="onnxruntime", threads=1, max_batch=2)
        return
    engine = load_engine(directory, art, backend="onnxruntime", threads=1, max_batch=2)
    want = ort.InferenceSession(str(directory / "model.onnx")).run(None, {"images": IMAGES})[0]
    np.testing.assert_array_equal(engine.run(IMAGES), want)
    assert engine.info.custom_ops == []


@needs_ops
def test_a_rewrite_over_its_budget_falls_back_with_one_warning(tmp_path: Path,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(model_bytes(*lookup_graph(plain)))
    with pytest.raises(RewriteRefused, match="budget"):
        rewrite(path.read_bytes(), Budget(0))
    with caplog.at_level(logging.WARNING, logger="irpe.artifact"):
        assert prepare(path, budget_s=0) == (str(path), None)
    lines = [r for r in caplog.records if r.name == "irpe.artifact"]
    assert len(lines) == 1 and "runs the file as exported" in lines[0].getMessage() and not lines[0].exc_info
    assert "budget" in lines[0].getMessage()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_the_openvino_rewrite_returns_at_once_as_read_from_the_file(name: str, tmp_path: Path) -> None:
    ov = pytest.importorskip("openvino")
    from irpe.artifact.openvino_graph import read_model

    path = tmp_path / "model.onnx"
    path.write_bytes(model_bytes(*HOSTILE[name]()))
    core = ov.Core()
    if name == "one_input_gather":  # OpenVINO's ONNX reader refuses it before the rewrite sees it
        with pytest.raises(RuntimeError, match="Gather"):
            read_model(core, path)
        return
    model, took = _timed(read_model, core, path)
    assert took < FAST_S + 2, took  # reading the file is part of it
    kinds = [op.get_type_name() for op in model.get_ordered_ops()]
    want = [op.get_type_name() for op in core.read_model(str(path)).get_ordered_ops()]
    assert kinds == want  # nothing rewritten: the graph as read from the file


def test_the_openvino_rewrite_over_its_budget_falls_back_with_one_warning(tmp_path: Path,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    ov = pytest.importorskip("openvino")
    from irpe.artifact.openvino_graph import last_axis_lookups, read_model

    path = tmp_path / "model.onnx"
    path.write_bytes(model_bytes(*lookup_graph(plain)))
    core = ov.Core()
    assert last_axis_lookups(read_model(core, path)) == 0  # rewritten already: no row-layout lookup left
    with caplog.at_level(logging.WARNING, logger="irpe.artifact"):
        model = read_model(core, path, budget_s=0)
    lines = [r for r in caplog.records if r.name == "irpe.artifact"]
    assert len(lines) == 1 and "budget" in lines[0].getMessage() and not lines[0].exc_info
    assert last_axis_lookups(model) == 1  # the model as read from the file: its lookup still in the row layout
    out = core.compile_model(model, "CPU").create_infer_request().infer({0: IMAGES})[0]
    want = ort.InferenceSession(str(path)).run(None, {"images": IMAGES})[0]
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["add_chain", "one_input_gather"])
def test_the_openvino_engine_serves_the_file_as_exported_or_refuses_it_cleanly(name: str, tmp_path: Path) -> None:
    pytest.importorskip("openvino")
    directory = handmade_artifact(tmp_path / name, name, *HOSTILE[name]())
    art = load_artifact(directory)
    if name == "one_input_gather":
        with pytest.raises(EngineError, match="OpenVINO cannot compile it.*--backend onnxruntime"):
            load_engine(directory, art, backend="openvino", threads=1, max_batch=2, precision="fp32")
        return
    engine = load_engine(directory, art, backend="openvino", threads=1, max_batch=2, precision="fp32")
    want = ort.InferenceSession(str(directory / "model.onnx")).run(None, {"images": IMAGES})[0]
    np.testing.assert_allclose(engine.run(IMAGES), want, rtol=1e-5, atol=1e-30)
