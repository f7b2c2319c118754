"""model.json is untrusted: types, file names, digests and labels are checked at load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from irpe.artifact import ArtifactError, ModelArtifact, Preprocess, file_sha256, load_artifact, save_artifact


def _dir(tmp_path: Path, **fields: object) -> Path:
    (tmp_path / "model.onnx").write_bytes(b"onnx bytes")
    art = ModelArtifact(name="m", architecture={}, img_size=32, num_classes=2, preprocess=Preprocess(36, 32),
                        labels=["a", "b"], onnx_sha256=file_sha256(tmp_path / "model.onnx"))
    save_artifact(art, tmp_path)
    data = json.loads((tmp_path / "model.json").read_text())
    for key, value in fields.items():
        if key.startswith("preprocess."):
            data["preprocess"][key.split(".", 1)[1]] = value
        else:
            data[key] = value
    (tmp_path / "model.json").write_text(json.dumps(data))
    return tmp_path


def test_valid_artifact_loads(tmp_path: Path) -> None:
    assert load_artifact(_dir(tmp_path)).labels == ["a", "b"]


@pytest.mark.parametrize(("fields", "match"), [
    ({"onnx_file": "../model.onnx"}, "inside the artifact directory"),
    ({"onnx_file": "/etc/passwd"}, "inside the artifact directory"),
    ({"engines": {"tensorrt": {"file": "../../x.plan"}}}, "inside the artifact directory"),
    ({"preprocess.interpolation": "lanczos"}, "interpolation"),
    ({"preprocess.resize": "36"}, "resize"),
    ({"preprocess.std": [0.2, 0.0, 0.2]}, "std"),
    ({"preprocess.mean": [0.5, float("nan"), 0.5]}, "mean"),
    ({"preprocess.grayscale": "yes"}, "grayscale"),
    ({"preprocess.fit": "box"}, "fit"),
    ({"preprocess.fit_size": -1}, "fit_size"),
    ({"img_size": True}, "img_size"),
    ({"num_classes": 2.0}, "num_classes"),
    ({"labels": ["a", "b:c"]}, "':'"),
    ({"labels": ["a", "b\nc"]}, "control"),
    ({"labels": ["a", 3]}, "not a string"),
    ({"onnx_sha256": "xyz"}, "64 hex"),
    ({"engines": []}, "engines"),
])
def test_bad_fields_are_refused_at_load(tmp_path: Path, fields: dict[str, object], match: str) -> None:
    with pytest.raises(ArtifactError, match=match):
        load_artifact(_dir(tmp_path, **fields))


def test_empty_digest_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="onnx_sha256 is empty"):
        load_artifact(_dir(tmp_path, onnx_sha256=""))


def test_plan_digest_is_checked_before_loading(tmp_path: Path) -> None:
    d = _dir(tmp_path, engines={"tensorrt": {"file": "model.plan", "sha256": "0" * 64}})
    (d / "model.plan").write_bytes(b"a plan")
    with pytest.raises(ArtifactError, match="model.plan: sha256 differs"):
        load_artifact(d)
    _dir(tmp_path, engines={"tensorrt": {"file": "model.plan"}})
    with pytest.raises(ArtifactError, match="no sha256 recorded for model.plan"):
        load_artifact(d)
    _dir(tmp_path, engines={"tensorrt": {"file": "model.plan", "sha256": file_sha256(d / "model.plan")}})
    assert load_artifact(d).engines["tensorrt"]["file"] == "model.plan"


def test_invalid_artifact_is_never_written(tmp_path: Path) -> None:
    art = ModelArtifact(name="m", architecture={}, img_size=32, num_classes=1, preprocess=Preprocess(36, 32),
                        labels=["x:y"])
    with pytest.raises(ArtifactError, match="cannot write"):
        save_artifact(art, tmp_path)
