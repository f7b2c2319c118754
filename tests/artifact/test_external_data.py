"""ONNX external data is refused: only the .onnx file is checksummed, and ONNX Runtime and
OpenVINO keep an external data file mapped, so a write to it would change a model with nothing verified.
Unit tests of the scan, then a real ``irpe serve --model-control poll`` on 127.0.0.1."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import set_external_data

from irpe.artifact import ArtifactError, file_sha256, load_artifact
from irpe.artifact.builtin import BUILTINS, builtin_artifact
from irpe.artifact.onnx_scan import LISTED, MAX_DEPTH, ExternalTensor, TooDeep, external_tensors
from irpe.artifact.schema import refuse_external_data
from tests.reliability.procs import ServerProcess, serving
from tests.server.helpers import encode, image, make_artifact


def _outside(name: str, location: str, values: np.ndarray, directory: Path) -> TensorProto:
    """A tensor whose bytes are in ``directory/location`` (written here), as onnx's external data API does."""
    tensor = numpy_helper.from_array(values, name)
    (directory / location).write_bytes(tensor.raw_data)
    set_external_data(tensor, location=location, offset=0, length=len(tensor.raw_data))
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    return tensor


def _everywhere(directory: Path) -> Path:
    """A model with one external tensor in each place a tensor can sit: initializer, Constant attribute,
    an If branch's initializer, a sparse initializer, a function's node attribute, a training graph."""
    v = np.arange(4, dtype=np.float32)
    out = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])]
    branch = helper.make_graph([helper.make_node("Identity", ["s"], ["y"])], "then", [], out,
                               initializer=[_outside("s", "branch.bin", v, directory)])
    sparse = helper.make_sparse_tensor(_outside("sv", "sparse.bin", v[:2], directory),
                                       numpy_helper.from_array(np.array([0, 2], np.int64), "si"), [4])
    nodes = [helper.make_node("Constant", [], ["c"], value=_outside("c", "const.bin", v, directory)),
             helper.make_node("If", ["cond"], ["y"], then_branch=branch, else_branch=branch)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("cond", TensorProto.BOOL, [])], out,
                              initializer=[_outside("w", "w.bin", v, directory)], sparse_initializer=[sparse])
    fn = helper.make_function("local", "f", ["a"], ["b"], [helper.make_node(
        "Constant", [], ["b"], value=_outside("fc", "function.bin", v, directory))], [helper.make_opsetid("", 17)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], functions=[fn])
    init = helper.make_graph([], "init", [], [], initializer=[_outside("t", "training.bin", v, directory)])
    model.training_info.add().initialization.CopyFrom(init)
    (directory / "model.onnx").write_bytes(model.SerializeToString())
    return directory / "model.onnx"


def test_every_place_a_tensor_can_sit_is_scanned(tmp_path: Path) -> None:
    found = external_tensors(_everywhere(tmp_path))
    assert sorted(found, key=lambda t: t.name) == sorted([
        ExternalTensor("w", "w.bin"), ExternalTensor("c", "const.bin"), ExternalTensor("s", "branch.bin"),
        ExternalTensor("s", "branch.bin"), ExternalTensor("sv", "sparse.bin"), ExternalTensor("fc", "function.bin"),
        ExternalTensor("t", "training.bin")], key=lambda t: t.name)


def test_data_location_alone_or_entries_alone_count_as_external(tmp_path: Path) -> None:
    flagged = numpy_helper.from_array(np.ones(2, np.float32), "flagged")
    flagged.data_location = TensorProto.EXTERNAL  # no entries: ONNX Runtime would still look outside
    entries = numpy_helper.from_array(np.ones(2, np.float32), "entries")
    set_external_data(entries, location="e.bin")  # data_location left DEFAULT
    graph = helper.make_graph([], "g", [], [], initializer=[flagged, entries])
    (tmp_path / "m.onnx").write_bytes(helper.make_model(graph).SerializeToString())  # as is (onnx.save would
    # write the data out)
    assert external_tensors(tmp_path / "m.onnx") == [ExternalTensor("flagged", ""), ExternalTensor("entries", "e.bin")]


def test_self_contained_models_pass(tmp_path: Path) -> None:
    assert external_tensors(make_artifact(tmp_path) / "model.onnx") == []
    for name in BUILTINS:
        assert load_artifact(builtin_artifact(name)).name  # the shipped model loads, scanned
        assert external_tensors(builtin_artifact(name) / "model.onnx") == []


