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
    """Read a checkpoint file without running any code in it.

    Args:
        path: a ``torch.save`` file: ``{"model": state_dict, ...}`` (also under ``state_dict`` or
            ``model_ema``), or a bare state dict.

    Returns:
        The checkpoint's dict with ``model`` set to its state dict (a ``module.`` prefix removed); the
        other entries (``args``, ``epoch``, ``class_names``...) as stored.

    Raises:
        CheckpointError: no such file, an unreadable or corrupt file, pickled objects other than tensors,
            plain containers and ``argparse.Namespace`` (refused unexecuted), or an empty or non-tensor
            state dict.
    """
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
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    for line in lines:
        if line.startswith(("Unsupported", "Trying to", "GLOBAL")) or ("global" in line.lower() and "allowed" in line):
            return line[:200]
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
    state_dict = {key.removeprefix("module."): value for key, value in out["model"].items()}
    bad = [key for key, value in state_dict.items() if not isinstance(value, torch.Tensor)]
    if bad or not state_dict:
        raise CheckpointError(f"{path}: the state dict is empty or holds non-tensor entries {bad[:5]}")
    out["model"] = state_dict
    return out


def _stored_name(checkpoint: dict[str, Any]) -> str | None:
    args = checkpoint.get("args")
    name = getattr(args, "model", None) if not isinstance(args, dict) else args.get("model")
    return name if isinstance(name, str) and name in list_models() else None


def _stored_overrides(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """create_model overrides a training run recorded in ``args.overrides`` (plain values only)."""
    args = checkpoint.get("args")
    stored = getattr(args, "overrides", None) if not isinstance(args, dict) else args.get("overrides")
    if not isinstance(stored, dict):
        return {}
    return {key: value for key, value in stored.items() if isinstance(value, (int, float, str, bool))}


def resize_pos_embed(pos: torch.Tensor, prefix: int, new_grid: tuple[int, int]) -> torch.Tensor:
    """Bicubic resize of the patch part of a (1, prefix + h*w, D) position embedding."""
    old = pos.shape[1] - prefix
    side = int(math.isqrt(old))
    if side * side != old:
        raise CheckpointError(f"pos_embed has {old} patch positions, not a square grid")
    grid = pos[:, prefix:].reshape(1, side, side, -1).permute(0, 3, 1, 2)
    grid = F.interpolate(grid, size=new_grid, mode="bicubic", align_corners=False)
    return torch.cat([pos[:, :prefix], grid.permute(0, 2, 3, 1).reshape(1, -1, pos.shape[-1])], dim=1)


def _check_keys(model: nn.Module, state_dict: dict[str, torch.Tensor], path: Path, name: str) -> None:
    want = model.state_dict()
    missing = sorted(set(want) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(want))
    conflicts = [f"{key}: checkpoint {tuple(state_dict[key].shape)} vs model {tuple(want[key].shape)}"
                 for key in want if key in state_dict and state_dict[key].shape != want[key].shape]
    if missing or unexpected or conflicts:
        parts = [f"missing keys {missing[:10]}" if missing else "",
                 f"unexpected keys {unexpected[:10]}" if unexpected else "",
                 f"shape conflicts {conflicts[:10]}" if conflicts else ""]
        raise CheckpointError(f"{path}: does not fit model {name!r}: " + "; ".join(part for part in parts if part)
                              + ". Pass the right --model/overrides, or omit --model to infer it")


MAX_DEPTH = 1000
_BLOCK = re.compile(r"(?:^|\.)blocks\.(\d+)\.")


def check_block_indices(state_dict: dict[str, torch.Tensor], path: Path, depth: int | None = None) -> None:
    """Refuse block indices that are not 0..n-1 (n <= MAX_DEPTH, and n == ``depth`` when given) before
    any model is built: a key like ``blocks.99999999.x`` would otherwise build 100 million blocks."""
    found = {int(match.group(1)) for key in state_dict if (match := _BLOCK.search(key))}
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
    """Build the model a checkpoint describes and load its weights strictly.

    Args:
        path: the checkpoint file (see :func:`read_checkpoint`).
        name: the registered variant; by default the one the training run recorded (``args.model``, with
            its ``args.overrides``), else inferred from the state dict's keys and shapes.
        **overrides: create_model keywords (see :func:`get_config`); they win over recorded ones.

    Returns:
        ``(model, info)``: the model in eval mode (a square ``pos_embed`` of another grid resized bicubically)
        and what the checkpoint says besides its weights.

    Raises:
        CheckpointError: the file is refused or unreadable, or its keys or shapes do not fit the model.
        InferenceError: no name was given or recorded and the state dict does not say enough.
        ValueError: ``name`` or an override is unknown or invalid.
    """
    path = Path(path)
    checkpoint = read_checkpoint(path)
    state_dict = checkpoint["model"]
    stored = _stored_name(checkpoint)
    if stored is not None and name in (None, stored):  # the run's recorded overrides; explicit ones win
        name, overrides = stored, {**_stored_overrides(checkpoint), **overrides}
    check_block_indices(state_dict, path)
    if name is not None:
        config = get_config(name, **overrides)
    else:
        config = infer_config(state_dict, **overrides)
        name = _registered_name(config) or "custom"
    model = VisionTransformer(config)
    state_dict = _fit_pos_embed(state_dict, model.pos_embed.shape, config)
    _check_keys(model, state_dict, path, name)
    model.load_state_dict(state_dict, strict=True)
    model.eval()
    return model, _info(checkpoint, path, name, config)


def _fit_pos_embed(state_dict: dict[str, torch.Tensor], want: torch.Size,
                   config: ViTConfig) -> dict[str, torch.Tensor]:
    """``state_dict`` with a square ``pos_embed`` of another grid resized to ``config.grid``."""
    if "pos_embed" not in state_dict or state_dict["pos_embed"].shape == want:
        return state_dict
    old_positions = state_dict["pos_embed"].shape[1] - config.num_prefix_tokens
    rows, cols = config.grid
    if math.isqrt(old_positions) ** 2 != old_positions or old_positions == rows * cols:
        return state_dict  # not a square grid, or no resize helps: _check_keys names the mismatch
    resized = resize_pos_embed(state_dict["pos_embed"], config.num_prefix_tokens, config.grid)
    return dict(state_dict, pos_embed=resized)


def _info(checkpoint: dict[str, Any], path: Path, name: str, config: ViTConfig) -> CheckpointInfo:
    names, epoch = checkpoint.get("class_names"), checkpoint.get("epoch")
    return CheckpointInfo(path=str(path), name=name, config=config,
                          class_names=list(names) if isinstance(names, (list, tuple)) else None,
                          epoch=epoch if isinstance(epoch, int) else None)


def load_checkpoint(path: str | Path, name: str | None = None, **overrides: Any) -> nn.Module:
    """The model of a checkpoint, without the rest of :func:`load_checkpoint_with_info`.

    Args:
        path: the checkpoint file.
        name: the registered variant; by default ``args.model`` or inferred.
        **overrides: create_model keywords.

    Returns:
        The model in eval mode with the checkpoint's weights.

    Raises:
        CheckpointError, InferenceError, ValueError: as :func:`load_checkpoint_with_info`.
    """
    return load_checkpoint_with_info(path, name, **overrides)[0]


def _registered_name(config: ViTConfig) -> str | None:
    for name in list_models():
        registered = get_config(name)
        if replace(registered, drop_path_rate=0.0) == replace(config, drop_path_rate=0.0):
            return name
    return None
