"""model.json and ONNX metadata_props of ``export_artifact``, and ``irpe export`` end to end."""

from __future__ import annotations

import argparse
import json
import os

import onnx
import pytest
import torch

from irpe.artifact import Preprocess, file_sha256, load_artifact
from irpe.cli import main
from irpe.export import ExportError, ExportOptions, export_artifact, parse_formats
from irpe.export.bench import random_model
from irpe.export.metadata import imagenet_labels, labels_for, preprocess_for, read_metadata

MICRO = "deit_micro_patch4_32_ctx_product_shared_k"
DIGITS_PP = {"resize": 32, "crop": 32, "interpolation": "bilinear", "mean": [0.5, 0.5, 0.5],
             "std": [0.25, 0.25, 0.25], "invert": "auto", "grayscale": True}


@pytest.fixture(scope="module")
def digits_checkpoint(tmp_path_factory):
    """A training-style checkpoint: args.model + args.overrides, class_names and a preprocess dict."""
    model = random_model(MICRO, img_size=32, rpe_std=0.5, rpe_on="qkv")
    path = tmp_path_factory.mktemp("ckpt") / "digits.pth"
    torch.save({"model": model.state_dict(), "epoch": 3, "class_names": [f"digit {i}" for i in range(10)],
                "preprocess": DIGITS_PP, "args": argparse.Namespace(model=MICRO, overrides={"rpe_on": "qkv"})},
               path)
    return path


@pytest.fixture(scope="module")
def artifact_dir(digits_checkpoint, tmp_path_factory):
    return export_artifact(digits_checkpoint, tmp_path_factory.mktemp("art"), ExportOptions(progress=False))


def test_imagenet_labels_are_the_1000_classes_in_index_order():
    labels = imagenet_labels()
    assert len(labels) == 1000 and len(set(labels)) == 999  # WordNet lists "crane" twice (bird, machine)
    assert labels[134] == labels[517] == "crane"
    assert labels[0].startswith("tench") and labels[281].startswith("tabby") and labels[999].startswith("toilet tissue")


def test_label_fallbacks():
    assert labels_for(3, ["a", "b", "c"]) == ["a", "b", "c"]
    assert labels_for(1000, None)[1].startswith("goldfish")
    assert labels_for(4, ["only", "two"]) == ["class_0", "class_1", "class_2", "class_3"]


def test_preprocess_from_checkpoint_or_deit_default():
    assert preprocess_for(224, None) == Preprocess.for_imagenet(224)
    pp = preprocess_for(32, DIGITS_PP)
    assert pp.grayscale and pp.invert == "auto" and pp.mean == (0.5, 0.5, 0.5)
    with pytest.raises(ValueError, match="crops to 32 but the model input is 64"):
        preprocess_for(64, DIGITS_PP)
    with pytest.raises(ValueError, match="unknown field"):
        preprocess_for(32, {**DIGITS_PP, "flip": True})


def test_model_json_content(artifact_dir, digits_checkpoint):
    art = load_artifact(artifact_dir)  # verifies the ONNX sha256 too
    assert art.name == MICRO and art.architecture["variant"] == MICRO
    assert art.architecture["rpe"] == {"on": "qkv", "method": "product", "mode": "ctx", "ratio": 1.9, "shared": True}
    assert art.img_size == 32 and art.num_classes == 10 and art.labels[3] == "digit 3"
    want = preprocess_for(32, DIGITS_PP)
    assert vars(art.preprocess) | {"mean": want.mean, "std": want.std} == vars(want)
    assert list(art.preprocess.mean) == list(want.mean) and list(art.preprocess.std) == list(want.std)
    assert (art.input_name, art.output_name, art.opset, art.rpe_plugin) == ("images", "logits", 17, False)
    assert art.onnx_sha256 == file_sha256(artifact_dir / "model.onnx")
    assert art.checkpoint_sha256 == file_sha256(digits_checkpoint)
    assert {"torch", "onnx", "onnxruntime", "irpe-deploy"} <= set(art.versions)
    assert art.parity["passed"] and art.parity["max_abs_diff"] <= 1e-4


def test_metadata_props_repeat_model_json(artifact_dir):
    meta = read_metadata(artifact_dir / "model.onnx")
    doc = json.loads((artifact_dir / "model.json").read_text())
    for key in ("name", "architecture", "img_size", "num_classes", "preprocess", "labels", "opset",
                "input_name", "output_name", "checkpoint_sha256", "versions", "parity"):
        assert meta[key] == doc[key], key
    assert "onnx_sha256" not in meta
    assert onnx.load(str(artifact_dir / "model.onnx")).doc_string.endswith(MICRO)


def test_formats_are_validated():
    assert parse_formats("triton") == ("onnx", "triton")
    with pytest.raises(ExportError, match="unknown --format"):
        parse_formats("onnx,coreml")


def test_cli_export_end_to_end_with_overrides(digits_checkpoint, tmp_path, capsys):
    out = tmp_path / "cli"
    assert main(["export", str(digits_checkpoint), "-o", str(out), "--rpe-plugin", "--format", "onnx"]) == 0
    captured = capsys.readouterr()
    assert str(out / "model.json") in captured.out and "parity" in captured.err
    art = load_artifact(out)
    assert art.rpe_plugin and art.parity["runtime"].endswith("irpe-custom-ops")
    assert any(n.domain == "irpe" for n in onnx.load(str(out / "model.onnx")).graph.node)


def test_cli_refuses_a_hostile_checkpoint_without_running_it(tmp_path, capsys):
    marker = tmp_path / "pwned"

    class Hostile:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    path = tmp_path / "hostile.pth"
    torch.save({"model": {"w": torch.zeros(1)}, "payload": Hostile()}, path)
    assert main(["export", str(path), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("irpe export: error:") and "refused" in err[-1]
    assert not marker.exists()


def test_cli_corrupt_checkpoint_is_a_one_line_error(tmp_path, capsys):
    path = tmp_path / "corrupt.pth"
    path.write_bytes(b"PK\x03\x04 this is not a checkpoint")
    assert main(["export", str(path), "-o", str(tmp_path / "out")]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if "error" in ln]
    assert len(err) == 1 and "corrupt" in err[0]


def test_tensorrt_without_tensorrt_fails_after_writing_the_onnx_artifact(digits_checkpoint, tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    try:
        import tensorrt  # noqa: F401
        pytest.skip("TensorRT is installed here")
    except ImportError:
        pass
    out = tmp_path / "trt"
    assert main(["export", str(digits_checkpoint), "-o", str(out), "--format", "tensorrt"]) == 2
    err = capsys.readouterr().err
    assert "TensorRT" in err and "pip install tensorrt" in err
    assert load_artifact(out).engines == {}
