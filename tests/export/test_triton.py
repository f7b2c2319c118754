"""Triton model repository from a hand-built artifact; configs parsed with tritonclient's ModelConfig."""

import importlib.util
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from google.protobuf import text_format
from onnx import TensorProto, helper, numpy_helper

from irpe.artifact import ArtifactError, ModelArtifact, Preprocess, file_sha256, save_artifact
from irpe.export.triton import preferred_batch_sizes, triton_repo_from_artifact

LABELS = ["circle", "square", "star", "wave"]


def _tiny_onnx(path):
    """images [N,3,8,8] -> logits [N,4]: flatten + one MatMul."""
    w = np.random.default_rng(0).standard_normal((192, 4)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Flatten", ["images"], ["flat"], axis=1),
         helper.make_node("MatMul", ["flat", "w"], ["logits"])], "tiny",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 4])],
        [numpy_helper.from_array(w, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)


@pytest.fixture
def artifact_dir(tmp_path):
    d = tmp_path / "art"
    d.mkdir()
    _tiny_onnx(d / "model.onnx")
    art = ModelArtifact(name="tiny deit/rpe", architecture={"depth": 1}, img_size=8, num_classes=4,
                        preprocess=Preprocess(resize=8, crop=8), labels=LABELS,
                        onnx_sha256=file_sha256(d / "model.onnx"))
    save_artifact(art, d)
    return d


def _model_config_pb2():
    """tritonclient's shipped ``tritonclient/grpc/model_config_pb2.py``, loaded by path: importing the
    ``tritonclient.grpc`` package needs grpcio (the ``tritonclient[grpc]`` extra), the message module does not."""
    import tritonclient

    path = Path(tritonclient.__file__).parent / "grpc" / "model_config_pb2.py"
    if "tritonclient_model_config_pb2" not in sys.modules:
        spec = importlib.util.spec_from_file_location("tritonclient_model_config_pb2", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules["tritonclient_model_config_pb2"] = module
    return sys.modules["tritonclient_model_config_pb2"]


def _config(path):
    return text_format.Parse(path.read_text(), _model_config_pb2().ModelConfig())


def test_onnx_model_config(artifact_dir):
    root = triton_repo_from_artifact(artifact_dir, max_batch=32)
    assert root == artifact_dir / "triton"
    assert [p.name for p in root.iterdir()] == ["tiny_deit_rpe"], "no plan -> no _trt model"
    model = root / "tiny_deit_rpe"
    cfg = _config(model / "config.pbtxt")
    assert (cfg.name, cfg.platform, cfg.max_batch_size) == ("tiny_deit_rpe", "onnxruntime_onnx", 32)
    (inp,), (out,) = cfg.input, cfg.output
    assert (inp.name, inp.data_type, list(inp.dims)) == ("images", 11, [3, 8, 8])  # 11 = TYPE_FP32
    assert (out.name, list(out.dims), out.label_filename) == ("logits", [4], "labels.txt")
    assert list(cfg.dynamic_batching.preferred_batch_size) == [4, 8, 16, 32]
    assert cfg.dynamic_batching.max_queue_delay_microseconds == 0  # a lone request is not held for a batch
    assert "max_queue_delay_microseconds: 0" in (model / "config.pbtxt").read_text()
    assert cfg.instance_group[0].count == 1
    assert (model / "labels.txt").read_text().split() == LABELS
    assert (model / "1" / "model.onnx").read_bytes() == (artifact_dir / "model.onnx").read_bytes()


def test_data_types_are_fp32(artifact_dir):
    model_config_pb2 = _model_config_pb2()
    cfg = _config(triton_repo_from_artifact(artifact_dir) / "tiny_deit_rpe" / "config.pbtxt")
    assert cfg.input[0].data_type == model_config_pb2.TYPE_FP32
    assert cfg.output[0].data_type == model_config_pb2.TYPE_FP32


def test_tensorrt_plan_model(artifact_dir, tmp_path):
    model_config_pb2 = _model_config_pb2()
    plan = tmp_path / "engine.plan"
    plan.write_bytes(b"not-a-real-engine")
    root = triton_repo_from_artifact(artifact_dir, tmp_path / "repo", model_name="m", max_batch=8,
                                     plan_path=plan)
    assert sorted(p.name for p in root.iterdir()) == ["m", "m_trt"]
    cfg = _config(root / "m_trt" / "config.pbtxt")
    assert (cfg.name, cfg.platform, cfg.max_batch_size) == ("m_trt", "tensorrt_plan", 8)
    assert cfg.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_GPU
    assert list(cfg.dynamic_batching.preferred_batch_size) == [4, 8]
    assert (root / "m_trt" / "1" / "model.plan").read_bytes() == b"not-a-real-engine"


def test_errors_are_clear(artifact_dir, tmp_path):
    with pytest.raises(ArtifactError, match="plan not found"):
        triton_repo_from_artifact(artifact_dir, plan_path=tmp_path / "missing.plan")
    with pytest.raises(ValueError, match="max_batch"):
        triton_repo_from_artifact(artifact_dir, max_batch=0)
    with pytest.raises(ArtifactError, match="model.json"):
        triton_repo_from_artifact(tmp_path / "nowhere")


def test_preferred_batch_sizes():
    assert preferred_batch_sizes(1) == [1]
    assert preferred_batch_sizes(6) == [4, 6]
    assert preferred_batch_sizes(64) == [4, 8, 16, 32, 64]


def test_module_does_not_import_torch_itself():
    import irpe.export.triton as mod

    source = open(mod.__file__).read()
    assert "import torch" not in source and "torch" not in sys.modules.get(mod.__name__).__dict__
