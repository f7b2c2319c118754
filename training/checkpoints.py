"""Checkpoints in the official iRPE/DeiT format, loadable with ``torch.load(weights_only=True)``.

``{'model', 'optimizer', 'lr_scheduler', 'epoch', 'args': Namespace(model=NAME, ...), 'class_names',
'preprocess'}``; ``args.overrides`` keeps the create_model overrides the run used.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .config import Dist, TrainConfig
from .data import DataBundle
from .recipe import WarmupCosine

CHECKPOINT_NAME = "checkpoint.pth"


def unwrap(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def checkpoint_args(cfg: TrainConfig, dist: Dist, lr: float) -> argparse.Namespace:
    """The ``args`` entry: ``model`` first, then the run's hyper-parameters (plain values only)."""
    d = {k: v for k, v in asdict(cfg).items() if k not in ("progress", "resume", "stop_after")}
    return argparse.Namespace(**d, scaled_lr=lr, world_size=dist.world, irpe_format=1)


def save_checkpoint(path: Path, model: nn.Module, opt: torch.optim.Optimizer, sched: WarmupCosine,
                    epoch: int, args: argparse.Namespace, data: DataBundle) -> None:
    """Atomically write the official-format dict (loadable with weights_only=True)."""
    pp = asdict(data.preprocess)
    pp["mean"], pp["std"] = [float(v) for v in pp["mean"]], [float(v) for v in pp["std"]]
    ckpt = {"model": unwrap(model).state_dict(), "optimizer": opt.state_dict(),
            "lr_scheduler": sched.state_dict(), "epoch": epoch, "args": args,
            "class_names": list(data.class_names), "preprocess": pp}
    tmp = path.with_name(path.name + ".tmp")
    torch.save(ckpt, tmp)
    os.replace(tmp, path)


def load_resume(ckpt: dict[str, Any], cfg: TrainConfig, model: nn.Module, opt: torch.optim.Optimizer,
                sched: WarmupCosine) -> int:
    """Restore model/optimizer/schedule from a :func:`read_checkpoint` dict; returns the next epoch."""
    path = cfg.resume
    stored = getattr(ckpt.get("args"), "model", None)
    if stored is not None and stored != cfg.model:
        raise ValueError(f"{path}: was trained as {stored!r}, not {cfg.model!r}; pass --model {stored}")
    missing = [k for k in ("optimizer", "lr_scheduler", "epoch") if k not in ckpt]
    if missing:
        raise ValueError(f"{path}: lacks {missing}, so it cannot be resumed (a weights-only file?); "
                         "start a new run instead")
    try:
        unwrap(model).load_state_dict(ckpt["model"], strict=True)
    except RuntimeError as e:
        raise ValueError(f"{path}: weights do not fit {cfg.model} with overrides {cfg.overrides} "
                         f"({str(e).splitlines()[0][:160]}); pass the run's --model and overrides") from None
    opt.load_state_dict(ckpt["optimizer"])
    total = sched.total_steps
    sched.load_state_dict(ckpt["lr_scheduler"])
    sched.set_total_steps(total)  # a longer --epochs extends the cosine
    return int(ckpt["epoch"]) + 1
