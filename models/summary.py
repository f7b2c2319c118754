"""Parameter counts and analytic MACs of the registered variants (``irpe models``)."""

from __future__ import annotations

from .buckets import num_buckets
from .deit import ViTConfig
from .registry import get_config, list_models


def count_params(cfg: ViTConfig) -> int:
    """Learnable parameters of the architecture (without building it)."""
    d, hid = cfg.embed_dim, int(cfg.embed_dim * cfg.mlp_ratio)
    n_tok = cfg.num_prefix_tokens + cfg.grid[0] * cfg.grid[1]
    per_block = 4 * d + (3 * d * d + (3 * d if cfg.qkv_bias else 0)) + d * d + d + d * hid + hid + hid * d + d
    rpe = cfg.rpe
    if rpe.on:
        heads = 1 if rpe.shared else cfg.num_heads
        k = num_buckets("cross_rows" if rpe.method == "cross" else rpe.method, rpe.ratio, cfg.num_prefix_tokens)
        tables = 2 if rpe.method == "cross" else 1
        per_table = heads * k * (1 if rpe.mode == "bias" else d // cfg.num_heads)
        per_block += len(rpe.on) * tables * per_table
    heads_out = (2 if cfg.distilled else 1) * (d * cfg.num_classes + cfg.num_classes)
    stem = cfg.in_chans * cfg.patch_size ** 2 * d + d + cfg.num_prefix_tokens * d + n_tok * d
    return stem + cfg.depth * per_block + 2 * d + heads_out


def count_macs(cfg: ViTConfig) -> int:
    """Multiply-accumulates of one forward pass (linear layers, attention, iRPE as in the paper)."""
    d, heads = cfg.embed_dim, cfg.num_heads
    hd, n_patch = d // heads, cfg.grid[0] * cfg.grid[1]
    n = cfg.num_prefix_tokens + n_patch
    hid = int(d * cfg.mlp_ratio)
    block = n * d * 3 * d + 2 * heads * n * n * hd + n * d * d + 2 * n * d * hid
    rpe = cfg.rpe
    if rpe.on and rpe.mode == "ctx":
        k = num_buckets("cross_rows" if rpe.method == "cross" else rpe.method, rpe.ratio, cfg.num_prefix_tokens)
        tables = 2 if rpe.method == "cross" else 1
        block += sum(tables * heads * n * k * hd for t in rpe.on if t in "qk")
        block += heads * n * n * hd if "v" in rpe.on else 0  # paper counts the gathered (n, n, d) product
    stem = n_patch * d * cfg.in_chans * cfg.patch_size ** 2
    return stem + cfg.depth * block + (2 if cfg.distilled else 1) * d * cfg.num_classes


def model_table(img_size: int = 224) -> list[dict[str, object]]:
    """One row per registered variant: name, RPE config, params, MACs."""
    rows = []
    for name in list_models():
        cfg = get_config(name)
        if cfg.img_size == 224 and img_size != 224:
            cfg = get_config(name, img_size=img_size)
        r = cfg.rpe
        rpe = f"{r.mode} {r.method} r={r.ratio:g} on={r.on} {'shared' if r.shared else 'per-head'}" if r.on else "-"
        rows.append({"name": name, "img_size": cfg.img_size, "rpe": rpe,
                     "params": count_params(cfg), "macs": count_macs(cfg)})
    return rows


def print_model_table(img_size: int = 224) -> None:
    """Print :func:`model_table` as aligned text."""
    rows = model_table(img_size)
    w = max(len(r["name"]) for r in rows)
    print(f"{'name':<{w}}  {'img':>4}  {'params':>8}  {'MACs':>8}  rpe")
    for r in rows:
        print(f"{r['name']:<{w}}  {r['img_size']:>4}  {r['params'] / 1e6:>7.2f}M  {r['macs'] / 1e6:>7.0f}M  {r['rpe']}")
