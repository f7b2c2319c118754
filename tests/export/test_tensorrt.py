"""TensorRT engine build (GPU only; skipped here with the reason) and the clear no-TensorRT errors on CPU."""

import importlib.util

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from irpe.export import tensorrt as trt_export
from irpe.plugins import ops
from irpe.plugins.tensorrt_plugin import TensorRTUnavailable


def _gpu_skip_reason() -> str | None:
    if importlib.util.find_spec("tensorrt") is None:
        return "TensorRT is not installed (use nvcr.io/nvidia/tensorrt or `pip install tensorrt` on a CUDA host)"
    try:
        import torch
    except ImportError:
        return "torch is needed to drive CUDA memory in the parity check"
    if not torch.cuda.is_available():
        return "no CUDA GPU visible"
    return None


@pytest.fixture
def no_tensorrt(monkeypatch):
    """Make `import tensorrt` fail even on a machine that has it (sys.modules entry None -> ImportError)."""
    monkeypatch.setitem(__import__("sys").modules, "tensorrt", None)


def test_engine_build_without_tensorrt_says_what_and_how(no_tensorrt, tmp_path):
    with pytest.raises(TensorRTUnavailable) as info:
        trt_export.engine_from_onnx(tmp_path / "m.onnx", tmp_path / "m.plan", max_batch=4, img_size=32)
    msg = str(info.value)
    assert "building a TensorRT engine from" in msg and "m.onnx" in msg  # what was asked
    assert "not found" in msg and "import tensorrt" in msg  # what is missing
    assert "nvcr.io/nvidia/tensorrt" in msg and "pip install tensorrt" in msg  # how to get it
    assert not (tmp_path / "m.plan").exists()


def test_status_and_compare_without_tensorrt(no_tensorrt, tmp_path):
    status = trt_export.tensorrt_status()
    assert status.startswith("TensorRT: not available") and "pip install tensorrt" in status
    with pytest.raises(TensorRTUnavailable, match="comparing .*m.plan"):
        trt_export.compare_engine_with_onnxruntime(tmp_path / "m.plan", tmp_path / "m.onnx", img_size=8)


def test_plugin_register_without_tensorrt(no_tensorrt):
    from irpe.plugins import tensorrt_plugin

    with pytest.raises(TensorRTUnavailable, match="registering the irpe:: TensorRT plugins"):
        tensorrt_plugin.register()


@pytest.mark.parametrize(("version", "strongly_typed"), [("10.9.0.34", True), ("11.4.0.106", False)])
def test_network_flags_by_name_for_each_major(version, strongly_typed):
    from types import SimpleNamespace

    names = {"10": {"STRONGLY_TYPED": 1, "PREFER_JIT_PYTHON_PLUGINS": 2, "PREFER_AOT_PYTHON_PLUGINS": 3},
             "11": {"STRONGLY_TYPED": 0, "PREFER_JIT_PYTHON_PLUGINS": 1, "PREFER_AOT_PYTHON_PLUGINS": 2}}
    flags = names[version.split(".")[0]]
    trt = SimpleNamespace(__version__=version, NetworkDefinitionCreationFlag=SimpleNamespace(**flags))
    got = trt_export.network_flags(trt, use_plugin=True)
    assert got & (1 << flags["PREFER_AOT_PYTHON_PLUGINS"])
    assert bool(got & (1 << flags["STRONGLY_TYPED"])) == strongly_typed
    assert not got & (1 << flags["PREFER_JIT_PYTHON_PLUGINS"])


def test_precision_comes_from_the_graph(tmp_path, monkeypatch):
    _plugin_classifier(tmp_path / "toy.onnx")
    _plugin_classifier(tmp_path / "toy16.onnx", fp16=True)
    trt_export._preflight(tmp_path / "toy16.onnx", fp16=True)
    trt_export._preflight(tmp_path / "toy.onnx", fp16=False)
    monkeypatch.setattr(trt_export, "import_tensorrt", lambda what: (None, None))
    with pytest.raises(ValueError, match="strongly typed"):
        trt_export.engine_from_onnx(tmp_path / "toy.onnx", tmp_path / "m.plan", max_batch=2, img_size=8, fp16=True)


def test_bad_max_batch_is_rejected_before_tensorrt(tmp_path):
    with pytest.raises(ValueError, match="max_batch"):
        trt_export.engine_from_onnx(tmp_path / "m.onnx", tmp_path / "m.plan", max_batch=0, img_size=8)


