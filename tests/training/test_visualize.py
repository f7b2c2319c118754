import argparse

import numpy as np
import pytest
import torch
from PIL import Image

from irpe.cli import main
from irpe.models import create_model
from irpe.models.buckets import TABLE_METHODS, bucket_ids
from irpe.training.visualize import (
    attention_rpe,
    bucket_map,
    distinct_colors,
    plot_bucket_maps,
    plot_learned_rpe,
    save_raw_bucket_map,
)

from .conftest import MICRO


def _is_png(path) -> bool:
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_distinct_colors_are_distinct():
    for n in (1, 2, 7, 49, 50, 200):
        c = distinct_colors(n)
        assert c.shape == (n, 3) and len({tuple(v) for v in c}) == n


@pytest.mark.parametrize("method", TABLE_METHODS)
def test_raw_bucket_map_png_encodes_the_table(method, tmp_path):
    for ref in ((0, 0), (7, 7)):
        m = bucket_map(method, 1.9, (14, 14), ref)
        table = bucket_ids(method, 1.9, 14, 14)
        assert np.array_equal(m.ravel(), table[ref[0] * 14 + ref[1]])
        path = save_raw_bucket_map(m, tmp_path / f"{method}.png", scale=4)
        img = np.asarray(Image.open(path).convert("RGB"))
        assert _is_png(path) and img.shape == (56, 56, 3)
        cells = img[::4, ::4].reshape(-1, 3)
        colours = {tuple(c) for c in cells}
        assert len(colours) == len(np.unique(m))
        pairs = {(int(b), tuple(c)) for b, c in zip(m.ravel(), cells, strict=True)}
        assert len(pairs) == len(colours)  # colour <-> bucket is one-to-one


def test_bucket_figure_and_cli(tmp_path):
    files = plot_bucket_maps(tmp_path, grid=(14, 14), ratio=1.9)
    fig = files[0]
    assert fig.name == "bucket_maps.png" and _is_png(fig)
    assert Image.open(fig).size == (800, 1700)  # 2 refs x 4.0 in, 5 methods x 3.4 in, 100 dpi
    assert len(files) == 1 + 2 * len(TABLE_METHODS)
    assert main(["visualize", "-o", str(tmp_path / "cli"), "--grid", "8"]) == 0
    assert Image.open(tmp_path / "cli" / "buckets_product_r4c4.png").size == (128, 128)


def _checkpoint(tmp_path, **overrides):
    torch.manual_seed(0)
    model = create_model(MICRO, **overrides)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lookup_table" in n:
                p.copy_(torch.randn(p.shape))
    path = tmp_path / "ckpt.pth"
    torch.save({"model": model.state_dict(), "args": argparse.Namespace(model=MICRO, overrides=overrides)}, path)
    return model.eval(), path


def test_bias_mode_addend_is_the_table_itself(tmp_path):
    model, _ = _checkpoint(tmp_path, rpe_mode="bias", rpe_on="qk")
    maps = attention_rpe(model, torch.randn(2, 3, 32, 32))
    assert len(maps) == 4
    blk = model.blocks[1].attn
    ids = blk.rpe_k.bucket
    want = blk.rpe_k.lookup_table_bias[0][ids] + blk.rpe_q.lookup_table_bias[0][ids].T
    assert torch.allclose(maps[1], want, atol=1e-6)


def test_learned_rpe_figures_per_layer_for_a_contextual_checkpoint(tmp_path):
    model, path = _checkpoint(tmp_path)
    x = torch.randn(3, 3, 32, 32)
    maps = attention_rpe(model, x)
    attn = model.blocks[0].attn
    with torch.no_grad():
        tokens = torch.cat([model.cls_token.expand(3, -1, -1), model.patch_embed(x)], 1) + model.pos_embed
        q = attn.qkv(model.blocks[0].norm1(tokens)).reshape(3, 65, 3, 4, 16).permute(2, 0, 3, 1, 4)[0]
        want = attn.rpe_k(q * attn.scale).mean(dim=(0, 1))
    assert maps[0].shape == (65, 65) and torch.allclose(maps[0], want, atol=1e-5)
    assert not torch.allclose(maps[0], attention_rpe(model, x * 2)[0])  # contextual: depends on the input
    files = plot_learned_rpe(path, tmp_path / "out", refs=3, samples=4)
    assert [f.name for f in files] == [f"rpe_layer{i}.png" for i in range(4)]
    assert all(_is_png(f) and Image.open(f).size == (760, 660) for f in files)


def test_model_without_attention_rpe_is_refused():
    with pytest.raises(ValueError, match="no RPE on q or k"):
        attention_rpe(create_model(MICRO, rpe_on="v"), torch.randn(1, 3, 32, 32))
