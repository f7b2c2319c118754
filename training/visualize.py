"""PNG figures: bucket maps of every method (paper supp. Fig. 6-9) and learned RPE per layer (Fig. 5)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from matplotlib.colors import ListedColormap  # noqa: E402
from torch import nn  # noqa: E402

from irpe.models.buckets import TABLE_METHODS, bucket_ids  # noqa: E402

DPI = 100


def distinct_colors(n: int) -> np.ndarray:
    """``n`` pairwise-distinct uint8 RGB colours, neighbours far apart (a stride through an RGB lattice)."""
    k = max(2, math.ceil(n ** (1 / 3)))
    levels = np.linspace(30, 255, k).round().astype(np.uint8)
    lattice = np.array(np.meshgrid(levels, levels, levels, indexing="ij")).reshape(3, -1).T
    size = len(lattice)
    step = next(s for s in range(int(size * 0.618), 0, -1) if math.gcd(s, size) == 1)
    return lattice[(np.arange(n) * step) % size]


def bucket_map(method: str, ratio: float, grid: tuple[int, int], ref: tuple[int, int]) -> np.ndarray:
    """(H, W) bucket ids of every key patch relative to the query patch ``ref`` (no skip tokens)."""
    h, w = grid
    table = bucket_ids(method, ratio, h, w, 0)
    return np.asarray(table[ref[0] * w + ref[1]]).reshape(h, w)


def discrete(map_: np.ndarray) -> tuple[np.ndarray, np.ndarray, ListedColormap]:
    """(rank image, the bucket id of each rank, a colormap with one distinct colour per bucket)."""
    ids, ranks = np.unique(map_, return_inverse=True)
    return ranks.reshape(map_.shape), ids, ListedColormap(distinct_colors(len(ids)) / 255.0)


def save_raw_bucket_map(map_: np.ndarray, path: str | Path, scale: int = 16) -> Path:
    """The map as a pixel-exact PNG: ``scale`` x ``scale`` pixels per patch, one colour per bucket."""
    ranks, ids, cmap = discrete(map_)
    img = np.kron(ranks, np.ones((scale, scale), dtype=ranks.dtype))
    plt.imsave(path, img, cmap=cmap, vmin=-0.5, vmax=len(ids) - 0.5)
    return Path(path)


def reference_points(grid: tuple[int, int]) -> list[tuple[int, int]]:
    """Top-left and centre patches (as in the paper's supplementary figures)."""
    return [(0, 0), (grid[0] // 2, grid[1] // 2)]


def plot_bucket_maps(out_dir: str | Path, grid: tuple[int, int] = (14, 14), ratio: float = 1.9,
                     methods: tuple[str, ...] = TABLE_METHODS, scale: int = 16) -> list[Path]:
    """``bucket_maps.png`` (methods x references, colour bar of bucket ids) plus one raw map per panel."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    refs = reference_points(grid)
    fig, axes = plt.subplots(len(methods), len(refs), figsize=(4.0 * len(refs), 3.4 * len(methods)),
                             dpi=DPI, squeeze=False)
    files = []
    for row, method in enumerate(methods):
        for col, ref in enumerate(refs):
            m = bucket_map(method, ratio, grid, ref)
            files.append(save_raw_bucket_map(m, out / f"buckets_{method}_r{ref[0]}c{ref[1]}.png", scale))
            _bucket_panel(fig, axes[row][col], m, f"{method}, ratio {ratio:g}, ref {ref}", ref)
    fig.tight_layout()
    path = out / "bucket_maps.png"
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return [path, *files]


def _bucket_panel(fig: Any, ax: Any, m: np.ndarray, title: str, ref: tuple[int, int]) -> None:
    ranks, ids, cmap = discrete(m)
    im = ax.imshow(ranks, cmap=cmap, vmin=-0.5, vmax=len(ids) - 0.5, interpolation="nearest")
    ax.plot(ref[1], ref[0], marker="x", color="white", markersize=9, mew=3.5)
    ax.plot(ref[1], ref[0], marker="x", color="black", markersize=9, mew=1.5)
    ax.set_title(title, fontsize=9)
    ax.set_xticks([])
    ax.set_yticks([])
    ticks = np.arange(len(ids))[:: max(1, len(ids) // 10)]
    bar = fig.colorbar(im, ax=ax, ticks=ticks, fraction=0.046, pad=0.04)
    bar.ax.set_yticklabels([str(ids[t]) for t in ticks], fontsize=7)
    bar.set_label("bucket id", fontsize=8)


def attention_rpe(model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """Per layer, the (n, n) relative position addend of the attention logits, mean over batch and heads.

    Contextual mode depends on the input (rpe_k(q) + rpe_q(k)^T); bias mode is the gathered table.
    """
    found: dict[int, list[torch.Tensor]] = {}
    hooks = []
    for i, blk in enumerate(model.blocks):
        for name, transpose in (("rpe_k", False), ("rpe_q", True)):
            mod = getattr(blk.attn, name)
            if mod is not None:
                hooks.append(mod.register_forward_hook(_collector(found, i, transpose)))
    if not hooks:
        raise ValueError("the model has no RPE on q or k (nothing is added to attention); "
                         "pick a checkpoint trained with rpe_on containing q or k")
    try:
        with torch.no_grad():
            model.eval()(x)
    finally:
        for h in hooks:
            h.remove()
    return [torch.stack(found[i]).sum(0) for i in sorted(found)]


def _collector(found: dict[int, list[torch.Tensor]], layer: int, transpose: bool) -> Any:
    def hook(_mod: nn.Module, _inp: Any, out: torch.Tensor) -> None:
        a = out.transpose(2, 3) if transpose else out
        found.setdefault(layer, []).append(a.mean(dim=(0, 1)))
    return hook


def plot_learned_rpe(checkpoint: str | Path, out_dir: str | Path, name: str | None = None,
                     overrides: dict[str, Any] | None = None, refs: int = 3, data: str | None = None,
                     samples: int = 64) -> list[Path]:
    """One ``rpe_layer{i}.png`` per block: refs x refs reference patches, each with its key map."""
    from irpe.models import load_checkpoint_with_info

    model, info = load_checkpoint_with_info(checkpoint, name, **(overrides or {}))
    x = _inputs(info.config.img_size, data, samples)
    maps = attention_rpe(model, x)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = info.config
    return [_plot_layer(m, cfg.grid, cfg.num_prefix_tokens, refs, out / f"rpe_layer{i}.png", i)
            for i, m in enumerate(maps)]


def _inputs(img_size: int, data: str | None, samples: int) -> torch.Tensor:
    if data is None:
        return torch.randn(samples, 3, img_size, img_size, generator=torch.Generator().manual_seed(0))
    from .datasets import load_data

    val = load_data(data, img_size).val
    return torch.stack([val[i][0] for i in range(min(samples, len(val)))])


def _plot_layer(addend: torch.Tensor, grid: tuple[int, int], skip: int, refs: int, path: Path,
                layer: int) -> Path:
    h, w = grid
    rows = np.linspace(0, h - 1, refs).round().astype(int)
    cols = np.linspace(0, w - 1, refs).round().astype(int)
    a = addend.numpy()
    panels = [[a[skip + r * w + c, skip:].reshape(h, w) for c in cols] for r in rows]
    lim = float(max(np.abs(p).max() for row in panels for p in row)) or 1.0
    fig, axes = plt.subplots(refs, refs, figsize=(2.2 * refs + 1.0, 2.2 * refs), dpi=DPI, squeeze=False)
    for i, r in enumerate(rows):
        for j, c in enumerate(cols):
            im = axes[i][j].imshow(panels[i][j], cmap="coolwarm", vmin=-lim, vmax=lim, interpolation="nearest")
            axes[i][j].plot(c, r, marker="x", color="black", markersize=5)
            axes[i][j].set_xticks([])
            axes[i][j].set_yticks([])
            axes[i][j].set_title(f"ref ({r}, {c})", fontsize=8)
    fig.suptitle(f"layer {layer}: relative position addend to attention logits", fontsize=9)
    fig.colorbar(im, ax=axes, fraction=0.046, pad=0.04)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path
