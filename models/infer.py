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


def _rpe_from_keys(state_dict: dict[str, torch.Tensor], overrides: dict[str, Any]) -> tuple[RPEConfig, int | None]:
    """The RPE config of the first block's tables, and the head dim they show (None for bias tables)."""
    on = "".join(target for target in "qkv"
                 if any(re.match(rf"blocks\.0\.attn\.rpe_{target}\.", key) for key in state_dict))
    if not on:
        return RPEConfig(on=""), None
    keys = [key for key in state_dict if key.startswith(f"blocks.0.attn.rpe_{on[0]}.")]
    cross = any(".rp_rows." in key for key in keys)
    bias = any(key.endswith("lookup_table_bias") for key in keys)
    table = state_dict[keys[0]]  # (H', K) bias, (H', D, K) on q or k, (H', K, D) on v
    k_buckets = table.shape[-1] if (bias or on[0] != "v") else table.shape[1]
    head_dim = None if bias else (table.shape[2] if on[0] == "v" else table.shape[1])
    square_plus_one = int(math.isqrt(k_buckets - 1)) ** 2 == k_buckets - 1
    product = square_plus_one and overrides.get("rpe_method") in (None, "product")
    kind = "cross" if cross else ("product" if product else "single")
    method, ratio = overrides.get("rpe_method"), overrides.get("rpe_ratio")
    if method is None or ratio is None:
        guess = _PUBLISHED_RPE.get((kind, k_buckets))
        if guess is None:
            raise InferenceError(
                f"cannot infer rpe_method/rpe_ratio from {k_buckets} buckets (method family {kind!r}); "
                "pass --model NAME or --rpe-method and --rpe-ratio")
        method, ratio = method or guess[0], ratio or guess[1]
    config = RPEConfig(on=on, method=method, mode="bias" if bias else "ctx", ratio=float(ratio),
                       shared=table.shape[0] == 1)
    return config, head_dim


def infer_config(state_dict: dict[str, torch.Tensor], **overrides: Any) -> ViTConfig:
    """Rebuild the architecture of a DeiT / iRPE-DeiT state dict from its keys and shapes.

    Args:
        state_dict: the weights (``module.`` prefix already removed).
        **overrides: create_model keywords; ``rpe_method`` and ``rpe_ratio`` settle RPE tables whose
            bucket count matches no published variant, ``img_size`` a grid that is not square.

    Returns:
        The :class:`ViTConfig` the weights fit.

    Raises:
        InferenceError: a key the architecture needs is missing, the RPE tables' method or the head count
            cannot be told, or the position embedding is not a square grid.
        ValueError: an override is invalid.
    """
    need = ["cls_token", "pos_embed", "patch_embed.proj.weight", "head.weight"]
    missing = [key for key in need if key not in state_dict]
    if missing:
        raise InferenceError(f"state dict lacks {missing}, so its architecture cannot be inferred; "
                             "is this a DeiT/iRPE checkpoint? Pass --model NAME")
    dim, _, patch, _ = state_dict["patch_embed.proj.weight"].shape
    depth = 1 + max(int(match.group(1)) for key in state_dict if (match := re.match(r"blocks\.(\d+)\.", key)))
    distilled = "dist_token" in state_dict
    rpe, head_dim = _rpe_from_keys(state_dict, overrides)
    heads = _heads(state_dict, dim, head_dim, rpe)
    positions = state_dict["pos_embed"].shape[1] - (2 if distilled else 1)
    side = math.isqrt(positions)
    if side * side != positions:
        raise InferenceError(f"pos_embed holds {positions} patch positions, not a square grid; pass --img-size")
    hidden = state_dict["blocks.0.mlp.fc1.weight"].shape[0]
    config = ViTConfig(img_size=overrides.get("img_size") or side * patch, patch_size=patch,
                       num_classes=overrides.get("num_classes") or state_dict["head.weight"].shape[0],
                       embed_dim=dim, depth=depth, num_heads=heads, mlp_ratio=hidden / dim,
                       qkv_bias="blocks.0.attn.qkv.bias" in state_dict, distilled=distilled,
                       drop_path_rate=overrides.get("drop_path_rate") or 0.0, rpe=rpe)
    _ = config.grid
    return config


def _heads(state_dict: dict[str, torch.Tensor], dim: int, head_dim: int | None, rpe: RPEConfig) -> int:
    if rpe.on and not rpe.shared:
        key = next(key for key in state_dict if key.startswith("blocks.0.attn.rpe_"))
        return state_dict[key].shape[0]
    if head_dim:
        return dim // head_dim
    if dim in _HEADS_BY_DIM:
        return _HEADS_BY_DIM[dim]
    raise InferenceError(f"cannot infer num_heads for embed dim {dim}; pass --model NAME")
