"""Startup faults are one clear error naming the file and the fix (non-zero exit, no traceback), and hostile
checkpoints are refused without running them."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from irpe.artifact import file_sha256
from tests.reliability.procs import REPO, serve_command, server_env
from tests.server.helpers import make_artifact


def run_irpe(args: list[str], timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m irpe ARGS`` (killed after ``timeout``; a server that starts anyway fails the test)."""
    try:
        return subprocess.run([sys.executable, "-m", "irpe", *args], cwd=REPO, capture_output=True, text=True,
                              timeout=timeout, env=server_env(**env))
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"irpe {args[0]} still running after {timeout}s (started despite the fault?): {e.stderr!r}")


def serve_fails(artifact: Path, *flags: str) -> str:
    """Run ``irpe serve`` on a bad artifact; assert a short, traceback-free failure and return stderr."""
    cmd = serve_command(artifact, 0, *flags)[3:]  # drop "python -m irpe"
    out = run_irpe(cmd, timeout=90)
    assert out.returncode != 0, out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) <= 3, out.stderr
    return out.stderr


def edit_json(directory: Path, **changes: object) -> None:
    path = directory / "model.json"
    data = json.loads(path.read_text())
    for key, value in changes.items():
        if key == "preprocess":
            data["preprocess"].update(value)  # type: ignore[arg-type]
        else:
            data[key] = value
    path.write_text(json.dumps(data))


@pytest.fixture()
def fresh(tmp_path: Path) -> Path:
    return make_artifact(tmp_path / "artifact")


def test_missing_model_onnx(fresh: Path) -> None:
    (fresh / "model.onnx").unlink()
    err = serve_fails(fresh)
    assert "model.onnx" in err and "irpe export" in err


def test_missing_model_json(fresh: Path) -> None:
    (fresh / "model.json").unlink()
    err = serve_fails(fresh)
    assert "model.json" in err and "irpe export" in err


def test_corrupt_model_onnx_with_matching_checksum(fresh: Path) -> None:
    (fresh / "model.onnx").write_bytes(b"\x08\x07garbage, not a protobuf" * 50)
    edit_json(fresh, onnx_sha256=file_sha256(fresh / "model.onnx"))
    err = serve_fails(fresh)
    assert "model.onnx" in err and "irpe export" in err


def test_checksum_mismatch(fresh: Path) -> None:
    with open(fresh / "model.onnx", "ab") as f:
        f.write(b"\x00")
    err = serve_fails(fresh)
    assert "model.onnx" in err and "sha256" in err and "irpe export" in err


def test_model_json_not_json(fresh: Path) -> None:
    (fresh / "model.json").write_text("{not json")
    err = serve_fails(fresh)
    assert "model.json" in err and "irpe export" in err


@pytest.mark.parametrize("changes", [
    {"img_size": 64, "preprocess": {"crop": 64, "resize": 72}},
    {"num_classes": 12, "labels": [f"c{i}" for i in range(12)]},
], ids=["wrong-img-size", "wrong-num-classes"])
def test_model_json_disagrees_with_graph(fresh: Path, changes: dict[str, object]) -> None:
    edit_json(fresh, **changes)
    err = serve_fails(fresh)
    assert "model.onnx" in err and "model.json" in err and "re-export" in err


def test_labels_disagree_with_num_classes(fresh: Path) -> None:
    edit_json(fresh, labels=["only", "three", "labels"])
    err = serve_fails(fresh)
    assert "model.json" in err and "labels" in err


def test_gpu_requested_without_gpu(fresh: Path) -> None:
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has CUDA; the no-GPU error needs a CPU-only build")
    err = serve_fails(fresh, "--device", "cuda")
    assert "--device cuda" in err and "onnxruntime-gpu" in err


def test_unwritable_cache_dir(tmp_path: Path) -> None:
    """IRPE_DATA_DIR below a regular file cannot be created (works as root too, unlike chmod)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    out = run_irpe(["quickstart", "--retrain", "--no-serve"], timeout=180, IRPE_DATA_DIR=str(blocker / "cache"))
    assert out.returncode != 0, out.stdout + out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    assert str(blocker / "cache") in out.stderr and "IRPE_DATA_DIR" in out.stderr, out.stderr


class _Payload:
    """Unpickling this creates ``marker``: what a malicious checkpoint would do."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def _hostile(tmp_path: Path, kind: str) -> tuple[Path, Path]:
    marker = tmp_path / "PWNED"
    path = tmp_path / f"hostile-{kind}.pth"
    obj = {"model": {}, "args": _Payload(marker), "epoch": 1}
    if kind == "torch":
        torch = pytest.importorskip("torch")
        torch.save(obj, path)
    else:
        path.write_bytes(pickle.dumps(obj, protocol=2))
    # prove the file really is hostile: plain unpickling would run the payload
    assert b"system" in path.read_bytes()
    return path, marker


@pytest.mark.parametrize("kind", ["torch", "pickle"])
@pytest.mark.parametrize("command", ["export", "train"])
def test_hostile_checkpoint_is_refused_unexecuted(tmp_path: Path, kind: str, command: str) -> None:
    pytest.importorskip("torch")
    path, marker = _hostile(tmp_path, kind)
    out_dir = tmp_path / "out"
    if command == "export":
        args = ["export", str(path), "-o", str(out_dir)]
    else:
        args = ["train", "--data", "digits", "-o", str(out_dir), "--resume", str(path), "--epochs", "1",
                "--no-progress"]
    out = run_irpe(args, timeout=300)
    assert not marker.exists(), "the checkpoint's payload ran"
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    assert str(path) in out.stderr and ("refused" in out.stderr or "not a readable" in out.stderr), out.stderr
    assert not (out_dir / "model.onnx").exists()
    shutil.rmtree(out_dir, ignore_errors=True)
