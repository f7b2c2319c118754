"""End to end with a real exported iRPE model: checkpoint -> export_artifact -> server -> same logits as torch."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.server.helpers import encode, image, running_server

NAME = "deit_tiny_patch16_224_ctx_product_50_shared_k"


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    import torch

    from irpe.export import export_artifact
    from irpe.models import create_model

    tmp = tmp_path_factory.mktemp("e2e")
    torch.manual_seed(0)
    model = create_model(NAME, img_size=64, num_classes=10).eval()
    ckpt = tmp / "model.pth"
    torch.save(model.state_dict(), ckpt)
    out = export_artifact(ckpt, tmp / "artifact", name=NAME, overrides={"img_size": 64, "num_classes": 10},
                          progress=False)
    return Path(out), ckpt


def test_served_logits_match_torch(exported: tuple[Path, Path]) -> None:
    import torch

    from irpe.artifact import load_artifact
    from irpe.artifact.preprocess import preprocess_image
    from irpe.models import create_model

    artifact, ckpt = exported
    art = load_artifact(artifact)
    assert art.img_size == 64 and art.num_classes == 10
    model = create_model(NAME, img_size=64, num_classes=10).eval()
    model.load_state_dict(torch.load(ckpt))
    imgs = [image((96, 80), seed=s) for s in range(3)]
    with torch.no_grad():
        ref = model(torch.from_numpy(np.stack([preprocess_image(i, art.preprocess) for i in imgs]))).numpy()
    with running_server(artifact, max_wait_ms=20) as url:
        files = [("file", (f"{k}.png", encode(img), "image/png")) for k, img in enumerate(imgs)]
        r = httpx.post(url + "/classify?top_k=10", files=files, timeout=30)
    assert r.status_code == 200 and r.json()["model"] == NAME
    for k, preds in enumerate(r.json()["predictions"]):
        z = ref[k].astype(np.float64)
        p = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
        assert [q["index"] for q in preds][:3] == list(np.argsort(-p)[:3])
        assert max(abs(q["probability"] - p[q["index"]]) for q in preds) < 1e-4


def test_classify_cli_with_a_checkpoint(exported: tuple[Path, Path], tmp_path: Path,
                                        capsys: pytest.CaptureFixture) -> None:
    """`irpe classify IMG --model CHECKPOINT` exports to a temporary artifact and classifies locally."""
    from irpe.cli import main

    _, ckpt = exported
    img = tmp_path / "x.png"
    img.write_bytes(encode(image((90, 70), seed=5)))
    assert main(["classify", str(img), "--model", str(ckpt), "--top-k", "3"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.strip()[:1].isdigit() or str(img) in line]
    assert len(rows) == 3 and rows[0].startswith(str(img))
