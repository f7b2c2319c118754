"""User errors of ``irpe export``, ``irpe classify`` and ``irpe train``: exit 2, one line naming the fix,
nothing half-written; and the export's warnings and format combinations that must keep working."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from PIL import Image

from irpe.cli import main
from irpe.export.bench import random_model

MICRO = "deit_micro_patch4_32_ctx_product_shared_k"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cli-errors") / "micro.pth"
    torch.save({"model": random_model(MICRO, img_size=32, rpe_std=0.5).state_dict()}, path)
    return path


@pytest.fixture(scope="module")
def exported(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cli-errors-art") / "art"
    assert main(["export", str(checkpoint), "-o", str(out)]) == 0
    return out


def fails(argv: list[str], capsys: pytest.CaptureFixture) -> str:
    """Run the CLI; it must exit 2 with a one-line ``irpe CMD: error: ...`` and no traceback."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith(f"irpe {argv[0]}: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("value", ["0", "-3"])
def test_export_max_batch_below_one(checkpoint: Path, tmp_path: Path, capsys, value: str) -> None:
    line = fails(["export", str(checkpoint), "-o", str(tmp_path / "o"), "--max-batch", value], capsys)
    assert f"--max-batch must be >= 1, got {value}" in line
    assert not (tmp_path / "o").exists()


def test_export_output_naming_a_file(checkpoint: Path, tmp_path: Path, capsys) -> None:
    target = tmp_path / "model.onnx"
    target.write_bytes(b"keep me")
    line = fails(["export", str(checkpoint), "-o", str(target)], capsys)
    assert str(target) in line and "not a directory" in line and "-o a directory" in line
    assert target.read_bytes() == b"keep me"


def test_export_unknown_format(checkpoint: Path, tmp_path: Path, capsys) -> None:
    line = fails(["export", str(checkpoint), "-o", str(tmp_path / "o"), "--format", "onnx,tflite"], capsys)
    assert "tflite" in line and "onnx, tensorrt, triton" in line


def test_export_missing_checkpoint(tmp_path: Path, capsys) -> None:
    line = fails(["export", str(tmp_path / "nope.pth"), "-o", str(tmp_path / "o")], capsys)
    assert "nope.pth" in line


def test_stale_plan_is_named_after_a_new_export(checkpoint: Path, exported: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "art"
    shutil.copytree(exported, out)
    (out / "model.plan").write_bytes(b"an engine of an older graph")
    assert main(["export", str(checkpoint), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert f"warning: {out / 'model.plan'} is from an earlier export" in err
    assert "delete it or re-run with --format tensorrt" in err


def test_fresh_export_has_no_stale_plan_warning(checkpoint: Path, tmp_path: Path, capsys) -> None:
    assert main(["export", str(checkpoint), "-o", str(tmp_path / "art")]) == 0
    assert "earlier export" not in capsys.readouterr().err


def test_triton_repository_of_an_fp16_export_matches_its_graph(checkpoint: Path, tmp_path: Path, capsys) -> None:
    """``--format triton --fp16``: the repository serves the fp16 graph, and config.pbtxt declares the
    graph's real I/O types (FP32 in and out, casts inside), or Triton would refuse to load it."""
    out = tmp_path / "art"
    assert main(["export", str(checkpoint), "-o", str(out), "--format", "triton", "--fp16"]) == 0
    [model_dir] = list((out / "triton").iterdir())
    graph = onnx.load(str(model_dir / "1" / "model.onnx"))
    assert (model_dir / "1" / "model.onnx").read_bytes() == (out / "model.onnx").read_bytes()
    assert any(i.data_type == onnx.TensorProto.FLOAT16 for i in graph.graph.initializer)  # really fp16
    io_types = {v.name: v.type.tensor_type.elem_type for v in [*graph.graph.input, *graph.graph.output]}
    assert io_types == {"images": onnx.TensorProto.FLOAT, "logits": onnx.TensorProto.FLOAT}
    config = (model_dir / "config.pbtxt").read_text()
    assert config.count("data_type: TYPE_FP32") == 2 and "TYPE_FP16" not in config


def test_classify_missing_inputs(exported: Path, tmp_path: Path, capsys) -> None:
    img = tmp_path / "a.png"
    Image.fromarray(np.zeros((40, 40, 3), np.uint8)).save(img)
    line = fails(["classify", str(tmp_path / "missing.png"), str(img), "--model", str(exported)], capsys)
    assert "image file(s) not found" in line and "missing.png" in line and "a.png" not in line
    line = fails(["classify", str(img), "--model", str(tmp_path / "no-model")], capsys)
    assert "--model" in line and "no-model" in line and "no such file or directory" in line
    line = fails(["classify", str(img), "--model", str(exported), "--top-k", "0"], capsys)
    assert "--top-k must be at least 1" in line


def test_classify_a_directory_without_model_json(tmp_path: Path, capsys) -> None:
    img = tmp_path / "a.png"
    Image.fromarray(np.zeros((40, 40, 3), np.uint8)).save(img)
    (tmp_path / "empty").mkdir()
    line = fails(["classify", str(img), "--model", str(tmp_path / "empty")], capsys)
    assert "model.json" in line


def _train(data: str, out: Path, *extra: str) -> list[str]:
    return ["train", "--data", data, "-o", str(out), "--epochs", "1", "--batch-size", "8", "--threads", "1",
            "--no-progress", "--model", MICRO, *extra]


def test_train_data_neither_builtin_nor_directory(tmp_path: Path, capsys) -> None:
    line = fails(_train(str(tmp_path / "nowhere"), tmp_path / "o"), capsys)
    assert "nowhere" in line and "not a builtin (digits)" in line and "train/<class>/*.jpg" in line


def test_train_image_folder_without_images(tmp_path: Path, capsys) -> None:
    for split in ("train", "val"):
        (tmp_path / "data" / split / "cat").mkdir(parents=True)
        (tmp_path / "data" / split / "cat" / "notes.txt").write_text("not an image")
    line = fails(_train(str(tmp_path / "data"), tmp_path / "o"), capsys)
    assert "no images found" in line and "train" in line


def test_train_image_folder_without_val_split(tmp_path: Path, capsys) -> None:
    d = tmp_path / "data" / "train" / "cat"
    d.mkdir(parents=True)
    Image.fromarray(np.zeros((40, 40, 3), np.uint8)).save(d / "0.jpg")
    line = fails(_train(str(tmp_path / "data"), tmp_path / "o"), capsys)
    assert "val" in line and "no such directory" in line


def test_train_class_folders_that_differ_between_splits(tmp_path: Path, capsys) -> None:
    for split, classes in (("train", ("cat", "dog")), ("val", ("cat", "cow"))):
        for c in classes:
            (tmp_path / "data" / split / c).mkdir(parents=True)
            Image.fromarray(np.zeros((40, 40, 3), np.uint8)).save(tmp_path / "data" / split / c / "0.jpg")
    line = fails(_train(str(tmp_path / "data"), tmp_path / "o", "--num-classes", "2"), capsys)
    assert "differ from the train split" in line and "cow" in line


def test_train_resume_of_a_missing_file(tmp_path: Path, capsys) -> None:
    line = fails(_train("digits", tmp_path / "o", "--resume", str(tmp_path / "gone.pth")), capsys)
    assert "gone.pth" in line


def test_train_resume_of_a_weights_only_file(checkpoint: Path, tmp_path: Path, capsys) -> None:
    line = fails(_train("digits", tmp_path / "o", "--resume", str(checkpoint)), capsys)
    assert "cannot be resumed" in line and "start a new run" in line
