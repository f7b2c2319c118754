"""``irpe train``, ``irpe visualize``, ``irpe quickstart``."""

from __future__ import annotations

import argparse
import sys

from irpe.commands.export import add_model_overrides, model_overrides

DEFAULT_MODEL = "deit_micro_patch4_32_ctx_product_shared_k"


def add(sub: argparse._SubParsersAction) -> None:
    _add_train(sub)
    _add_visualize(sub)
    _add_quickstart(sub)


def _add_train(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train an iRPE DeiT (paper recipe) on digits or an ImageFolder tree")
    p.add_argument("--data", required=True, help="'digits' (builtin) or DIR with train/<class>, val/<class>")
    p.add_argument("-o", "--output", required=True, help="directory for checkpoint.pth and log.txt")
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"registered variant (default {DEFAULT_MODEL})")
    add_model_overrides(p)
    p.add_argument("--epochs", type=int, default=None, help="training epochs (default 300, or the digits recipe's)")
    p.add_argument("--batch-size", type=int, default=None,
                   help="images per step in each process (default 64, or the digits recipe's)")
    p.add_argument("--lr", type=float, default=None, help="base learning rate for a total batch of 1024, scaled "
                   "linearly (default 1e-3, or the digits recipe's)")
    p.add_argument("--warmup-epochs", type=int, default=None,
                   help="epochs of linear learning-rate warm-up (default 5, or the digits recipe's)")
    p.add_argument("--drop-path", type=float, default=None, help="stochastic depth rate (default 0.1)")
    p.add_argument("--resume", help="continue from this checkpoint.pth (default: start afresh)")
    p.add_argument("--stop-after", type=int, help="stop after this many epochs in this run, to resume later "
                   "(default: run every epoch)")
    p.add_argument("--device", default="auto", help="auto (cuda when available, else cpu), cpu or cuda")
    p.add_argument("--workers", type=int, default=0, help="data loader worker processes")
    p.add_argument("--threads", type=int, help="torch CPU threads (default 2; 1 when the machine is already busy)")
    p.add_argument("--seed", type=int, default=0, help="random seed of weights, data order and augmentation")
    p.add_argument("--no-progress", action="store_true", help="no progress bar / epoch lines")
    p.add_argument("--processes", type=int, default=None,
                   help="data-parallel local processes, 1 thread each (default 1, digits 2; part of the recipe)")
    p.set_defaults(func=_run_train)


def _run_train(args: argparse.Namespace) -> int:
    from irpe.training.loop import train
    from irpe.training.presets import train_config

    given = {k: getattr(args, k) for k in ("epochs", "batch_size", "lr", "warmup_epochs", "drop_path", "processes")}
    cfg = train_config(args.data, args.output, model=args.model, overrides=model_overrides(args),
                       seed=args.seed, device=args.device, workers=args.workers, threads=args.threads,
                       resume=args.resume, stop_after=args.stop_after, progress=not args.no_progress,
                       **{k: v for k, v in given.items() if v is not None})
    result = train(cfg)
    print(f"{result.checkpoint}  val_acc={result.val_acc:.4f}  {result.seconds:.1f}s")
    return 0


def _add_visualize(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("visualize", help="PNG figures of the bucket maps and of a checkpoint's learned RPE")
    p.add_argument("-o", "--output", required=True, help="directory for the PNG files")
    p.add_argument("--checkpoint", help="also plot this checkpoint's learned relative position bias "
                   "(default: the bucket maps only)")
    p.add_argument("--model", help="variant name for the checkpoint (default: from the checkpoint)")
    add_model_overrides(p)
    p.add_argument("--grid", type=int, default=14, help="bucket-map grid side (default 14)")
    p.add_argument("--ratio", type=float, default=1.9, help="bucket ratio of the maps (default 1.9)")
    p.add_argument("--refs", type=int, default=3, help="reference patches per side for the learned RPE")
    p.add_argument("--data", help="use this dataset's validation images (digits or DIR) instead of noise "
                   "(default: noise)")
    p.add_argument("--samples", type=int, default=64, help="inputs averaged for contextual RPE")
    p.set_defaults(func=_run_visualize)


def _run_visualize(args: argparse.Namespace) -> int:
    from irpe.training.visualize import plot_bucket_maps, plot_learned_rpe

    files = plot_bucket_maps(args.output, grid=(args.grid, args.grid), ratio=args.ratio)
    if args.checkpoint:
        files += plot_learned_rpe(args.checkpoint, args.output, name=args.model,
                                  overrides=model_overrides(args), refs=args.refs, data=args.data,
                                  samples=args.samples)
    for f in files:
        print(f)
    return 0


def _add_quickstart(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("quickstart", help="serve the shipped digits model (--retrain: train + export it anew)")
    p.add_argument("--checkpoint", help="export and serve this checkpoint instead (default: the shipped digits "
                   "model)")
    p.add_argument("--retrain", action="store_true",
                   help="train (once, cached) and export the digits model instead of the shipped one (training extras)")
    p.add_argument("-o", "--output", help="also copy the artifact here (e.g. artifact/builtin/digits to update "
                   "the shipped model; default: no copy)")
    p.add_argument("--host", default="127.0.0.1", help="bind address of the server")
    p.add_argument("--port", type=int, default=8000, help="HTTP port of the server")
    p.add_argument("--data-dir", help="cache directory (default $IRPE_DATA_DIR or ~/.cache/irpe)")
    p.add_argument("--no-serve", action="store_true", help="prepare the artifact, print its path, exit")
    p.set_defaults(func=_run_quickstart)


def _run_quickstart(args: argparse.Namespace) -> int:
    from irpe.training.quickstart import quickstart

    artifact = quickstart(checkpoint=args.checkpoint, data_dir=args.data_dir, host=args.host,
                          port=args.port, serve=not args.no_serve, retrain=args.retrain, output=args.output)
    print(artifact, file=sys.stdout)
    return 0
