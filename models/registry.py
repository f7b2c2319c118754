"""Variant registry: one line per named model, overridable through :func:`create_model`.

This is the one list of model names: :mod:`.pretrained` takes the variants with released weights from
:func:`released_models`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from torch import nn

from .buckets import RPEMethod
from .deit import VisionTransformer, ViTConfig
from .rpe import RPEConfig, RPETargets

#: size -> (embed_dim, depth, num_heads)
_SIZES = {"micro": (64, 4, 4), "tiny": (192, 12, 3), "small": (384, 12, 6), "base": (768, 12, 12)}
_REGISTRY: dict[str, ViTConfig] = {}
_RELEASED: list[str] = []


def _vit(size: str, rpe: RPEConfig | None = None, distilled: bool = False, **vit_fields: Any) -> ViTConfig:
    embed_dim, depth, num_heads = _SIZES[size]
    return ViTConfig(embed_dim=embed_dim, depth=depth, num_heads=num_heads, distilled=distilled,
                     rpe=rpe or RPEConfig(on=""), **vit_fields)


def register(name: str, config: ViTConfig, released: bool = False) -> None:
    """Add a named variant.

    Args:
        name: the variant's name, unique.
        config: its architecture.
        released: the authors published its weights (``--pretrained`` downloads them).

    Raises:
        ValueError: ``name`` is already registered.
    """
    if name in _REGISTRY:
        raise ValueError(f"model {name!r} is already registered")
    _REGISTRY[name] = config
    if released:
        _RELEASED.append(name)


def _ctx(method: RPEMethod, ratio: float, on: RPETargets) -> RPEConfig:
    return RPEConfig(on=on, method=method, mode="ctx", ratio=ratio, shared=True)


# The nine published iRPE variants (contextual, shared heads, class-token skip); six have released weights.
register("deit_tiny_patch16_224_ctx_product_50_shared_k", _vit("tiny", _ctx("product", 1.9, "k")), released=True)
register("deit_small_patch16_224_ctx_euc_20_shared_k", _vit("small", _ctx("euc", 20, "k")))
register("deit_small_patch16_224_ctx_quant_51_shared_k", _vit("small", _ctx("quant", 33, "k")))
register("deit_small_patch16_224_ctx_cross_56_shared_k", _vit("small", _ctx("cross", 20, "k")))
register("deit_small_patch16_224_ctx_product_50_shared_k", _vit("small", _ctx("product", 1.9, "k")), released=True)
register("deit_small_patch16_224_ctx_product_50_shared_qk", _vit("small", _ctx("product", 1.9, "qk")), released=True)
register("deit_small_patch16_224_ctx_product_50_shared_qkv", _vit("small", _ctx("product", 1.9, "qkv")),
         released=True)
register("deit_base_patch16_224_ctx_product_50_shared_k", _vit("base", _ctx("product", 1.9, "k")), released=True)
register("deit_base_patch16_224_ctx_product_50_shared_qkv", _vit("base", _ctx("product", 1.9, "qkv")), released=True)
# Plain DeiT (no RPE) and the distilled DeiT (class + dist token).
for _size in ("tiny", "small", "base"):
    register(f"deit_{_size}_patch16_224", _vit(_size))
    register(f"deit_{_size}_distilled_patch16_224", _vit(_size, distilled=True))
# A small variant for 32x32 inputs (the embedded digits model).
register("deit_micro_patch4_32_ctx_product_shared_k",
         _vit("micro", _ctx("product", 1.9, "k"), img_size=32, patch_size=4, num_classes=10))

#: create_model keyword -> RPEConfig field
_RPE_OVERRIDES = {"rpe_on": "on", "rpe_method": "method", "rpe_mode": "mode", "rpe_ratio": "ratio",
                  "rpe_shared": "shared"}
_VIT_OVERRIDES = {"img_size", "num_classes", "drop_path_rate", "patch_size", "in_chans"}


def list_models() -> list[str]:
    """Every registered variant.

    Returns:
        The names :func:`create_model` accepts, sorted.
    """
    return sorted(_REGISTRY)


def released_models() -> list[str]:
    """The variants whose weights the authors published.

    Returns:
        Their names in registration order (the names ``--pretrained`` accepts).
    """
    return list(_RELEASED)


def get_config(name: str, **overrides: Any) -> ViTConfig:
    """The architecture of a registered variant, with overrides applied.

    Args:
        name: a name from :func:`list_models`.
        **overrides: ``img_size``, ``num_classes``, ``drop_path_rate``, ``patch_size``, ``in_chans``, and
            ``rpe_on``, ``rpe_method``, ``rpe_mode``, ``rpe_ratio``, ``rpe_shared`` for the RPE; a None value
            keeps the variant's own.

    Returns:
        The variant's :class:`ViTConfig` with the overrides (``rpe_on`` in canonical q, k, v order).

    Raises:
        ValueError: ``name`` is not registered (close matches named), an override is unknown, an RPE value is
            invalid, or ``img_size`` is not a multiple of ``patch_size``.
    """
    if name not in _REGISTRY:
        close = [known for known in _REGISTRY if name.split("_patch")[0] in known][:5]
        hint = f"; close matches: {close}" if close else ""
        raise ValueError(f"unknown model {name!r}{hint}; run `irpe models` for the list")
    unknown = set(overrides) - set(_RPE_OVERRIDES) - _VIT_OVERRIDES
    if unknown:
        raise ValueError(f"unknown override(s) {sorted(unknown)}; allowed: "
                         f"{sorted(set(_RPE_OVERRIDES) | _VIT_OVERRIDES)}")
    config = _REGISTRY[name]
    rpe_fields = {_RPE_OVERRIDES[key]: value for key, value in overrides.items()
                  if key in _RPE_OVERRIDES and value is not None}
    vit_fields = {key: value for key, value in overrides.items() if key in _VIT_OVERRIDES and value is not None}
    rpe = replace(config.rpe, **rpe_fields).normalized() if rpe_fields else config.rpe
    config = replace(config, rpe=rpe, **vit_fields)
    _ = config.grid  # validates img_size against patch_size
    return config


def create_model(name: str, **overrides: Any) -> nn.Module:
    """Build a registered variant with random weights (RPE tables zero).

    Args:
        name: a name from :func:`list_models`.
        **overrides: as :func:`get_config`.

    Returns:
        A :class:`VisionTransformer` in training mode.

    Raises:
        ValueError: as :func:`get_config`.
    """
    return VisionTransformer(get_config(name, **overrides))
