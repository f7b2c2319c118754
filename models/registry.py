"""Variant registry: one line per named model, overridable through :func:`create_model`."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from torch import nn

from .deit import VisionTransformer, ViTConfig
from .rpe import RPEConfig

_SIZES = {"micro": (64, 4, 4), "tiny": (192, 12, 3), "small": (384, 12, 6), "base": (768, 12, 12)}
_REGISTRY: dict[str, ViTConfig] = {}


def _vit(size: str, rpe: RPEConfig | None = None, distilled: bool = False, **kw: Any) -> ViTConfig:
    dim, depth, heads = _SIZES[size]
    return ViTConfig(embed_dim=dim, depth=depth, num_heads=heads, distilled=distilled,
                     rpe=rpe or RPEConfig(on=""), **kw)


def register(name: str, cfg: ViTConfig) -> None:
    """Add a named variant (names are unique)."""
    if name in _REGISTRY:
        raise ValueError(f"model {name!r} is already registered")
    _REGISTRY[name] = cfg


def _ctx(method: str, ratio: float, on: str) -> RPEConfig:
    return RPEConfig(on=on, method=method, mode="ctx", ratio=ratio, shared=True)


# The nine published iRPE variants (contextual, shared heads, class-token skip).
register("deit_tiny_patch16_224_ctx_product_50_shared_k", _vit("tiny", _ctx("product", 1.9, "k")))
register("deit_small_patch16_224_ctx_euc_20_shared_k", _vit("small", _ctx("euc", 20, "k")))
register("deit_small_patch16_224_ctx_quant_51_shared_k", _vit("small", _ctx("quant", 33, "k")))
register("deit_small_patch16_224_ctx_cross_56_shared_k", _vit("small", _ctx("cross", 20, "k")))
register("deit_small_patch16_224_ctx_product_50_shared_k", _vit("small", _ctx("product", 1.9, "k")))
register("deit_small_patch16_224_ctx_product_50_shared_qk", _vit("small", _ctx("product", 1.9, "qk")))
register("deit_small_patch16_224_ctx_product_50_shared_qkv", _vit("small", _ctx("product", 1.9, "qkv")))
register("deit_base_patch16_224_ctx_product_50_shared_k", _vit("base", _ctx("product", 1.9, "k")))
register("deit_base_patch16_224_ctx_product_50_shared_qkv", _vit("base", _ctx("product", 1.9, "qkv")))
# Plain DeiT (no RPE) and the distilled DeiT (class + dist token).
for _size in ("tiny", "small", "base"):
    register(f"deit_{_size}_patch16_224", _vit(_size))
    register(f"deit_{_size}_distilled_patch16_224", _vit(_size, distilled=True))
# A small variant for 32x32 inputs (the embedded digits model).
register("deit_micro_patch4_32_ctx_product_shared_k",
         _vit("micro", _ctx("product", 1.9, "k"), img_size=32, patch_size=4, num_classes=10))

_RPE_OVERRIDES = {"rpe_on": "on", "rpe_method": "method", "rpe_mode": "mode", "rpe_ratio": "ratio",
                  "rpe_shared": "shared"}
_VIT_OVERRIDES = {"img_size", "num_classes", "drop_path_rate", "patch_size", "in_chans"}


def list_models() -> list[str]:
    """Names of every registered variant, sorted."""
    return sorted(_REGISTRY)


def get_config(name: str, **overrides: Any) -> ViTConfig:
    """The architecture of ``name`` with ``overrides`` (create_model's keywords) applied."""
    if name not in _REGISTRY:
        close = [n for n in _REGISTRY if name.split("_patch")[0] in n][:5]
        hint = f"; close matches: {close}" if close else ""
        raise ValueError(f"unknown model {name!r}{hint}; run `irpe models` for the list")
    unknown = set(overrides) - set(_RPE_OVERRIDES) - _VIT_OVERRIDES
    if unknown:
        raise ValueError(f"unknown override(s) {sorted(unknown)}; allowed: "
                         f"{sorted(set(_RPE_OVERRIDES) | _VIT_OVERRIDES)}")
    cfg = _REGISTRY[name]
    rpe_kw = {_RPE_OVERRIDES[k]: v for k, v in overrides.items() if k in _RPE_OVERRIDES and v is not None}
    vit_kw = {k: v for k, v in overrides.items() if k in _VIT_OVERRIDES and v is not None}
    rpe = replace(cfg.rpe, **rpe_kw).normalized() if rpe_kw else cfg.rpe
    cfg = replace(cfg, rpe=rpe, **vit_kw)
    _ = cfg.grid  # validates img_size against patch_size
    return cfg


def create_model(name: str, **overrides: Any) -> nn.Module:
    """Build a registered variant (random init, RPE tables zero) with overrides applied."""
    return VisionTransformer(get_config(name, **overrides))
