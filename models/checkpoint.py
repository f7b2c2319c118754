"""Load iRPE / DeiT checkpoints safely: official format, bare state dicts, timm DeiT.

Checkpoints are untrusted: they are read with ``torch.load(weights_only=True)`` and only plain
containers, tensors and ``argparse.Namespace`` are allowed; anything else is refused unexecuted.
"""

from __future__ import annotations

import argparse
import math
import pickle
import re
import zipfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .deit import VisionTransformer, ViTConfig
from .infer import infer_config
from .registry import get_config, list_models


class CheckpointError(ValueError):
    """A checkpoint that cannot be read, is refused, or does not fit the requested model."""


@dataclass
class CheckpointInfo:
    """What a checkpoint says besides its weights."""

    path: str
    name: str
    config: ViTConfig
    class_names: list[str] | None = None
    epoch: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """torch.load with weights_only=True; returns a dict with at least ``model`` (a state dict)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        detail = _unpickler_detail(str(e))
        if "global" not in detail.lower():
            raise CheckpointError(f"{path}: not a readable PyTorch checkpoint (corrupt or truncated?): "
                                  f"{detail}") from None
        raise CheckpointError(
            f"{path}: refused: the file holds pickled objects other than tensors, plain containers "
            f"and argparse.Namespace, which could run code when loaded ({detail}). Nothing in it was "
            "executed. Re-save only the state dict: torch.save({'model': model.state_dict()}, path)"
        ) from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError) as e:
        raise CheckpointError(f"{path}: not a readable PyTorch checkpoint (corrupt or truncated?): "
                              f"{str(e).splitlines()[0][:200] if str(e) else type(e).__name__}") from None
    return _normalize(obj, path)


def _unpickler_detail(message: str) -> str:
    """The one informative line of torch's weights-only error ("Unsupported global: ...")."""
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    for ln in lines:
        if ln.startswith(("Unsupported", "Trying to", "GLOBAL")) or "global" in ln.lower() and "allowed" in ln:
            return ln[:200]
    return (lines[-1] if lines else "unreadable pickle")[:200]


def _normalize(obj: Any, path: Path) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path}: expected a dict (state dict or {{'model': ...}}), found {type(obj).__name__}")
    for key in ("model", "state_dict", "model_ema"):
        if isinstance(obj.get(key), dict):
            out = dict(obj)
            out["model"] = obj[key]
            break
    else:
        out = {"model": obj}
    sd = {k.removeprefix("module."): v for k, v in out["model"].items()}
    bad = [k for k, v in sd.items() if not isinstance(v, torch.Tensor)]
    if bad or not sd:
        raise CheckpointError(f"{path}: the state dict is empty or holds non-tensor entries {bad[:5]}")
    out["model"] = sd
    return out


def _stored_name(ckpt: dict[str, Any]) -> str | None:
    args = ckpt.get("args")
    name = getattr(args, "model", None) if not isinstance(args, dict) else args.get("model")
    return name if isinstance(name, str) and name in list_models() else None


def _stored_overrides(ckpt: dict[str, Any]) -> dict[str, Any]:
    """create_model overrides a training run recorded in ``args.overrides`` (plain values only)."""
    args = ckpt.get("args")
    stored = getattr(args, "overrides", None) if not isinstance(args, dict) else args.get("overrides")
    if not isinstance(stored, dict):
        return {}
    return {k: v for k, v in stored.items() if isinstance(v, (int, float, str, bool))}


def resize_pos_embed(pos: torch.Tensor, prefix: int, new_grid: tuple[int, int]) -> torch.Tensor:
    """Bicubic resize of the patch part of a (1, prefix + h*w, D) position embedding."""
    old = pos.shape[1] - prefix
    side = int(math.isqrt(old))
    if side * side != old:
        raise CheckpointError(f"pos_embed has {old} patch positions, not a square grid")
    grid = pos[:, prefix:].reshape(1, side, side, -1).permute(0, 3, 1, 2)
    grid = F.interpolate(grid, size=new_grid, mode="bicubic", align_corners=False)
    return torch.cat([pos[:, :prefix], grid.permute(0, 2, 3, 1).reshape(1, -1, pos.shape[-1])], dim=1)


