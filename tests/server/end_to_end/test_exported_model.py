"""End to end with a real exported iRPE model (non-zero RPE tables on q, k and v): checkpoint -> export_artifact
-> server -> the same top-k as PyTorch, over HTTP."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest

from irpe.artifact.ort_graph import library
from tests.server.helpers import encode, image, running_server

NAME = "deit_small_patch16_224_ctx_product_50_shared_qkv"
RPE_STD = 0.5  # random, non-zero bucket tables (a trained model's are; zero tables would hide a wrong gather)


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    import torch

    from irpe.export import ExportOptions, export_artifact
    from irpe.export.bench import random_model

    tmp = tmp_path_factory.mktemp("e2e")
    model = random_model(NAME, img_size=64, rpe_std=RPE_STD, num_classes=10)
    tables = [p for k, p in model.named_parameters() if "lookup_table" in k]
    assert len(tables) == 3 * 12 and all(float(t.detach().abs().min()) > 0 for t in tables)  # q, k, v in 12 blocks
    ckpt = tmp / "model.pth"
    torch.save(model.state_dict(), ckpt)
    out = export_artifact(ckpt, tmp / "artifact",
                          ExportOptions(name=NAME, overrides={"img_size": 64, "num_classes": 10}, progress=False))
    return Path(out), ckpt


def test_served_logits_match_torch(exported: tuple[Path, Path]) -> None:
    import torch

    from irpe.artifact import load_artifact
    from irpe.artifact.preprocess import preprocess_image
    from irpe.models import create_model

    artifact, ckpt = exported
    art = load_artifact(artifact)
    assert art.img_size == 64 and art.num_classes == 10
    if library() is not None:  # the export checked the graph `irpe serve` runs on ONNX Runtime too
        assert art.parity["irpe_ort_ops"]["passed"] and art.parity["irpe_ort_ops"]["max_abs_diff"] < 1e-3
    model = create_model(NAME, img_size=64, num_classes=10).eval()
    model.load_state_dict(torch.load(ckpt))
    imgs = [image((96, 80), seed=s) for s in range(3)]
    x = torch.from_numpy(np.stack([preprocess_image(i, art.preprocess) for i in imgs]))
    with torch.no_grad():
        ref = model(x).numpy()
        for key, p in model.named_parameters():
            if "lookup_table" in key:
                p.zero_()
        without_rpe = model(x).numpy()
    assert np.abs(ref - without_rpe).max() > 0.1  # the RPE terms move these logits: a dropped gather would show
    with running_server(artifact, max_wait_ms=20) as url:
        files = [("file", (f"{k}.png", encode(img), "image/png")) for k, img in enumerate(imgs)]
        r = httpx.post(url + "/classify?top_k=10", files=files, timeout=30)
        models = httpx.get(url + "/v1/models", timeout=10).json()["models"]
    assert r.status_code == 200 and r.json()["model"] == NAME
    if library() is not None:  # the lookups ran as the irpe.ort custom ops (artifact/ort_graph.py)
        assert [m["custom_ops"] for m in models] == [["irpe.ort"]]
    for k, preds in enumerate(r.json()["predictions"]):
        z = ref[k].astype(np.float64)
        p = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
        assert [q["index"] for q in preds] == list(np.argsort(-p)[:10])  # the full top-10 order
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
