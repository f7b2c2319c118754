"""The paper's optimisation recipe: AdamW parameter groups, linear lr scaling, warm-up + cosine."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

#: Parameters named like this never get weight decay (besides every bias and norm weight).
NO_DECAY_KEYWORDS = ("lookup_table", "cls_token", "dist_token", "pos_embed")
REFERENCE_BATCH = 1024


def no_decay(name: str, param: torch.Tensor) -> bool:
    """True for RPE tables, tokens, pos_embed, biases and norm weights (1-d parameters)."""
    return param.ndim <= 1 or name.endswith(".bias") or any(k in name for k in NO_DECAY_KEYWORDS)


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Two AdamW groups: decayed weights and the no-decay set (see :func:`no_decay`)."""
    decay, plain = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (plain if no_decay(name, p) else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": plain, "weight_decay": 0.0}]


def scaled_lr(base_lr: float, batch_size: int, world_size: int = 1) -> float:
    """Linear scaling rule: ``base_lr`` is the rate for a total batch of 1024."""
    return base_lr * batch_size * world_size / REFERENCE_BATCH


def build_optimizer(model: nn.Module, lr: float, weight_decay: float = 0.05) -> torch.optim.AdamW:
    """AdamW over :func:`param_groups` at learning rate ``lr`` (already scaled)."""
    return torch.optim.AdamW(param_groups(model, weight_decay), lr=lr, betas=(0.9, 0.999), eps=1e-8)


class WarmupCosine:
    """Per-step schedule: linear warm-up from ``warmup_lr`` to ``peak_lr``, then cosine to ``min_lr``.

    Its state is a plain dict of numbers so checkpoints stay loadable with weights_only=True.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, peak_lr: float, total_steps: int,
                 warmup_steps: int, min_lr: float = 1e-5, warmup_lr: float = 1e-6) -> None:
        self.optimizer = optimizer
        self.peak_lr, self.min_lr, self.warmup_lr = peak_lr, min(min_lr, peak_lr), min(warmup_lr, peak_lr)
        self.total_steps, self.warmup_steps = max(1, total_steps), max(0, min(warmup_steps, total_steps))
        self.step_count = 0
        self._apply()

    def lr_at(self, step: int) -> float:
        """The learning rate of optimisation step ``step`` (0-based)."""
        if step < self.warmup_steps:
            return self.warmup_lr + (self.peak_lr - self.warmup_lr) * step / self.warmup_steps
        span = max(1, self.total_steps - self.warmup_steps)
        t = min(1.0, (step - self.warmup_steps) / span)
        return self.min_lr + 0.5 * (self.peak_lr - self.min_lr) * (1.0 + math.cos(math.pi * t))

    def _apply(self) -> None:
        lr = self.lr_at(self.step_count)
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def step(self) -> None:
        """Advance one optimisation step and set the next step's rate."""
        self.step_count += 1
        self._apply()

    def set_total_steps(self, total_steps: int) -> None:
        """Stretch or shrink the cosine (e.g. a resumed run with a new --epochs)."""
        self.total_steps = max(1, total_steps)
        self._apply()

    def get_last_lr(self) -> list[float]:
        return [g["lr"] for g in self.optimizer.param_groups]

    def state_dict(self) -> dict[str, float | int]:
        return {"step_count": self.step_count, "peak_lr": self.peak_lr, "min_lr": self.min_lr,
                "warmup_lr": self.warmup_lr, "total_steps": self.total_steps,
                "warmup_steps": self.warmup_steps}

    def load_state_dict(self, state: dict[str, float | int]) -> None:
        for key in ("peak_lr", "min_lr", "warmup_lr"):
            setattr(self, key, float(state[key]))
        for key in ("step_count", "total_steps", "warmup_steps"):
            setattr(self, key, int(state[key]))
        self._apply()
