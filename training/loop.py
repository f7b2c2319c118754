"""Training loop: recipe, per-epoch validation, official-format checkpoints, exact resume, DDP.

Randomness is re-seeded from ``(seed, epoch)`` at the start of every epoch (shuffling, augmentation,
stochastic depth, loader workers), so ``--resume`` from the end of epoch k reproduces an uninterrupted
run bit for bit on the same device.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from tqdm import tqdm

from irpe.models import create_model, get_config, read_checkpoint

from .checkpoints import CHECKPOINT_NAME, checkpoint_args, load_resume, save_checkpoint
from .config import Dist, TrainConfig, TrainResult
from .data import DataBundle
from .datasets import load_data
from .parallel import train_processes
from .recipe import WarmupCosine, build_optimizer, scaled_lr


def setup_distributed(device: str) -> tuple[Dist, torch.device]:
    """Join the torchrun process group when RANK/WORLD_SIZE are set; pick the device."""
    dist = Dist()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        dist = Dist(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0)))
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(f"cuda:{dist.local_rank}" if device == "cuda" else device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if "RANK" in os.environ and not torch.distributed.is_initialized():
        torch.distributed.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    return dist, dev


def seed_epoch(seed: int, epoch: int, rank: int = 0) -> torch.Generator:
    """Seed torch's global RNG for this epoch (and process: augmentation differs per rank); return a
    generator for the loader."""
    torch.manual_seed(seed * 100_003 + epoch + 7_919 * rank)
    return torch.Generator().manual_seed(seed * 100_019 + epoch)


def make_loader(ds: Dataset, cfg: TrainConfig, dist: Dist, epoch: int, train: bool) -> DataLoader:
    """Train: DistributedSampler (also for one process) shuffled by seed + epoch; val: in order."""
    sampler = None
    if train:
        sampler = DistributedSampler(ds, num_replicas=dist.world, rank=dist.rank, shuffle=True, seed=cfg.seed)
        sampler.set_epoch(epoch)
    drop = train and len(ds) >= cfg.batch_size * dist.world
    return DataLoader(ds, batch_size=cfg.batch_size, sampler=sampler, shuffle=False, drop_last=drop,
                      num_workers=cfg.workers, generator=seed_epoch(cfg.seed, epoch, dist.rank) if train else None,
                      persistent_workers=False)


def train_one_epoch(model: nn.Module, loader: DataLoader, opt: torch.optim.Optimizer,
                    sched: WarmupCosine, cfg: TrainConfig, dev: torch.device, desc: str,
                    show: bool) -> dict[str, float]:
    """One pass over ``loader``; tqdm on stderr shows running loss / accuracy / lr."""
    model.train()
    loss_sum, correct, seen = 0.0, 0, 0
    bar = tqdm(loader, desc=desc, file=sys.stderr, disable=not show, leave=False, dynamic_ncols=True)
    for x, y in bar:
        x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
        outs = model(x)
        outs = outs if isinstance(outs, tuple) else (outs,)  # distilled: both heads on the labels
        logits = outs[0]
        loss = sum(F.cross_entropy(o, y, label_smoothing=cfg.smoothing) for o in outs) / len(outs)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        loss_sum += float(loss.detach()) * len(y)
        correct += int((logits.argmax(1) == y).sum())
        seen += len(y)
        bar.set_postfix(loss=f"{loss_sum / seen:.3f}", acc=f"{correct / seen:.3f}",
                        lr=f"{sched.get_last_lr()[0]:.2e}")
    return {"train_loss": loss_sum / max(seen, 1), "train_acc": correct / max(seen, 1)}


@torch.no_grad()
def evaluate(model: nn.Module, loader: DataLoader, dev: torch.device) -> dict[str, float]:
    """Plain cross-entropy and top-1 accuracy over the whole loader (eval mode)."""
    model.eval()
    loss_sum, correct, seen = 0.0, 0, 0
    for x, y in loader:
        x, y = x.to(dev), y.to(dev)
        logits = model(x)
        loss_sum += float(F.cross_entropy(logits, y, reduction="sum"))
        correct += int((logits.argmax(1) == y).sum())
        seen += len(y)
    return {"val_loss": loss_sum / max(seen, 1), "val_acc": correct / max(seen, 1)}


def log_epoch(out: Path, stats: dict[str, float], show: bool) -> None:
    with open(out / "log.txt", "a") as f:
        f.write(json.dumps(stats) + "\n")
    if show:
        print(f"epoch {int(stats['epoch']) + 1}: train loss {stats['train_loss']:.4f} acc "
              f"{stats['train_acc']:.4f} | val loss {stats['val_loss']:.4f} acc {stats['val_acc']:.4f} | "
              f"{stats['seconds']:.1f}s", file=sys.stderr)


def default_threads() -> int:
    """2 threads (at most the core count), but 1 when other processes already keep the cores busy:
    OpenMP spin-waiting on an oversubscribed 2-core box made epochs ~10x slower than one thread."""
    cores = os.cpu_count() or 1
    busy = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    return max(1, min(2, cores)) if cores - busy >= 1.5 else 1


def prepare(cfg: TrainConfig) -> tuple[Dist, torch.device, DataBundle, nn.Module]:
    """Threads, process group, data and the seeded model (DDP-wrapped under torchrun)."""
    torch.set_num_threads(cfg.threads or default_threads())
    dist, dev = setup_distributed(cfg.device)
    arch = get_config(cfg.model, **cfg.overrides)
    data = load_data(cfg.data, arch.img_size)
    if arch.num_classes != len(data.class_names):
        raise ValueError(f"{cfg.data}: {len(data.class_names)} classes but the model has {arch.num_classes} "
                         "outputs; "
                         f"pass --num-classes {len(data.class_names)}")
    torch.manual_seed(cfg.seed)
    model = create_model(cfg.model, drop_path_rate=cfg.drop_path, **cfg.overrides).to(dev)
    if torch.distributed.is_initialized():
        model = nn.parallel.DistributedDataParallel(model, device_ids=[dev.index] if dev.type == "cuda" else None)
    return dist, dev, data, model


def train(cfg: TrainConfig) -> TrainResult:
    """Run (or resume) training; rank 0 writes ``OUTPUT/checkpoint.pth`` and ``log.txt`` every epoch."""
    if cfg.processes > 1 and "RANK" not in os.environ:
        return train_processes(cfg, train)  # each spawned rank runs this function again, RANK set
    start = time.perf_counter()
    resume = read_checkpoint(cfg.resume) if cfg.resume else None  # refuses unsafe pickles unexecuted
    dist, dev, data, model = prepare(cfg)
    out = Path(cfg.output)
    if dist.main:
        out.mkdir(parents=True, exist_ok=True)
        if not cfg.resume:
            (out / "log.txt").unlink(missing_ok=True)
    steps = len(make_loader(data.train, cfg, dist, 0, train=True))
    lr = scaled_lr(cfg.lr, cfg.batch_size, dist.world)
    opt = build_optimizer(model, lr, cfg.weight_decay)
    sched = WarmupCosine(opt, lr, cfg.epochs * steps, cfg.warmup_epochs * steps, cfg.min_lr)
    first = load_resume(resume, cfg, model, opt, sched) if resume is not None else 0
    args, history = checkpoint_args(cfg, dist, lr), []
    last = cfg.epochs if cfg.stop_after is None else min(cfg.epochs, first + cfg.stop_after)
    val_loader = make_loader(data.val, cfg, dist, 0, train=False)
    for epoch in range(first, last):
        t0 = time.perf_counter()
        loader = make_loader(data.train, cfg, dist, epoch, train=True)
        stats = train_one_epoch(model, loader, opt, sched, cfg, dev, f"epoch {epoch + 1}/{cfg.epochs}",
                                cfg.progress and dist.main)
        stats |= evaluate(model, val_loader, dev)
        stats |= {"epoch": epoch, "lr": sched.get_last_lr()[0], "seconds": time.perf_counter() - t0}
        history.append(stats)
        if dist.main:
            save_checkpoint(out / CHECKPOINT_NAME, model, opt, sched, epoch, args, data)
            log_epoch(out, stats, cfg.progress)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return TrainResult(out / CHECKPOINT_NAME, history, time.perf_counter() - start)
