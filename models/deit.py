"""DeiT (data-efficient image transformer) with iRPE in every attention layer."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from .rpe import RPEConfig, build_rpe


@dataclass(frozen=True)
class ViTConfig:
    """Architecture hyper-parameters; preprocessing and labels live in model.json, not here."""

    img_size: int = 224
    patch_size: int = 16
    in_chans: int = 3
    num_classes: int = 1000
    embed_dim: int = 384
    depth: int = 12
    num_heads: int = 6
    mlp_ratio: float = 4.0
    qkv_bias: bool = True
    distilled: bool = False
    drop_path_rate: float = 0.0
    layer_norm_eps: float = 1e-6
    rpe: RPEConfig = field(default_factory=lambda: RPEConfig(on=""))

    @property
    def grid(self) -> tuple[int, int]:
        if self.img_size % self.patch_size:
            raise ValueError(f"img_size {self.img_size} is not divisible by patch_size {self.patch_size}")
        side = self.img_size // self.patch_size
        return side, side

    @property
    def num_prefix_tokens(self) -> int:
        return 2 if self.distilled else 1


class DropPath(nn.Module):
    """Stochastic depth per sample."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.p == 0.0 or not self.training:
            return x
        keep = 1.0 - self.p
        mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)
        return x * mask / keep


class Attention(nn.Module):
    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        dim, heads = cfg.embed_dim, cfg.num_heads
        self.num_heads, self.head_dim = heads, dim // heads
        self.scale = self.head_dim ** -0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=cfg.qkv_bias)
        self.proj = nn.Linear(dim, dim)
        rpe_args = (heads, self.head_dim, cfg.grid, cfg.num_prefix_tokens)
        self.rpe_q = build_rpe(cfg.rpe, "q", *rpe_args)
        self.rpe_k = build_rpe(cfg.rpe, "k", *rpe_args)
        self.rpe_v = build_rpe(cfg.rpe, "v", *rpe_args)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0] * self.scale, qkv[1], qkv[2]
        attn = q @ k.transpose(-2, -1)
        if self.rpe_k is not None:
            attn = attn + self.rpe_k(q)
        if self.rpe_q is not None:
            attn = attn + self.rpe_q(k * self.scale).transpose(2, 3)
        attn = attn.softmax(dim=-1)
        out = attn @ v
        if self.rpe_v is not None:
            out = out + self.rpe_v(attn)
        return self.proj(out.transpose(1, 2).reshape(b, n, c))


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, cfg: ViTConfig, drop_path: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.embed_dim, eps=cfg.layer_norm_eps)
        self.attn = Attention(cfg)
        self.drop_path = DropPath(drop_path)
        self.norm2 = nn.LayerNorm(cfg.embed_dim, eps=cfg.layer_norm_eps)
        self.mlp = Mlp(cfg.embed_dim, int(cfg.embed_dim * cfg.mlp_ratio))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path(self.attn(self.norm1(x)))
        return x + self.drop_path(self.mlp(self.norm2(x)))


class PatchEmbed(nn.Module):
    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.proj = nn.Conv2d(cfg.in_chans, cfg.embed_dim, cfg.patch_size, cfg.patch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)


class VisionTransformer(nn.Module):
    """DeiT / iRPE-DeiT with official state-dict key names; eval-mode distilled output is the heads' mean."""

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        h, w = cfg.grid
        dim = cfg.embed_dim
        self.patch_embed = PatchEmbed(cfg)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.dist_token = nn.Parameter(torch.zeros(1, 1, dim)) if cfg.distilled else None
        self.pos_embed = nn.Parameter(torch.zeros(1, cfg.num_prefix_tokens + h * w, dim))
        rates = torch.linspace(0, cfg.drop_path_rate, cfg.depth).tolist()
        self.blocks = nn.ModuleList(Block(cfg, r) for r in rates)
        self.norm = nn.LayerNorm(dim, eps=cfg.layer_norm_eps)
        self.head = nn.Linear(dim, cfg.num_classes)
        self.head_dist = nn.Linear(dim, cfg.num_classes) if cfg.distilled else None
        self._init_weights()

    def _init_weights(self) -> None:
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        if self.dist_token is not None:
            nn.init.trunc_normal_(self.dist_token, std=0.02)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x)
        prefix = [self.cls_token.expand(x.shape[0], -1, -1)]
        if self.dist_token is not None:
            prefix.append(self.dist_token.expand(x.shape[0], -1, -1))
        x = torch.cat(prefix + [x], dim=1) + self.pos_embed
        for blk in self.blocks:
            x = blk(x)
        return self.norm(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        x = self.forward_features(x)
        logits = self.head(x[:, 0])
        if self.head_dist is None:
            return logits
        logits_dist = self.head_dist(x[:, 1])
        if self.training:
            return logits, logits_dist
        return (logits + logits_dist) / 2
