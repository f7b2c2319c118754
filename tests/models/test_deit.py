import json

import numpy as np
import pytest
import torch

from irpe.models import VisionTransformer, ViTConfig, create_model, list_models
from irpe.models.rpe import RPEConfig


def _vector_model(entry: dict) -> VisionTransformer:
    a = entry["arch"]
    cfg = ViTConfig(img_size=a["img_size"], patch_size=a["patch_size"], num_classes=a["num_classes"],
                    embed_dim=a["embed_dim"], depth=a["depth"], num_heads=a["num_heads"],
                    mlp_ratio=a["mlp_ratio"], distilled=entry["distilled"],
                    rpe=RPEConfig(on=entry["on"], method=entry["method"], mode=entry["mode"],
                                  ratio=entry["ratio"], shared=entry["shared"]))
    return VisionTransformer(cfg).eval()


def test_model_vectors_reproduce_published_logits(reference_dir):
    entries = json.loads((reference_dir / "model_vectors" / "index.json").read_text())
    assert len(entries) == 5
    for e in entries:
        z = np.load(reference_dir / "model_vectors" / e["file"])
        model = _vector_model(e)
        sd = {k[len("state/"):]: torch.from_numpy(z[k]) for k in z.files if k.startswith("state/")}
        model.load_state_dict(sd, strict=True)
        with torch.no_grad():
            out = model(torch.from_numpy(z["input"])).numpy()
        np.testing.assert_allclose(out, z["logits"], atol=1e-5, rtol=0, err_msg=e["name"])


def test_published_layouts_match_checkpoint_layout(reference_dir):
    layout = json.loads((reference_dir / "checkpoint_layout.json").read_text())
    assert len(layout) == 9
    for name, shapes in layout.items():
        assert name in list_models()
        sd = create_model(name).state_dict()
        assert {k: list(v.shape) for k, v in sd.items()} == shapes, name


def test_bucket_tables_are_non_persistent_buffers():
    model = create_model("deit_tiny_patch16_224_ctx_product_50_shared_k")
    buffers = dict(model.named_buffers())
    assert "blocks.0.attn.rpe_k.bucket" in buffers
    assert not any("bucket" in k for k in model.state_dict())


def test_rpe_tables_start_at_zero():
    model = create_model("deit_small_patch16_224_ctx_product_50_shared_qkv", img_size=64)
    tables = [p for n, p in model.named_parameters() if "lookup_table" in n]
    assert len(tables) == 36 and all(float(p.detach().abs().sum()) == 0.0 for p in tables)


@pytest.mark.parametrize("batch", [1, 7])
def test_forward_no_grad_batches(batch):
    name = "deit_tiny_patch16_224_ctx_product_50_shared_k"
    model = create_model(name, rpe_on="qkv", img_size=64, num_classes=5).eval()
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.02)
    with torch.no_grad():
        out = model(torch.randn(batch, 3, 64, 64))
        single = model(torch.randn(1, 3, 64, 64))
    assert out.shape == (batch, 5) and single.shape == (1, 5)
    assert torch.isfinite(out).all()


def test_distilled_returns_both_heads_in_training_and_mean_in_eval():
    model = create_model("deit_tiny_distilled_patch16_224", img_size=32, num_classes=3)
    x = torch.randn(2, 3, 32, 32)
    cls, dist = model.train()(x)
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(x), (model.head(model.forward_features(x)[:, 0])
                                              + model.head_dist(model.forward_features(x)[:, 1])) / 2)
    assert cls.shape == dist.shape == (2, 3)


def test_non_square_grid_via_config():
    cfg = ViTConfig(img_size=32, patch_size=8, embed_dim=48, depth=1, num_heads=3, num_classes=4,
                    rpe=RPEConfig(on="qkv", method="cross"))
    assert VisionTransformer(cfg).eval()(torch.randn(2, 3, 32, 32)).shape == (2, 4)


def test_overrides_and_errors():
    model = create_model("deit_small_patch16_224", rpe_on="kv", rpe_method="euc", rpe_mode="ctx",
                         rpe_ratio=1.9, rpe_shared=False, img_size=96, num_classes=7)
    assert model.blocks[0].attn.rpe_k.lookup_table_weight.shape == (6, 64, 8)
    assert model.blocks[0].attn.rpe_v.lookup_table_weight.shape == (6, 8, 64)
    with pytest.raises(ValueError, match="bias.*cannot be applied to v"):
        create_model("deit_small_patch16_224", rpe_on="v", rpe_mode="bias")
    with pytest.raises(ValueError, match="unknown model"):
        create_model("deit_huge")
    with pytest.raises(ValueError, match="not divisible"):
        create_model("deit_small_patch16_224", img_size=100)
