"""int8 QDQ export: TensorRT's explicit-quantization form, fidelity reports written and enforced."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from irpe.artifact import load_artifact
from irpe.cli import main
from irpe.export.fidelity import compare, enforce, image_sets
from irpe.export.quantize import matmuls_in_scope, qdq_form_violations, quantized_matmuls
from tests.export.int8_helpers import digits_checkpoint, export_int8

FLOAT_OPS = ("LayerNormalization", "Softmax", "Erf", "Gather", "ScatterND", "Add", "Div", "Mul")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return digits_checkpoint(tmp_path_factory.mktemp("ckpt") / "digits.pth")


@pytest.fixture(scope="module")
def int8_dir(ckpt: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_int8(ckpt, tmp_path_factory.mktemp("int8"))


def test_graph_is_qdq_in_tensorrt_form(int8_dir: Path) -> None:
    proto = onnx.load(str(int8_dir / "model.onnx"))
    assert qdq_form_violations(proto) == []
    consts = {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer}
    producers = {o: n for n in proto.graph.node for o in n.output}
    qdq = [n for n in proto.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    assert qdq and all(consts[n.input[2]].dtype == np.int8 and not consts[n.input[2]].any() for n in qdq)
    names = quantized_matmuls(proto)
    assert sorted(names) == sorted(matmuls_in_scope(proto, "linear")) and len(names) == 4 * 4  # 4 blocks
    for n in proto.graph.node:
        if n.name in names:  # weight: int8 per output channel (last axis of the (in, out) weight)
            dq = producers[n.input[1]]
            w, scale = consts[dq.input[0]], consts[dq.input[1]]
            assert w.dtype == np.int8 and scale.shape == (w.shape[1],)
            assert next(a.i for a in dq.attribute if a.name == "axis") in (1, -1)
        if n.op_type in FLOAT_OPS:  # LN, Softmax, GELU, iRPE gathers / bucket sums, residuals stay float
            assert all(producers.get(i) is None or producers[i].op_type != "DequantizeLinear" for i in n.input)
    assert not any(n.name.startswith("head") for n in proto.graph.node if n.name in names)
    art = load_artifact(int8_dir)
    assert art.quantization["precision"] == "int8" and art.quantization["matmuls"] == 16


def test_form_checker_catches_asymmetric_and_per_tensor_weights(int8_dir: Path) -> None:
    proto = onnx.load(str(int8_dir / "model.onnx"))
    dq = next(n for n in proto.graph.node if n.op_type == "DequantizeLinear" and n.input[0].endswith("_quantized"))
    for init in proto.graph.initializer:
        if init.name == dq.input[2]:
            init.CopyFrom(numpy_helper.from_array(np.full(numpy_helper.to_array(init).shape, 3, np.int8), init.name))
        if init.name == dq.input[1]:
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init)[:1].copy(), init.name))
    bad = " ".join(qdq_form_violations(proto))
    assert "not 0" in bad and "per output channel" in bad


def test_fidelity_reports_are_written(int8_dir: Path) -> None:
    """int8 on OpenVINO and ONNX Runtime always; bf16 where the CPU runs it natively (else no bf16 report)."""
    from irpe.export.fidelity import openvino_bf16

    fid = json.loads((int8_dir / "model.json").read_text())["fidelity"]
    bf16 = openvino_bf16()
    assert ("bf16" in fid) == bf16
    for key in ("int8", "int8_onnxruntime", *(["bf16"] if bf16 else [])):
        r = fid[key]
        assert r["images"] == 360 and r["labelled"] == 360  # the whole digits validation split, held out
        assert r["passed"] is True and r["top1_agreement"] >= 0.9 and r["cosine_mean"] >= 0.99
        assert {"max_abs_logit_diff", "accuracy_fp32", "accuracy", "accuracy_drop", "thresholds"} <= set(r)
    assert fid["int8"]["thresholds"]["cosine_mean"] == 0.99
    if bf16:
        assert fid["bf16"]["thresholds"]["cosine_mean"] == 0.999 and fid["bf16"]["cosine_mean"] >= 0.999
    assert "openvino" in fid["int8"]["runtime"] and fid["int8_onnxruntime"]["runtime"] == "onnxruntime-cpu"


def test_fidelity_floor_refuses_the_export_naming_the_gap(ckpt: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "art"
    code = main(["export", str(ckpt), "-o", str(out), "--int8", "--calibration", "digits",
                 "--calibration-size", "16", "--min-cosine", "1.01"])
    err = capsys.readouterr().err
    assert code == 2
    assert "int8 export refused" in err and "cosine_mean" in err and "short by" in err and "--min-cosine" in err
    data = json.loads((out / "model.json").read_text())
    assert data["quantization"] == {} and data["fidelity"]["int8"]["passed"] is False
    assert not any(n.op_type == "QuantizeLinear" for n in onnx.load(str(out / "model.onnx")).graph.node)
    load_artifact(out)  # the directory is still a valid fp32 artifact


def test_enforce_accuracy_drop_and_top1() -> None:
    ref = np.eye(4, dtype=np.float32) * 5
    worse = ref.copy()
    worse[0] = [0, 6, 0, 0]
    report = compare(ref, worse, np.arange(4))
    assert report["top1_agreement"] == 0.75 and report["accuracy_drop"] == pytest.approx(0.25)
    with pytest.raises(ValueError, match="top1_agreement 0.7500 < 0.99.*accuracy drop 25.00 points"):
        enforce("int8", report, {})
    assert enforce("int8", report, {"top1_agreement": 0.7, "cosine_mean": 0.5, "accuracy_drop": 0.3})["passed"]
    assert enforce("bf16", compare(ref, worse, np.arange(4)), {})["passed"] is False  # recorded, not raised


def test_image_directory_is_split_into_disjoint_calibration_and_heldout(ckpt: Path, int8_dir: Path,
                                                                      tmp_path: Path) -> None:
    from PIL import Image

    art = load_artifact(int8_dir)
    for i in range(12):
        d = tmp_path / "imgs" / (str(i % 3) if i < 9 else "unknown-class")
        d.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((20, 20), i * 20, np.uint8)).save(d / f"{i}.png")
    sets = image_sets(str(tmp_path / "imgs"), art, calibration_size=5, heldout=100)
    assert sets.calibration.shape == (5, 3, 32, 32) and sets.heldout.shape == (7, 3, 32, 32)
    means = {float(a.mean()) for a in sets.calibration} & {float(a.mean()) for a in sets.heldout}
    assert not means  # every image is distinct, so disjoint sets share no mean
    assert set(sets.labels.tolist()) <= {-1, 0, 1, 2}
    with pytest.raises(ValueError, match="not a directory"):
        image_sets(str(tmp_path / "missing"), art)


def test_rpe_plugin_int8_keeps_irpe_nodes_float_between_qdq(ckpt: Path, int8_dir: Path, tmp_path: Path) -> None:
    """--rpe-plugin --int8: the plugin graph gets the standard graph's Q/DQ pairs (TensorRT's form), its irpe::
    nodes read float tensors, and ONNX Runtime runs it (custom-op lowering) like the standard int8 graph."""
    from irpe.export import ExportOptions, export_artifact
    from irpe.export.parity import ort_session
    from irpe.plugins.ops import DOMAIN
    from tests.export.int8_helpers import RANDOM_MODEL_FLOORS

    options = ExportOptions(progress=False, int8=True, calibration="digits", rpe_plugin=True,
                            calibration_options={"calibration_size": 32, "floors": RANDOM_MODEL_FLOORS})
    out = export_artifact(ckpt, tmp_path / "plugin", options)
    proto = onnx.load(str(out / "model.onnx"))
    assert qdq_form_violations(proto) == []
    assert sorted(quantized_matmuls(proto)) == sorted(quantized_matmuls(onnx.load(str(int8_dir / "model.onnx"))))
    producers = {o: n for n in proto.graph.node for o in n.output}
    plugin = [n for n in proto.graph.node if n.domain == DOMAIN]
    assert plugin and all(producers.get(i) is None or producers[i].op_type not in ("QuantizeLinear", "DequantizeLinear")
                          for n in plugin for i in n.input)
    art = load_artifact(out)
    assert art.rpe_plugin and art.quantization["matmuls"] == 16 and art.fidelity["int8"]["top1_agreement"] >= 0.9
    x = np.random.default_rng(0).standard_normal((3, 3, 32, 32), dtype=np.float32)
    got = ort_session(out / "model.onnx", rpe_plugin=True).run(["logits"], {"images": x})[0]
    want = ort_session(int8_dir / "model.onnx").run(["logits"], {"images": x})[0]
    assert np.abs(got - want).max() <= 1e-3 * max(1.0, float(np.abs(want).max()))


def test_scopes_name_the_matmuls_they_quantize() -> None:
    """linear: qkv/proj/fc1/fc2; rpe: + every iRPE matmul; attention: + q @ k^T (attn @ v stays float: softmax
    probabilities would waste half of signed int8); all: both. The head never."""
    from irpe.export.bench import random_model
    from irpe.export.onnx import build_onnx

    model = random_model("deit_tiny_patch16_224_ctx_product_50_shared_k", img_size=32, rpe_on="qkv")
    proto, depth = build_onnx(model), model.cfg.depth
    counts = {s: len(matmuls_in_scope(proto, s)) for s in ("linear", "rpe", "attention", "all")}
    # rpe per layer: q and k lookups, the two separable bucket sums (product method), the (K, d) values
    assert counts == {"linear": 4 * depth, "rpe": 9 * depth, "attention": 5 * depth, "all": 10 * depth}
    assert not any(n.endswith("/context") or n.startswith("head") for n in matmuls_in_scope(proto, "all"))
