"""Data-parallel training in local processes (``TrainConfig.processes > 1``), no torchrun needed.

A transformer this small is too fine-grained for intra-op threads (two OpenMP threads barely beat one),
but two processes of one thread each, every one on its own share of each batch with gradients averaged
by gloo over 127.0.0.1, use two cores almost fully. The run is the torchrun one (``RANK``/``WORLD_SIZE``
set per process, the one-process function the caller passes, :func:`irpe.training.loop.train`, in each):
rank 0 writes the checkpoint and log.txt.
The world size is part of the recipe (it is recorded in the checkpoint's ``args``), so a run gives the
same model on any machine, however many cores it has. ``device="auto"`` trains the ranks on CPU.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import resource
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from .config import TrainConfig, TrainResult

RankTrain = Callable[[TrainConfig], TrainResult]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank_main(cfg: TrainConfig, rank: int, port: int, errors: Any, rank_train: RankTrain) -> None:
    """One process of the group (runs in a spawned child); an exception goes to the parent to be raised
    there as it is (a user error stays one clear line, no traceback per rank)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(cfg.processes), LOCAL_RANK=str(rank), OMP_NUM_THREADS=str(cfg.threads or 1))
    try:
        rank_train(replace(cfg, threads=cfg.threads or 1, progress=cfg.progress and rank == 0))
    except Exception as e:  # noqa: BLE001 - handed to the parent, which raises it
        try:
            errors.put(e)
        except Exception:  # noqa: BLE001 - an exception that does not pickle: its text then
            errors.put(RuntimeError(f"training process {rank}: {type(e).__name__}: {e}"))
        sys.exit(1)


def _wait(procs: list[mp.process.BaseProcess], errors: Any) -> None:
    """Join every process; when one fails, stop the others (they would wait for it forever) and raise."""
    from multiprocessing.connection import wait

    while True:
        alive = [p for p in procs if p.is_alive()]  # before the exit codes: one that ends between is seen failed
        failed = next((p for p in procs if p.exitcode not in (None, 0)), None)
        if failed is not None or not alive:
            break
        wait([p.sentinel for p in alive], timeout=1.0)
    for p in procs:
        if p.is_alive():
            p.terminate()
        p.join()
    if failed is not None and not errors.empty():
        raise errors.get()
    if failed is not None:
        raise RuntimeError(f"training process {procs.index(failed)} of {len(procs)} exited with status "
                           f"{failed.exitcode} (its traceback is above); the others were stopped")


def train_processes(cfg: TrainConfig, rank_train: RankTrain) -> TrainResult:
    """Train with ``cfg.processes`` local processes, each running ``rank_train`` (a module-level function, as
    spawn pickles it by name); the result as :func:`irpe.training.loop.train` gives it."""
    from .checkpoints import CHECKPOINT_NAME

    if cfg.device == "auto":  # the process group is for CPU cores; one GPU per rank only when asked for
        cfg = replace(cfg, device="cpu")
    elif cfg.device.startswith("cuda"):
        import torch

        if torch.cuda.device_count() < cfg.processes:
            raise ValueError(f"--processes {cfg.processes} with --device cuda needs {cfg.processes} GPUs, found "
                             f"{torch.cuda.device_count()}; pass --processes 1 (or --device cpu)")
    start, port = time.perf_counter(), _free_port()
    ctx = mp.get_context("spawn")  # a fresh interpreter per rank: no forked torch or OpenMP state
    errors = ctx.SimpleQueue()
    procs = [ctx.Process(target=_rank_main, args=(cfg, rank, port, errors, rank_train), daemon=True)
             for rank in range(cfg.processes)]
    for p in procs:
        p.start()
    _wait(procs, errors)
    out = Path(cfg.output)
    history = [json.loads(line) for line in (out / "log.txt").read_text().splitlines() if line.strip()]
    return TrainResult(out / CHECKPOINT_NAME, history, time.perf_counter() - start)


def cpu_seconds() -> float:
    """CPU seconds of this process plus its finished children (the training processes)."""
    child = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + child.ru_utime + child.ru_stime
