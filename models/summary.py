"""Parameter counts and analytic MACs of the registered variants (``irpe models``)."""

from __future__ import annotations

from .buckets import num_buckets
from .deit import ViTConfig
from .registry import get_config, list_models
from .rpe import RPEConfig


def count_params(config: ViTConfig) -> int:
    """Learnable parameters of the architecture (without building it)."""
    d, hid = config.embed_dim, int(config.embed_dim * config.mlp_ratio)
    n_tok = config.num_prefix_tokens + config.grid[0] * config.grid[1]
    per_block = 4 * d + (3 * d * d + (3 * d if config.qkv_bias else 0)) + d * d + d + d * hid + hid + hid * d + d
    rpe = config.rpe
    if rpe.on:
        heads = 1 if rpe.shared else config.num_heads
        k = num_buckets("cross_rows" if rpe.method == "cross" else rpe.method, rpe.ratio, config.num_prefix_tokens)
        tables = 2 if rpe.method == "cross" else 1
        per_table = heads * k * (1 if rpe.mode == "bias" else d // config.num_heads)
        per_block += len(rpe.on) * tables * per_table
    heads_out = (2 if config.distilled else 1) * (d * config.num_classes + config.num_classes)
    stem = config.in_chans * config.patch_size ** 2 * d + d + config.num_prefix_tokens * d + n_tok * d
    return stem + config.depth * per_block + 2 * d + heads_out


def count_macs(config: ViTConfig) -> int:
    """Multiply-accumulates of one forward pass (linear layers, attention, iRPE as in the paper)."""
    d, heads = config.embed_dim, config.num_heads
    hd, n_patch = d // heads, config.grid[0] * config.grid[1]
    n = config.num_prefix_tokens + n_patch
    hid = int(d * config.mlp_ratio)
    block = n * d * 3 * d + 2 * heads * n * n * hd + n * d * d + 2 * n * d * hid
    rpe = config.rpe
    if rpe.on and rpe.mode == "ctx":
        k = num_buckets("cross_rows" if rpe.method == "cross" else rpe.method, rpe.ratio, config.num_prefix_tokens)
        tables = 2 if rpe.method == "cross" else 1
        block += sum(tables * heads * n * k * hd for t in rpe.on if t in "qk")
        block += heads * n * n * hd if "v" in rpe.on else 0  # paper counts the gathered (n, n, d) product
    stem = n_patch * d * config.in_chans * config.patch_size ** 2
    return stem + config.depth * block + (2 if config.distilled else 1) * d * config.num_classes


def model_table(img_size: int = 224) -> list[dict[str, object]]:
    """One row per registered variant: name, RPE config, params, MACs."""
    rows = []
    for name in list_models():
        config = get_config(name)
        if config.img_size == 224 and img_size != 224:
            config = get_config(name, img_size=img_size)
        rows.append({"name": name, "img_size": config.img_size, "rpe": _describe(config.rpe),
                     "params": count_params(config), "macs": count_macs(config)})
    return rows


def _describe(rpe: RPEConfig) -> str:
    """One line for the table: mode, method, ratio, targets and head sharing; "-" for plain DeiT."""
    if not rpe.on:
        return "-"
    return f"{rpe.mode} {rpe.method} r={rpe.ratio:g} on={rpe.on} {'shared' if rpe.shared else 'per-head'}"


def print_model_table(img_size: int = 224) -> None:
    """Print :func:`model_table` as aligned text."""
    rows = model_table(img_size)
    width = max(len(row["name"]) for row in rows)
    print(f"{'name':<{width}}  {'img':>4}  {'params':>8}  {'MACs':>8}  rpe")
    for row in rows:
        print(f"{row['name']:<{width}}  {row['img_size']:>4}  {row['params'] / 1e6:>7.2f}M  "
              f"{row['macs'] / 1e6:>7.0f}M  {row['rpe']}")
