"""``irpe serve`` (HTTP server) and ``irpe classify`` (local, no server)."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from irpe.commands import CLIError


def add(sub: argparse._SubParsersAction) -> None:
    """Register ``serve`` and ``classify``."""
    _add_serve(sub)
    _add_classify(sub)


def _add_serve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve models over HTTP (/classify, KServe v2, metrics, demo page) and, with "
                       "--grpc-port, gRPC",
                       description="Every option can also be set as an IRPE_* environment variable "
                       "(e.g. IRPE_MAX_BATCH=16, IRPE_API_KEY=secret); flags win over variables. "
                       "docs/configuration.md lists every setting.")
    p.add_argument("artifact_dir", nargs="?", help="directory with model.json, a model repository, or 'digits' "
                   "for the shipped digits model (default: $IRPE_ARTIFACT_DIR, else /models)")
    p.add_argument("--host", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="HTTP port (0: a free one; default 8000)")
    p.add_argument("--grpc-port", type=int, help="also serve KServe v2 / Triton gRPC (inference.GRPCInferenceService) "
                   "on this port (0: a free one; default: off; needs the grpc extra)")
    p.add_argument("--backend", choices=["auto", "onnxruntime", "tensorrt", "openvino"],
                   help="inference runtime (default auto: TensorRT on a GPU with a plan; on a CPU OpenVINO for "
                   "int8/bf16 when installed, else ONNX Runtime)")
    p.add_argument("--device", choices=["cpu", "cuda"], help="where inference runs (default cpu)")
    p.add_argument("--precision", choices=["auto", "fp32", "bf16"],
                   help="OpenVINO float precision (default auto: bf16 where the CPU has it and model.json's bf16 "
                   "fidelity report passed, else fp32)")
    p.add_argument("--max-batch", type=int, help="images per inference call (default: 4 on cpu, 32 on cuda)")
    p.add_argument("--max-wait-ms", type=float, help="how long a batch waits to fill (default 5)")
    p.add_argument("--max-queue", type=int, help="queued images before 503 (default 256)")
    p.add_argument("--workers", type=int, help="server processes on the one port, one model each (default 1)")
    p.add_argument("--decode-threads", type=int,
                   help="image decoding threads (default: half the cores on cpu, all on cuda; with the default, "
                        "baseline JPEGs up to 1 Mpx decode on the event loop, the rest in the threads; "
                        "set N: every image in N threads)")
    p.add_argument("--inference-threads", type=int,
                   help="inference workers pulling batches (default: CPU count on cpu, 1 on cuda)")
    p.add_argument("--threads", type=int, help="ONNX Runtime intra-op threads per worker (default: cores/workers)")
    p.add_argument("--max-body-mb", type=float, help="request body limit in MB (default 20)")
    p.add_argument("--max-pixels", type=lambda s: int(float(s)), help="pixel limit per image (default 40e6)")
    p.add_argument("--timeout-s", type=float, help="per-request deadline, 504 after (default 30)")
    p.add_argument("--drain-s", type=float, help="on SIGTERM/SIGINT, /readyz and /v2/health/ready answer 503 "
                   "'draining' for this long while requests are still served and accepted, so a load balancer's "
                   "health check takes the server out before it stops listening (default 0)")
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"],
                   help="server log verbosity (default info)")
    p.add_argument("--jpeg-draft", action="store_true", default=None,
                   help="decode JPEGs at a reduced DCT scale >= the resize size (faster, not bit-exact; "
                   "default off)")
    _add_limits(p)
    p.add_argument("--frontends", type=lambda v: -1 if v == "auto" else int(v),
                   help="HTTP front-end processes (decode + preprocess) on one port feeding one engine process "
                   "through shared memory; 0: one process; default 'auto': one per core but one with --device cuda, "
                   "one process on cpu")
    _add_repository(p)
    p.set_defaults(func=run_serve)


def _add_repository(p: argparse.ArgumentParser) -> None:
    """Model repository: ARTIFACT_DIR may be a repository of <model>/<version>/ directories."""
    p.add_argument("--model-control", choices=["none", "poll", "explicit"],
                   help="none (default): the models found at startup; poll: rescan the repository every "
                   "--poll-interval-s and load new versions / unload removed ones; explicit: POST "
                   "/v2/repository/models/NAME/load|unload")
    p.add_argument("--poll-interval-s", type=float, help="repository rescan interval with --model-control poll "
                   "(default 5)")
    p.add_argument("--load-model", action="append", metavar="NAME",
                   help="with --model-control explicit: load only this model at startup (repeatable; '*': all, "
                   "as Triton; default: every model, unlike Triton, which loads none)")
    p.add_argument("--default-model", help="the model /classify serves without ?model= (default: the only, or "
                   "first by name, model of the repository)")


def _add_limits(p: argparse.ArgumentParser) -> None:
    """Hostile-input limits and exposure (SECURITY.md lists each with its default)."""
    p.add_argument("--insecure", action="store_true", default=None,
                   help="allow a non-loopback --host without IRPE_API_KEY (unauthenticated; default: refuse)")
    p.add_argument("--max-images", type=int, help="images per request (default 32)")
    p.add_argument("--max-decode-pixels", type=lambda s: int(float(s)),
                   help="pixels decoded at once across the decode pool (default 2 x --max-pixels)")
    p.add_argument("--max-jpeg-scans", type=int, help="scans per progressive JPEG (default 100)")
    p.add_argument("--max-header-kb", type=int, help="request line + headers size (default 64)")
    p.add_argument("--header-timeout-s", type=float, help="time to receive the request head, 408 after (default 10)")
    p.add_argument("--body-timeout-s", type=float, help="time to receive the request body, 408 after (default 60)")
    p.add_argument("--max-connections", type=int, help="open connections before 503 (default 256); with --grpc-port "
                   "also the gRPC listener's connection cap and its concurrent RPCs (RESOURCE_EXHAUSTED past it)")
    p.add_argument("--grpc-max-streams", type=int, help="concurrent RPCs on one gRPC connection (HTTP/2 "
                   "MAX_CONCURRENT_STREAMS; default 64)")
    p.add_argument("--grpc-idle-timeout-s", type=float, help="a gRPC connection with no RPC running, or a "
                   "ModelStreamInfer stream with no message, is closed after this long (default 300)")
    p.add_argument("--grpc-max-age-s", type=float, help="a gRPC connection is asked to reconnect (GOAWAY) after this "
                   "long; its running RPCs get --timeout-s more (default 3600)")
    p.add_argument("--allowed-hosts", help="comma-separated Host names accepted ('*': any; default: loopback "
                   "names on a loopback bind without a key, else any)")
    p.add_argument("--allow-client-shm", action="store_true", default=None,
                   help="let local clients register /dev/shm segments they own for tensors (Triton's system shared "
                   "memory: loopback peers only, each uid its own regions; default off)")
    p.add_argument("--max-shm-regions", type=int, help="registered shared-memory regions at once (default 64)")
    p.add_argument("--max-shm-region-mb", type=float, help="bytes one registered region may span (default 1024)")
    p.add_argument("--shm-name-prefix", help="/dev/shm names that any local client may register, whoever owns the "
                   "file (default none: a client registers only segments its own uid owns); for clients that run "
                   "under another uid than the program that creates the segments")


LIMIT_KEYS = ("insecure", "max_images", "max_decode_pixels", "max_jpeg_scans", "max_header_kb", "header_timeout_s",
              "body_timeout_s", "max_connections", "grpc_max_streams", "grpc_idle_timeout_s", "grpc_max_age_s",
              "allowed_hosts", "allow_client_shm", "max_shm_regions", "max_shm_region_mb",
              "shm_name_prefix")


def run_serve(args: argparse.Namespace) -> int:
    """Build Settings (flags > IRPE_* > defaults) and serve."""
    from irpe.server.config import Settings
    from irpe.server.launch import serve

    keys = ["host", "port", "grpc_port", "backend", "device", "max_batch", "max_wait_ms", "max_queue", "workers",
            "decode_threads", "inference_threads", "threads", "max_body_mb", "max_pixels", "timeout_s", "drain_s",
            "log_level", "jpeg_draft", "precision", *LIMIT_KEYS, "frontends", "model_control", "poll_interval_s",
            "default_model"]
    settings = Settings.from_env(artifact_dir=args.artifact_dir, **{k: getattr(args, k) for k in keys},
                                 load_model=",".join(args.load_model) if args.load_model else None)
    if settings.grpc_port >= 0:  # before the model loads: a missing [grpc] extra is one line naming it
        from irpe.extras import GRPC_MODULES, require_modules

        require_modules(GRPC_MODULES)
    serve(settings)
    return 0


def _add_classify(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("classify", help="classify image files locally (no server) and print a table")
    p.add_argument("images", nargs="+", help="image files (PNG, JPEG, or anything Pillow reads)")
    p.add_argument("--model", required=True, help="artifact directory, or a checkpoint to export first "
                   "('digits': the shipped model; a published variant name with --pretrained)")
    p.add_argument("--pretrained", action="store_true", help="--model names a published variant: download its "
                   "released weights (cached) and export them first")
    p.add_argument("--top-k", type=int, default=5, help="classes printed per image")
    p.add_argument("--backend", choices=["auto", "onnxruntime", "tensorrt", "openvino"], default="auto",
                   help="inference runtime, as irpe serve --backend")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where inference runs")
    p.set_defaults(func=run_classify)


def run_classify(args: argparse.Namespace) -> int:
    """Classify files with an artifact dir, or export a checkpoint to a temp dir first."""
    if args.pretrained:
        from irpe.commands.export import pretrained_checkpoint

        args.model = pretrained_checkpoint(args.model, None)[0]
    from irpe.artifact.builtin import resolve_artifact_dir

    model = resolve_artifact_dir(args.model)
    if not model.exists():
        raise CLIError(f"--model {model}: no such file or directory")
    missing = [p for p in args.images if not Path(p).is_file()]
    if missing:
        raise CLIError(f"image file(s) not found: {missing}")
    if args.top_k < 1:
        raise CLIError("--top-k must be at least 1")
    if model.is_dir():
        return _classify(args, model)
    from irpe.export import ExportOptions, export_artifact  # checkpoint: export to a temporary artifact first

    with tempfile.TemporaryDirectory(prefix="irpe-classify-") as tmp:
        return _classify(args, Path(export_artifact(model, tmp, ExportOptions())))


def _classify(args: argparse.Namespace, artifact_dir: Path) -> int:
    from irpe.server.engines import EngineError
    from irpe.server.errors import APIError
    from irpe.server.pipeline.offline import classify_files, format_table

    try:
        name, preds = classify_files(args.images, artifact_dir, k=args.top_k, backend=args.backend,
                                     device=args.device)
    except APIError as e:
        raise CLIError(e.message) from None
    except EngineError as e:
        raise CLIError(str(e)) from None
    print(f"model: {name}")
    print(format_table(args.images, preds))
    return 0
