"""``irpe quickstart``: serve the shipped digits model; ``--retrain`` trains and exports it anew.

Without options the artifact shipped in the package (:mod:`irpe.artifact.builtin`) is served: no torch,
no training. ``--retrain`` reproduces it (training extras): train once, export once, record how in
model.json's ``training`` block. Cache layout under the data dir (``--data-dir``, else
``$IRPE_DATA_DIR``, else ``~/.cache/irpe``)::

    quickstart/<config hash>/train/checkpoint.pth   (+ log.txt, DONE once training finished)
    quickstart/<config hash>/artifact/               (model.onnx, model.json)
    artifacts/<checkpoint sha256[:16]>/              (exports of --checkpoint files)

The hash covers the training recipe, the model architecture and the package version, so a changed
recipe trains anew while repeated runs reuse both the checkpoint and the artifact.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from irpe import __version__

from .config import TrainConfig  # torch-free, as is .presets: torch is imported only when training
from .presets import train_config

QUICKSTART_MODEL = "deit_micro_patch4_32_ctx_product_shared_k"
_NOT_HASHED = ("output", "progress", "device", "workers", "threads", "resume", "stop_after")


def resolve_data_dir(data_dir: str | Path | None = None) -> Path:
    """``data_dir``, else ``$IRPE_DATA_DIR``, else ``~/.cache/irpe``; created and checked writable."""
    root = Path(data_dir or os.environ.get("IRPE_DATA_DIR") or Path.home() / ".cache" / "irpe").expanduser()
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=root, prefix=".write-test-"):
            pass
    except OSError as e:
        raise PermissionError(f"cache directory {root} is not writable ({e.strerror or e}); set IRPE_DATA_DIR "
                              "(or pass --data-dir) to a writable directory") from None
    return root


RETRAIN_COMMAND = "irpe quickstart --retrain"
DATA_REVISION = 5  # the digits renderings/augmentation; part of the cache key


def quickstart_config(output: str = "") -> TrainConfig:
    """The embedded digits training run."""
    return train_config("digits", output, model=QUICKSTART_MODEL)


def config_hash(cfg: TrainConfig) -> str:
    """16 hex digits over the recipe, the architecture and the irpe version."""
    from irpe.models import get_config

    recipe = {k: v for k, v in asdict(cfg).items() if k not in _NOT_HASHED}
    arch = repr(get_config(cfg.model, **cfg.overrides))
    blob = json.dumps({"recipe": recipe, "arch": arch, "irpe": __version__, "data": DATA_REVISION},
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def trained_checkpoint(root: Path, progress: bool = True) -> Path:
    """The cached digits checkpoint, training (or resuming an interrupted run) when needed."""
    from .checkpoints import CHECKPOINT_NAME
    from .loop import train
    from .parallel import cpu_seconds

    cfg = quickstart_config()
    run = root / "quickstart" / config_hash(cfg) / "train"
    ckpt, done = run / CHECKPOINT_NAME, run / "DONE"
    if done.is_file() and ckpt.is_file():
        _say(f"reusing the trained digits model {ckpt}", progress)
        return ckpt
    _say(f"training the digits model into {run} (once; a few minutes on 2 cores)", progress)
    cfg.output, cfg.progress = str(run), progress
    cfg.resume = str(ckpt) if ckpt.is_file() else None
    cpu = cpu_seconds()
    result = train(cfg)
    done.write_text(json.dumps({"val_acc": result.val_acc, "seconds": result.seconds,
                                "cpu_seconds": cpu_seconds() - cpu, "processes": cfg.processes,
                                "threads": cfg.threads or (1 if cfg.processes > 1 else torch_threads())}) + "\n")
    return ckpt


def torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def training_record(checkpoint: Path) -> dict[str, Any]:
    """model.json's ``training`` block for the quickstart run that wrote ``checkpoint``."""
    cfg = quickstart_config()
    done = checkpoint.parent / "DONE"
    run = json.loads(done.read_text()) if done.is_file() else {}
    return {"command": RETRAIN_COMMAND, "seed": cfg.seed, "irpe_version": __version__, "data": "digits",
            "data_revision": DATA_REVISION, "model": cfg.model, "epochs": cfg.epochs, "batch_size": cfg.batch_size,
            "val_acc": run.get("val_acc"), "train_seconds": run.get("seconds"),
            "train_cpu_seconds": run.get("cpu_seconds"), "processes": run.get("processes", 1),
            "threads": run.get("threads"),
            "config_hash": config_hash(cfg)}


