"""DeiT (data-efficient image transformer) with iRPE in every attention layer.

Shapes: B images, N tokens (prefix + grid), C embedding width, H heads, D head dim (C = H * D).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from .rpe import RPEConfig, build_rpe


@dataclass(frozen=True)
class ViTConfig:
    """Architecture hyper-parameters; preprocessing and labels live in model.json, not here.

    ``rpe`` says where and how relative position is encoded (:class:`RPEConfig`; ``on=""``: plain DeiT).
    """

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
        """Patch rows and columns; ValueError when ``img_size`` is not a multiple of ``patch_size``."""
        if self.img_size % self.patch_size:
            raise ValueError(f"img_size {self.img_size} is not divisible by patch_size {self.patch_size}")
        side = self.img_size // self.patch_size
        return side, side

    @property
    def num_prefix_tokens(self) -> int:
        """Tokens before the patches: the class token, plus the distillation token when distilled."""
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
    """Multi-head self-attention with the iRPE addends of ``config.rpe`` on q, k and v."""

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        dim, heads = config.embed_dim, config.num_heads
        self.num_heads, self.head_dim = heads, dim // heads
        self.scale = self.head_dim ** -0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=config.qkv_bias)
        self.proj = nn.Linear(dim, dim)
        table_shape = dict(num_heads=heads, head_dim=self.head_dim, grid=config.grid, skip=config.num_prefix_tokens)
        self.rpe_q = build_rpe(config.rpe, "q", **table_shape)
        self.rpe_k = build_rpe(config.rpe, "k", **table_shape)
        self.rpe_v = build_rpe(config.rpe, "v", **table_shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, N, C) tokens -> (B, N, C) attended tokens."""
        batch, tokens, width = x.shape
        qkv = self.qkv(x).reshape(batch, tokens, 3, self.num_heads, self.head_dim)  # (B, N, 3, H, D)
        qkv = qkv.permute(2, 0, 3, 1, 4)  # (3, B, H, N, D)
        q, k, v = qkv[0] * self.scale, qkv[1], qkv[2]  # each (B, H, N, D)
        attn = q @ k.transpose(-2, -1)  # (B, H, N, N)
        if self.rpe_k is not None:
            attn = attn + self.rpe_k(q)  # (B, H, N, N): query meets the key-side table
        if self.rpe_q is not None:
            attn = attn + self.rpe_q(k * self.scale).transpose(2, 3)  # (B, H, N, N): key meets the query table
        attn = attn.softmax(dim=-1)  # (B, H, N, N)
        out = attn @ v  # (B, H, N, D)
        if self.rpe_v is not None:
            out = out + self.rpe_v(attn)  # (B, H, N, D)
        out = out.transpose(1, 2).reshape(batch, tokens, width)  # (B, N, C)
        return self.proj(out)


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))  # (B, N, C) -> (B, N, hidden) -> (B, N, C)


class Block(nn.Module):
    """One pre-norm transformer block: attention, then the MLP, each residual."""

    def __init__(self, config: ViTConfig, drop_path: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(config.embed_dim, eps=config.layer_norm_eps)
        self.attn = Attention(config)
        self.drop_path = DropPath(drop_path)
        self.norm2 = nn.LayerNorm(config.embed_dim, eps=config.layer_norm_eps)
        self.mlp = Mlp(config.embed_dim, int(config.embed_dim * config.mlp_ratio))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path(self.attn(self.norm1(x)))  # (B, N, C)
        return x + self.drop_path(self.mlp(self.norm2(x)))  # (B, N, C)


class PatchEmbed(nn.Module):
    """Non-overlapping patches to tokens: one strided convolution."""

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.proj = nn.Conv2d(config.in_chans, config.embed_dim, config.patch_size, config.patch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)  # (B, 3, img, img) -> (B, C, rows, cols) -> (B, rows*cols, C)


class VisionTransformer(nn.Module):
    """DeiT / iRPE-DeiT with official state-dict key names; eval-mode distilled output is the heads' mean."""

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.cfg = config  # read by the exporter as ``model.cfg``
        rows, cols = config.grid
        dim = config.embed_dim
        self.patch_embed = PatchEmbed(config)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.dist_token = nn.Parameter(torch.zeros(1, 1, dim)) if config.distilled else None
        self.pos_embed = nn.Parameter(torch.zeros(1, config.num_prefix_tokens + rows * cols, dim))
        rates = torch.linspace(0, config.drop_path_rate, config.depth).tolist()
        self.blocks = nn.ModuleList(Block(config, rate) for rate in rates)
        self.norm = nn.LayerNorm(dim, eps=config.layer_norm_eps)
        self.head = nn.Linear(dim, config.num_classes)
        self.head_dist = nn.Linear(dim, config.num_classes) if config.distilled else None
        self._init_weights()

    def _init_weights(self) -> None:
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        if self.dist_token is not None:
            nn.init.trunc_normal_(self.dist_token, std=0.02)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.trunc_normal_(module.weight, std=0.02)
                nn.init.zeros_(module.bias)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 3, img, img) images -> (B, N, C) normalized tokens, prefix tokens first."""
        x = self.patch_embed(x)  # (B, rows*cols, C)
        prefix = [self.cls_token.expand(x.shape[0], -1, -1)]  # (B, 1, C) each
        if self.dist_token is not None:
            prefix.append(self.dist_token.expand(x.shape[0], -1, -1))
        x = torch.cat(prefix + [x], dim=1) + self.pos_embed  # (B, N, C)
        for block in self.blocks:
            x = block(x)
        return self.norm(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """(B, 3, img, img) images -> (B, classes) logits; in training a distilled model returns both heads."""
        x = self.forward_features(x)  # (B, N, C)
        logits = self.head(x[:, 0])  # (B, classes)
        if self.head_dist is None:
            return logits
        logits_dist = self.head_dist(x[:, 1])
        if self.training:
            return logits, logits_dist
        return (logits + logits_dist) / 2