def _plugin_classifier(path, img: int = 8, k: int = 5, fp16: bool = False) -> None:
    """images [N,3,S,S] as 3*S tokens of width S -> RPEIndex -> softmax -> RPEBucketSum -> logits [N,4]."""
    rng = np.random.default_rng(0)
    wt = np.float16 if fp16 else np.float32
    lq = 3 * img  # rows of the reshaped image act as tokens: [N, 1, 3*S, S]
    table = rng.integers(0, k, (lq, lq)).astype(np.int32)
    inits = [numpy_helper.from_array(table, "table"),
             numpy_helper.from_array(np.array([0, 1, lq, img], np.int64), "tok_shape"),
             numpy_helper.from_array(rng.standard_normal((img, k)).astype(wt), "w_q"),
             numpy_helper.from_array(rng.standard_normal((k, 4)).astype(wt), "w_v")]
    dt = TensorProto.FLOAT16 if fp16 else TensorProto.FLOAT
    nodes = [helper.make_node("Reshape", ["images", "tok_shape"], ["q32"]),
             helper.make_node("Cast", ["q32"], ["q"], to=dt),
             helper.make_node("MatMul", ["q", "w_q"], ["lut"]),
             ops.make_rpe_index_node("lut", "table", "scores", "rpe_q"),
             helper.make_node("Softmax", ["scores"], ["attn"], axis=-1),
             ops.make_bucket_sum_node("attn", "table", "sums", "rpe_v", num_buckets=k),
             helper.make_node("MatMul", ["sums", "w_v"], ["v"]),
             helper.make_node("ReduceMean", ["v"], ["logits_t"], axes=[1, 2], keepdims=0),
             helper.make_node("Cast", ["logits_t"], ["logits"], to=TensorProto.FLOAT)]
    graph = helper.make_graph(nodes, "plugin_toy",
                              [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["N", 3, img, img])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 4])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), ops.plugin_opset_import()],
                                ir_version=8),
              path)


def test_toy_plugin_graph_runs_in_onnxruntime(tmp_path):
    """The same graph the GPU test builds into an engine is valid and runs on CPU via the ORT custom ops."""
    from irpe.plugins.ort_op import session_for_plugin_graph

    _plugin_classifier(tmp_path / "toy.onnx")
    out = session_for_plugin_graph(tmp_path / "toy.onnx").run(None, {"images": np.ones((2, 3, 8, 8), np.float32)})
    assert out[0].shape == (2, 4) and np.all(np.isfinite(out[0]))


@pytest.mark.gpu
@pytest.mark.skipif(_gpu_skip_reason() is not None, reason=_gpu_skip_reason() or "")
@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
def test_engine_with_aot_plugins_matches_onnxruntime(tmp_path, fp16):
    _plugin_classifier(tmp_path / "toy.onnx", fp16=fp16)
    cache = tmp_path / "timing.cache"
    plan = trt_export.engine_from_onnx(tmp_path / "toy.onnx", tmp_path / "toy.plan", max_batch=8, img_size=8,
                                       fp16=fp16, timing_cache=cache)
    assert plan.stat().st_size > 0 and cache.stat().st_size > 0
    report = trt_export.compare_engine_with_onnxruntime(plan, tmp_path / "toy.onnx", img_size=8,
                                                        batch_sizes=(1, 3, 8), atol=5e-2 if fp16 else 1e-3)
    assert report["ok"], report


def test_export_for_tensorrt_of_value_side_irpe_writes_onnx_tensorrt_parses(no_tensorrt, tmp_path):
    """--format tensorrt on a value-side iRPE model: model.onnx itself suits TensorRT's parser (no ScatterND
    reduction); without TensorRT the engine build fails with the message saying only the engine is missing."""
    import torch

    from irpe.export import ExportError, ExportOptions, export_artifact
    from irpe.models import create_model

    name = "deit_tiny_patch16_224_ctx_product_50_shared_k"
    torch.manual_seed(0)
    torch.save(create_model(name, img_size=32, num_classes=4, rpe_on="qkv").state_dict(), tmp_path / "m.pth")
    with pytest.raises(ExportError, match="only the TensorRT engine is missing"):
        export_artifact(tmp_path / "m.pth", tmp_path / "out",
                        ExportOptions(name=name, formats="tensorrt", progress=False,
                                      overrides={"img_size": 32, "num_classes": 4, "rpe_on": "qkv"}))
    assert trt_export.tensorrt_incompatibilities(onnx.load(str(tmp_path / "out" / "model.onnx"))) == []