def test_not_protobuf_is_left_to_the_runtime_and_nesting_is_bounded(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\x08\x07garbage" * 50)  # ONNX Runtime refuses it with its own message
    assert external_tensors(garbage) == []
    (tmp_path / "empty.onnx").write_bytes(b"")
    assert external_tensors(tmp_path / "empty.onnx") == []
    def field(number: int, payload: bytes) -> bytes:  # a length-delimited field (the onnx helpers cannot
        return bytes([number << 3 | 2]) + _varint(len(payload)) + payload  # build this deep a message)

    graph = b""
    for _ in range(MAX_DEPTH // 3 + 1):  # graph -> node -> attribute -> graph: three levels a turn
        graph = field(1, field(5, field(6, graph)))
    (tmp_path / "deep.onnx").write_bytes(field(7, graph))
    with pytest.raises(TooDeep, match=f"deeper than {MAX_DEPTH}"):
        external_tensors(tmp_path / "deep.onnx")


def _varint(n: int) -> bytes:
    out = b""
    while n >= 0x80:
        out, n = out + bytes([n & 0x7F | 0x80]), n >> 7
    return out + bytes([n])


def test_a_file_of_many_external_tensors_lists_the_first_few_and_is_refused(tmp_path: Path) -> None:
    """200,000 initializers flagged EXTERNAL, 4 bytes each (800 KB): the scan lists the first LISTED and stops,
    instead of building a list as long as the file allows."""
    tensor = bytes([14 << 3]) + b"\x01"  # data_location (field 14, varint) = EXTERNAL
    graph = (bytes([5 << 3 | 2, len(tensor)]) + tensor) * 200_000  # initializer (graph field 5), many times
    path = tmp_path / "many.onnx"
    path.write_bytes(bytes([7 << 3 | 2]) + _varint(len(graph)) + graph)  # the model's graph (field 7)
    assert external_tensors(path) == [ExternalTensor("", "")] * LISTED
    assert len(external_tensors(path, most=200_001)) == 200_000  # the same file, listed whole
    with pytest.raises(ArtifactError, match=f": {LISTED} or more tensor\\(s\\) kept outside the file"):
        refuse_external_data(path)


def _externalise(directory: Path, location: str = "weights.bin") -> Path:
    """Re-save ``directory/model.onnx`` with its weights in ``location`` and update model.json's digest: a
    model.json valid by every other check (the way a hand-made or tampered version would look)."""
    import onnx

    model = onnx.load(str(directory / "model.onnx"))
    onnx.save(model, str(directory / "model.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
              location=location, size_threshold=0)
    meta = json.loads((directory / "model.json").read_text())
    meta["onnx_sha256"] = file_sha256(directory / "model.onnx")
    (directory / "model.json").write_text(json.dumps(meta))
    return directory


def test_external_data_is_refused_at_load_with_the_reason(tmp_path: Path) -> None:
    d = _externalise(make_artifact(tmp_path / "a"))
    with pytest.raises(ArtifactError) as e:
        load_artifact(d)
    msg = str(e.value)
    assert "2 tensor(s) kept outside the file as ONNX external data ('W' in 'weights.bin'" in msg
    assert "onnx.save(onnx.load(path), path)" in msg and "\n" not in msg
    meta = json.loads((d / "model.json").read_text())  # listing the data file with its digest does not help
    meta["engines"] = {"data": {"file": "weights.bin", "sha256": file_sha256(d / "weights.bin")}}
    (d / "model.json").write_text(json.dumps(meta))
    with pytest.raises(ArtifactError, match="external data"):
        load_artifact(d)


def _until(check: Callable[[], object], timeout: float = 30.0) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.1)
    raise TimeoutError("condition not met in time")


def _classify(server: ServerProcess) -> dict:
    r = httpx.post(f"{server.url}/classify?model=m", content=encode(image(seed=3)),
                   headers={"content-type": "image/png"}, timeout=30)
    assert r.status_code == 200, r.text
    return {k: v for k, v in r.json().items() if k != "timing_ms"}


def _row(server: ServerProcess, version: str) -> dict | None:
    rows = httpx.post(f"{server.url}/v2/repository/index", json={}, timeout=10).json()
    return next((r for r in rows if r["name"] == "m" and r["version"] == version and r["state"] != "LOADING"), None)


def test_poll_refuses_external_data_and_the_old_version_keeps_serving(tmp_path: Path) -> None:
    """Version 2 keeps its weights in weights.bin: refused, named in the index; its data rewritten in place
    (same size, half written): refused again; version 1 answers the same predictions throughout."""
    repo = tmp_path / "repo"
    make_artifact(repo / "m" / "1")
    with serving(repo, "--model-control", "poll", "--poll-interval-s", "0.2") as server:
        before = _classify(server)
        assert before["version"] == "1"
        _externalise(make_artifact(tmp_path / "staging" / "2")).rename(repo / "m" / "2")  # appears whole
        row = _until(lambda: _row(server, "2"))
        assert row["state"] == "UNAVAILABLE" and "external data ('W' in 'weights.bin'" in row["reason"], row
        assert _classify(server) == before
        data = repo / "m" / "2" / "weights.bin"
        size = data.stat().st_size
        with open(data, "r+b") as f:
            f.write(np.random.default_rng(7).bytes(size // 2))
        assert data.stat().st_size == size
        _until(lambda: server.output().count("model m version 2 not loaded") >= 2)  # the poll saw the rewrite
        row = _row(server, "2")
        assert row is not None and row["state"] == "UNAVAILABLE" and "weights.bin" in row["reason"]
        assert _classify(server) == before