def _check_keys(model: nn.Module, sd: dict[str, torch.Tensor], path: Path, name: str) -> None:
    want = model.state_dict()
    missing = sorted(set(want) - set(sd))
    unexpected = sorted(set(sd) - set(want))
    conflicts = [f"{k}: checkpoint {tuple(sd[k].shape)} vs model {tuple(want[k].shape)}"
                 for k in want if k in sd and sd[k].shape != want[k].shape]
    if missing or unexpected or conflicts:
        parts = [f"missing keys {missing[:10]}" if missing else "",
                 f"unexpected keys {unexpected[:10]}" if unexpected else "",
                 f"shape conflicts {conflicts[:10]}" if conflicts else ""]
        raise CheckpointError(f"{path}: does not fit model {name!r}: " + "; ".join(p for p in parts if p)
                              + ". Pass the right --model/overrides, or omit --model to infer it")


MAX_DEPTH = 1000
_BLOCK = re.compile(r"(?:^|\.)blocks\.(\d+)\.")


def check_block_indices(sd: dict[str, torch.Tensor], path: Path, depth: int | None = None) -> None:
    """Refuse block indices that are not 0..n-1 (n <= MAX_DEPTH, and n == ``depth`` when given) before
    any model is built: a key like ``blocks.99999999.x`` would otherwise build 100 million blocks."""
    found = {int(m.group(1)) for k in sd if (m := _BLOCK.search(k))}
    if not found:
        return
    n = max(found) + 1
    if n > MAX_DEPTH or len(found) != n or (depth is not None and n != depth):
        gaps = sorted(set(range(min(n, MAX_DEPTH))) - found)[:5]
        want = f"the model's {depth}" if depth is not None else f"0..n-1 with n <= {MAX_DEPTH}"
        raise CheckpointError(f"{path}: block indices go up to {n - 1} over {len(found)} distinct block(s)"
                              f"{f' (missing {gaps})' if gaps else ''}; expected {want}. The checkpoint is "
                              "corrupt or not an iRPE/DeiT state dict")


def load_checkpoint_with_info(path: str | Path, name: str | None = None,
                              **overrides: Any) -> tuple[nn.Module, CheckpointInfo]:
    """Build the model a checkpoint describes, load its weights strictly, return it in eval mode."""
    path = Path(path)
    ckpt = read_checkpoint(path)
    sd = ckpt["model"]
    stored = _stored_name(ckpt)
    if stored is not None and name in (None, stored):  # the run's recorded overrides; explicit ones win
        name, overrides = stored, {**_stored_overrides(ckpt), **overrides}
    check_block_indices(sd, path)
    if name is not None:
        cfg = get_config(name, **overrides)
    else:
        cfg = infer_config(sd, **overrides)
        name = _registered_name(cfg) or "custom"
    model = VisionTransformer(cfg)
    if "pos_embed" in sd and sd["pos_embed"].shape != model.pos_embed.shape:
        old_n = sd["pos_embed"].shape[1] - cfg.num_prefix_tokens
        if math.isqrt(old_n) ** 2 == old_n and old_n != cfg.grid[0] * cfg.grid[1]:
            sd = dict(sd, pos_embed=resize_pos_embed(sd["pos_embed"], cfg.num_prefix_tokens, cfg.grid))
    _check_keys(model, sd, path, name)
    model.load_state_dict(sd, strict=True)
    model.eval()
    names = ckpt.get("class_names")
    info = CheckpointInfo(path=str(path), name=name, config=cfg,
                          class_names=list(names) if isinstance(names, (list, tuple)) else None,
                          epoch=ckpt.get("epoch") if isinstance(ckpt.get("epoch"), int) else None)
    return model, info


def load_checkpoint(path: str | Path, name: str | None = None, **overrides: Any) -> nn.Module:
    """Model in eval mode from a checkpoint; ``name`` defaults to ``args.model`` or is inferred."""
    return load_checkpoint_with_info(path, name, **overrides)[0]


def _registered_name(cfg: ViTConfig) -> str | None:
    for n in list_models():
        reg = get_config(n)
        if replace(reg, drop_path_rate=0.0) == replace(cfg, drop_path_rate=0.0):
            return n
    return None
