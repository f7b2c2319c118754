import argparse
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from irpe.artifact.schema import Preprocess
from irpe.cli import main
from irpe.models import CheckpointError, load_checkpoint_with_info
from irpe.training.loop import train

from .conftest import MICRO, SHORT_DIGITS, tiny_config

REPO = Path(__file__).resolve().parents[2]


def test_short_digits_run_improves_and_saves_an_official_checkpoint(digits_run):
    accs = [h["val_acc"] for h in digits_run.history]
    assert len(accs) == SHORT_DIGITS["epochs"] and accs[-1] >= accs[0] + 0.1 and accs[-1] > 0.2, accs
    raw = _load(digits_run.checkpoint)
    assert set(raw) == {"model", "optimizer", "lr_scheduler", "epoch", "args", "class_names", "preprocess"}
    assert isinstance(raw["args"], argparse.Namespace) and raw["args"].model == MICRO
    assert raw["epoch"] == SHORT_DIGITS["epochs"] - 1 and raw["class_names"] == [str(i) for i in range(10)]
    pp = Preprocess(**raw["preprocess"])
    assert pp.grayscale and pp.fit == "ink" and pp.crop == 32 and len(pp.mean) == 3
    model, info = load_checkpoint_with_info(digits_run.checkpoint)
    assert info.name == MICRO and info.epoch == SHORT_DIGITS["epochs"] - 1 and info.class_names == raw["class_names"]
    assert torch.equal(model.state_dict()["head.weight"], raw["model"]["head.weight"])


def test_checkpoint_exports(digits_run, tmp_path):
    from irpe import export
    from irpe.artifact.schema import load_artifact

    out = export.export_artifact(digits_run.checkpoint, tmp_path / "art", export.ExportOptions(progress=False))
    art = load_artifact(out)
    assert art.labels == [str(i) for i in range(10)] and art.preprocess.fit == "ink"
    assert art.preprocess.grayscale and art.img_size == 32


def _load(path: Path) -> dict:
    """weights_only loading with only argparse.Namespace allowed besides plain data and tensors."""
    with torch.serialization.safe_globals([argparse.Namespace]):
        return torch.load(path, map_location="cpu", weights_only=True)


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return _load(path)["model"]


def test_resume_reproduces_an_uninterrupted_run_exactly(image_folder, tmp_path):
    straight = train(tiny_config(image_folder, tmp_path / "straight", workers=1))
    first = train(tiny_config(image_folder, tmp_path / "part", workers=1, stop_after=1))
    assert [h["epoch"] for h in first.history] == [0]
    resumed = train(tiny_config(image_folder, tmp_path / "resumed", workers=1, resume=str(first.checkpoint)))
    assert [h["epoch"] for h in resumed.history] == [1]
    a, b = _weights(straight.checkpoint), _weights(resumed.checkpoint)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    s1 = _load(straight.checkpoint)["optimizer"]["state"]
    s2 = _load(resumed.checkpoint)["optimizer"]["state"]
    assert all(torch.equal(s1[i]["exp_avg_sq"], s2[i]["exp_avg_sq"]) for i in s1)
    assert straight.history[-1]["val_loss"] == resumed.history[-1]["val_loss"]


class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_hostile_resume_pickle_is_refused_without_running(image_folder, tmp_path):
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.pth"
    with open(evil, "wb") as f:
        pickle.dump({"model": {}, "epoch": 0, "x": _Evil(marker)}, f)
    torch.save({"model": {"w": torch.zeros(1)}, "optimizer": _Evil(marker)}, tmp_path / "evil2.pth")
    for path in (evil, tmp_path / "evil2.pth"):
        with pytest.raises(CheckpointError, match="refused|not a readable"):
            train(tiny_config(image_folder, tmp_path / "out", resume=str(path)))
    assert not marker.exists()


def test_resume_of_another_model_or_weights_only_file_names_the_fix(image_folder, tmp_path):
    bare = tmp_path / "bare.pth"
    torch.save({"model": torch.nn.Linear(1, 1).state_dict(), "args": argparse.Namespace(model="deit_tiny_patch16_224")},
               bare)
    with pytest.raises(ValueError, match="--model deit_tiny_patch16_224"):
        train(tiny_config(image_folder, tmp_path / "out", resume=str(bare)))


def test_image_folder_run_via_cli_and_class_count_check(image_folder, tmp_path, capsys):
    out = tmp_path / "cli"
    rc = main(["train", "--data", str(image_folder), "-o", str(out), "--epochs", "1", "--num-classes", "4",
               "--batch-size", "8", "--no-progress", "--threads", "1"])
    assert rc == 0 and (out / "checkpoint.pth").is_file() and (out / "log.txt").is_file()
    raw = _load(out / "checkpoint.pth")
    assert raw["class_names"] == [f"class_{i}" for i in range(4)] and raw["args"].overrides == {"num_classes": 4}
    assert raw["preprocess"]["mean"] == [0.485, 0.456, 0.406] and raw["preprocess"]["resize"] == 36
    rc = main(["train", "--data", str(image_folder), "-o", str(tmp_path / "bad"), "--epochs", "1"])
    assert rc == 2 and "--num-classes 4" in capsys.readouterr().err


def test_image_folder_eval_tensors_are_the_serving_transform(image_folder):
    from PIL import Image

    from irpe.artifact.preprocess import preprocess_image
    from irpe.training.data import image_folder as load_folder

    bundle = load_folder(image_folder, 32)
    x, y = bundle.val[3]
    path, label = bundle.val.samples[3]
    assert y == label and torch.equal(x, torch.from_numpy(preprocess_image(Image.open(path), bundle.preprocess)))
    xt, _ = bundle.train[0]
    assert xt.shape == (3, 32, 32) and xt.dtype == torch.float32


@pytest.mark.skipif(shutil.which("torchrun", path=str(Path(sys.executable).parent)) is None,
                    reason="torchrun not installed")
def test_torchrun_ddp_world_size_one_matches_a_plain_run(image_folder, tmp_path):
    plain = train(tiny_config(image_folder, tmp_path / "plain", epochs=1))
    torchrun = str(Path(sys.executable).parent / "torchrun")
    cmd = [torchrun, "--standalone", "--nproc_per_node", "1", "-m", "irpe", "train", "--data", str(image_folder),
           "-o", str(tmp_path / "ddp"), "--num-classes", "4", "--epochs", "1", "--batch-size", "8",
           "--lr", "0.1", "--warmup-epochs", "1", "--threads", "1", "--no-progress", "--device", "cpu"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    raw = _load(tmp_path / "ddp" / "checkpoint.pth")
    assert raw["args"].world_size == 1 and not any(k.startswith("module.") for k in raw["model"])
    a = _weights(plain.checkpoint)
    assert all(np.allclose(a[k].numpy(), raw["model"][k].numpy(), atol=1e-6) for k in a)