def record_training(artifact: Path, record: dict[str, Any]) -> None:
    """Add ``record`` as the ``training`` block of ``artifact``/model.json (atomically)."""
    path = artifact / "model.json"
    meta = json.loads(path.read_text())
    meta["training"] = record
    tmp = path.with_name(".model.json.tmp")
    tmp.write_text(json.dumps(meta, indent=2) + "\n")
    os.replace(tmp, path)


def exported_artifact(checkpoint: Path, out_dir: Path, progress: bool = True) -> Path:
    """``out_dir`` holding a valid artifact of ``checkpoint`` (exported once, written atomically)."""
    from irpe.artifact.schema import ArtifactError, file_sha256, load_artifact

    try:
        art = load_artifact(out_dir)
        if art.checkpoint_sha256 in ("", file_sha256(checkpoint)):
            _say(f"reusing the exported artifact {out_dir}", progress)
            return out_dir
    except ArtifactError:
        pass
    from irpe.export import ExportOptions, export_artifact

    tmp = Path(tempfile.mkdtemp(prefix=".export-", dir=out_dir.parent))
    try:
        export_artifact(checkpoint, tmp, ExportOptions(progress=progress))  # recorded overrides apply on load
        shutil.rmtree(out_dir, ignore_errors=True)
        os.replace(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def prepare_artifact(checkpoint: str | Path | None = None, data_dir: str | Path | None = None,
                     progress: bool = True, retrain: bool = False) -> Path:
    """The artifact directory to serve: the shipped digits model; with ``retrain`` the digits model trained
    (once) and exported (once) here; or ``checkpoint`` exported (once)."""
    if checkpoint is None and not retrain:
        from irpe.artifact.builtin import builtin_artifact

        return builtin_artifact("digits")
    root = resolve_data_dir(data_dir)
    if checkpoint is not None:
        from irpe.artifact.schema import file_sha256

        ckpt = Path(checkpoint)
        if not ckpt.is_file():
            raise FileNotFoundError(f"{ckpt}: no such checkpoint file")
        out = root / "artifacts" / file_sha256(ckpt)[:16]
    else:
        ckpt = trained_checkpoint(root, progress)
        out = ckpt.parent.parent / "artifact"
    out.parent.mkdir(parents=True, exist_ok=True)
    art = exported_artifact(ckpt, out, progress)
    if checkpoint is None:
        record_training(art, training_record(ckpt))
    return art


def copy_artifact(src: Path, dest: str | Path) -> Path:
    """Copy the artifact files of ``src`` into ``dest`` (replacing them), e.g. the package's shipped copy."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("model.onnx", "model.json"):
        tmp = dest / f".{name}.tmp"
        shutil.copyfile(src / name, tmp)
        os.replace(tmp, dest / name)
    return dest


def quickstart(checkpoint: str | Path | None = None, data_dir: str | Path | None = None,
               host: str = "127.0.0.1", port: int = 8000, serve: bool = True, progress: bool = True,
               retrain: bool = False, output: str | Path | None = None) -> Path:
    """Prepare the artifact (copied to ``output`` when given), then serve it on http://host:port until
    interrupted (when ``serve``)."""
    artifact = prepare_artifact(checkpoint, data_dir, progress, retrain)
    if output is not None:
        artifact = copy_artifact(artifact, output)
    if serve:
        from irpe.server.config import Settings
        from irpe.server.launch import serve as run_server

        _say(f"serving {artifact} on http://{host}:{port}", progress)
        run_server(Settings.from_env(artifact_dir=str(artifact), host=host, port=port))
    return artifact


def _say(text: str, enabled: bool) -> None:
    if enabled:
        print(f"irpe quickstart: {text}", file=sys.stderr, flush=True)
