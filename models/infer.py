"""Infer a ViTConfig from a state dict's keys and shapes."""

from __future__ import annotations

import math
import re
from typing import Any

import torch

from .deit import ViTConfig
from .rpe import RPEConfig

# Published bucket counts -> (method, ratio); euc vs quant cannot be told apart by shape otherwise.
_PUBLISHED_RPE = {("product", 50): ("product", 1.9), ("single", 82): ("euc", 20.0),
                  ("single", 134): ("quant", 33.0), ("cross", 82): ("cross", 20.0)}
_HEADS_BY_DIM = {64: 4, 192: 3, 384: 6, 768: 12, 1024: 16}


class InferenceError(ValueError):
    """The state dict does not say enough to rebuild its architecture."""


def _rpe_from_keys(sd: dict[str, torch.Tensor], overrides: dict[str, Any]) -> tuple[RPEConfig, int | None]:
    on = "".join(t for t in "qkv" if any(re.match(rf"blocks\.0\.attn\.rpe_{t}\.", k) for k in sd))
    if not on:
        return RPEConfig(on=""), None
    keys = [k for k in sd if k.startswith(f"blocks.0.attn.rpe_{on[0]}.")]
    cross = any(".rp_rows." in k for k in keys)
    bias = any(k.endswith("lookup_table_bias") for k in keys)
    t = sd[keys[0]]
    k_buckets = t.shape[-1] if (bias or on[0] != "v") else t.shape[1]
    head_dim = None if bias else (t.shape[2] if on[0] == "v" else t.shape[1])
    kind = "cross" if cross else ("product" if int(math.isqrt(k_buckets - 1)) ** 2 == k_buckets - 1
                                  and overrides.get("rpe_method") in (None, "product") else "single")
    method, ratio = overrides.get("rpe_method"), overrides.get("rpe_ratio")
    if method is None or ratio is None:
        guess = _PUBLISHED_RPE.get((kind, k_buckets))
        if guess is None:
            raise InferenceError(
                f"cannot infer rpe_method/rpe_ratio from {k_buckets} buckets (method family {kind!r}); "
                "pass --model NAME or --rpe-method and --rpe-ratio")
        method, ratio = method or guess[0], ratio or guess[1]
    cfg = RPEConfig(on=on, method=method, mode="bias" if bias else "ctx", ratio=float(ratio),
                    shared=t.shape[0] == 1)
    return cfg, head_dim


def infer_config(sd: dict[str, torch.Tensor], **overrides: Any) -> ViTConfig:
    """Rebuild the architecture of a DeiT / iRPE-DeiT state dict (plus create_model overrides)."""
    need = ["cls_token", "pos_embed", "patch_embed.proj.weight", "head.weight"]
    missing = [k for k in need if k not in sd]
    if missing:
        raise InferenceError(f"state dict lacks {missing}, so its architecture cannot be inferred; "
                             "is this a DeiT/iRPE checkpoint? Pass --model NAME")
    dim, _, patch, _ = sd["patch_embed.proj.weight"].shape
    depth = 1 + max(int(m.group(1)) for k in sd if (m := re.match(r"blocks\.(\d+)\.", k)))
    distilled = "dist_token" in sd
    rpe, head_dim = _rpe_from_keys(sd, overrides)
    heads = _heads(sd, dim, head_dim, rpe)
    n = sd["pos_embed"].shape[1] - (2 if distilled else 1)
    side = math.isqrt(n)
    if side * side != n:
        raise InferenceError(f"pos_embed holds {n} patch positions, not a square grid; pass --img-size")
    hidden = sd["blocks.0.mlp.fc1.weight"].shape[0]
    cfg = ViTConfig(img_size=overrides.get("img_size") or side * patch, patch_size=patch,
                    num_classes=overrides.get("num_classes") or sd["head.weight"].shape[0],
                    embed_dim=dim, depth=depth, num_heads=heads, mlp_ratio=hidden / dim,
                    qkv_bias="blocks.0.attn.qkv.bias" in sd, distilled=distilled,
                    drop_path_rate=overrides.get("drop_path_rate") or 0.0, rpe=rpe)
    _ = cfg.grid
    return cfg


def _heads(sd: dict[str, torch.Tensor], dim: int, head_dim: int | None, rpe: RPEConfig) -> int:
    if rpe.on and not rpe.shared:
        key = next(k for k in sd if k.startswith("blocks.0.attn.rpe_"))
        return sd[key].shape[0]
    if head_dim:
        return dim // head_dim
    if dim in _HEADS_BY_DIM:
        return _HEADS_BY_DIM[dim]
    raise InferenceError(f"cannot infer num_heads for embed dim {dim}; pass --model NAME")
