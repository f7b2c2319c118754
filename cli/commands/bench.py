"""``irpe bench export`` and ``irpe bench serve``: side-by-side measurements printing ratios."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from irpe.commands import CLIError

# --frontend's requests per server (split over its rounds): with 256 one run put 'single no-log' above 'single', the
# differences it measures (0.05-0.3 CPU-ms) were inside its round-to-round spread; 2,400 settled them.
FRONTEND_REQUESTS = 2400

if TYPE_CHECKING:
    from irpe.bench.triton import Options


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmarks that print ratios measured side by side")
    bsub = p.add_subparsers(dest="bench", required=True, title="benchmarks", metavar="BENCH")
    add_export_bench(bsub)
    add_serve_bench(bsub)
    add_latency_bench(bsub)
    add_cpu_bench(bsub)
    add_digits_bench(bsub)
    add_repository_bench(bsub)
    add_triton_bench(bsub)
    add_rpe_lookup_bench(bsub)


def add_cpu_bench(bsub: argparse._SubParsersAction) -> None:
    """``irpe bench cpu``: ONNX Runtime / OpenVINO fp32, bf16, our int8 and NNCF int8, side by side."""
    p = bsub.add_parser("cpu", help="CPU paths side by side: ONNX Runtime fp32, OpenVINO fp32/bf16, our int8 "
                                    "QDQ on both runtimes, OpenVINO NNCF int8 (anchor)")
    p.add_argument("--models", default="plain,k,qkv", help="comma list of plain, k, qk, qkv (default plain,k,qkv)")
    p.add_argument("--batch", default="1,8", help="comma list of batch sizes (default 1,8)")
    p.add_argument("--paths", default="ort-fp32,ort-fp32-std,ov-fp32,ov-bf16,ort-int8,ov-int8,nncf-int8",
                   help="comma list of the paths to time (ort-fp32-std: ONNX Runtime on the file as exported, "
                        "without the irpe.ort custom ops)")
    p.add_argument("--repeats", type=int, default=10, help="interleaved timed rounds (median reported)")
    p.add_argument("--warmup", type=int, default=2, help="untimed rounds first")
    p.add_argument("--threads", type=int, default=0, help="threads per runtime (default: all cores)")
    p.add_argument("--img-size", type=int, default=224, help="input image side of the models")
    p.add_argument("--calibration-size", type=int, default=32, help="photo crops to calibrate int8 on")
    p.add_argument("--int8-scope", choices=["linear", "rpe", "attention", "all"], default="linear",
                   help="MatMuls our int8 paths quantize, as irpe export --int8-scope")
    p.add_argument("--served", type=int, default=0, metavar="N",
                   help="also serve fp32 (ONNX Runtime) and int8 (default backend): N requests each at "
                   "concurrency 16")

    def run(args: argparse.Namespace) -> int:
        """Parse the lists, run the bench, print the table."""
        from irpe.bench.cpu import format_plain_ratios, format_table, run_cpu_bench

        batches = _ints(args.batch, "--batch")
        if not batches or min(batches) < 1 or args.repeats < 1 or args.warmup < 0 or args.calibration_size < 1:
            raise CLIError("--batch values, --repeats and --calibration-size must be >= 1, --warmup >= 0")
        rows, notes = run_cpu_bench(_names(args.models), batches, paths=_names(args.paths), repeats=args.repeats,
                                    warmup=args.warmup, threads=args.threads, img_size=args.img_size,
                                    calibration_size=args.calibration_size, scope=args.int8_scope,
                                    served=args.served)
        print(format_table(rows))
        ratios = format_plain_ratios(rows)
        if ratios:
            print(f"\niRPE / plain DeiT-S on the same path (medians):\n{ratios}")
        for line in notes:
            print(line)
        return 0

    p.set_defaults(func=run)


def add_export_bench(bsub: argparse._SubParsersAction) -> None:
    """``irpe bench export``: ONNX Runtime CPU latency of exported DeiT-S variants, ratios to plain DeiT-S."""
    p = bsub.add_parser("export", help="ONNX Runtime CPU latency of plain DeiT-S, iRPE-K/QK/QKV exports "
                                       "and torch.onnx.export references, side by side")
    p.add_argument("--batch", default="1,8", help="comma list of batch sizes (default 1,8)")
    p.add_argument("--repeats", type=int, default=10, help="timed runs per graph and batch (median reported)")
    p.add_argument("--warmup", type=int, default=2, help="untimed runs per graph first")
    p.add_argument("--models", default="plain,k,qk,qkv", help="comma list of plain, k, qk, qkv")
    p.add_argument("--threads", type=int, default=0, help="ONNX Runtime intra-op threads (default: all cores)")
    p.add_argument("--img-size", type=int, default=224, help="input image side of the models")
    p.add_argument("--no-reference", action="store_true", help="skip the torch.onnx.export reference graphs")

    def run(args: argparse.Namespace) -> int:
        """Validate the options, run the side-by-side benchmark, print the table."""
        from irpe.export.bench import format_table, run_export_bench

        batches = _ints(args.batch, "--batch")
        if not batches or min(batches) < 1 or args.repeats < 1 or args.warmup < 0:
            raise CLIError("--batch values and --repeats must be >= 1, --warmup >= 0")
        print(format_table(run_export_bench(_names(args.models), batches, repeats=args.repeats, warmup=args.warmup,
                                            threads=args.threads or None, img_size=args.img_size,
                                            reference=not args.no_reference)))
        return 0

    p.set_defaults(func=run)


def add_serve_bench(bsub: argparse._SubParsersAction) -> None:
    """``irpe bench serve``: served req/s vs the raw engine and a naive server, measured in one run."""
    p = bsub.add_parser("serve", help="served throughput vs raw engine vs a naive one-request server")
    p.add_argument("--artifact", help="artifact directory (default: export DeiT-Tiny iRPE-K, random weights)")
    p.add_argument("--requests", type=int, default=None, help="requests per concurrency level (default 256; "
                   f"with --frontend {FRONTEND_REQUESTS} per server over its rounds)")
    p.add_argument("--concurrency", default="1,8,32", help="comma list of client counts")
    p.add_argument("--server-arg", action="append", default=[], help="extra `irpe serve` flag (repeatable)")
    _add_frontend_options(p)

    def run(args: argparse.Namespace) -> int:
        """Parse the levels and run the serving benchmark."""
        if args.frontend:
            args.requests = FRONTEND_REQUESTS if args.requests is None else args.requests
            return _run_frontend(args)
        args.requests = 256 if args.requests is None else args.requests
        from irpe.bench.serve import run_bench

        levels = tuple(_ints(args.concurrency, "--concurrency"))
        if not levels or min(levels) < 1 or args.requests < 1:
            raise CLIError("--concurrency needs positive integers and --requests must be >= 1")
        run_bench(args.artifact, args.requests, levels, tuple(args.server_arg))
        return 0

    p.set_defaults(func=run)


def add_latency_bench(bsub: argparse._SubParsersAction) -> None:
    """``irpe bench latency``: /v2 infer p50 at concurrency 1 vs the raw engine's batch-1 latency, and req/s."""
    p = bsub.add_parser("latency", help="what batching adds to a lone request; optionally vs a baseline server")
    p.add_argument("--artifact", help="artifact directory (default: export DeiT-Tiny iRPE-K, random weights)")
    p.add_argument("--requests", type=int, default=200, help="requests per concurrency level and server")
    p.add_argument("--concurrency", default="1,32", help="comma list of client counts")
    p.add_argument("--baseline-pythonpath", help="PYTHONPATH of another irpe import tree to serve side by side "
                   "(default: none)")
    p.add_argument("--server-arg", action="append", default=[], help="extra `irpe serve` flag (repeatable)")

    def run(args: argparse.Namespace) -> int:
        """Parse the levels and run the latency benchmark."""
        from irpe.bench.latency import run_latency

        levels = tuple(_ints(args.concurrency, "--concurrency"))
        if not levels or min(levels) < 1 or args.requests < 1:
            raise CLIError("--concurrency needs positive integers and --requests must be >= 1")
        run_latency(args.artifact, args.requests, levels, args.baseline_pythonpath, tuple(args.server_arg))
        return 0

    p.set_defaults(func=run)


def add_digits_bench(bsub: argparse._SubParsersAction) -> None:
    """``irpe bench digits``: served accuracy per rendering family of a digits artifact."""
    p = bsub.add_parser("digits", help="accuracy per rendering family (held-out digits as PNG/JPEG files) "
                                       "through a real `irpe serve`, and offline")
    p.add_argument("--artifact", default="digits", help="artifact directory (default: the shipped digits model)")
    p.add_argument("--per-family", type=int, help="held-out digits per family (default: all 360)")
    p.add_argument("--url", help="score this running server (default: start one)")
    p.add_argument("--families", help="comma list (default: all)")

    def run(args: argparse.Namespace) -> int:
        """Score every family; exit 1 when served and offline labels differ anywhere."""
        from irpe.bench.digits import run_digits_bench

        families = [f.strip() for f in args.families.split(",")] if args.families else None
        table = run_digits_bench(args.artifact, args.per_family, args.url, families)
        return 1 if any(f.mismatches for f in table.values()) else 0

    p.set_defaults(func=run)


def _add_frontend_options(p: argparse.ArgumentParser) -> None:
    """``irpe bench serve --frontend`` : CPU-ms per request, one process vs 1..N front ends."""
    p.add_argument("--frontend", action="store_true", help="CPU-ms/request and req/s per thread kind: one "
                   "process vs --frontends 1..N (default artifact: the near-free model)")
    p.add_argument("--frontends", default="1,2", help="with --frontend: comma list of front-end counts")
    p.add_argument("--images-per-request", default="1,4", help="with --frontend: comma list (cost per image)")
    p.add_argument("--baseline-pythonpath", help="with --frontend: another irpe import tree, served beside "
                   "(default: none)")
    p.add_argument("--baseline", default=None, help="with --frontend: git commit served beside as 'baseline' "
                   "(default: the last commit before the front-end processes; 'none' to skip)")
    p.add_argument("--rounds", type=int, default=3, help="with --frontend: interleaved rounds")


def _run_frontend(args: argparse.Namespace) -> int:
    from irpe.bench.frontend import run_frontend_bench

    counts, images = _ints(args.frontends, "--frontends"), _ints(args.images_per_request, "--images-per-request")
    conc = max(_ints(args.concurrency, "--concurrency"), default=0)
    if min(counts + images + [conc, args.requests]) < 0 or min(images + [conc, args.requests]) < 1:
        raise CLIError("--frontends must be >= 0; --images-per-request, --concurrency, --requests >= 1")
    from irpe.bench.baseline import SINGLE_PROCESS_BASELINE

    run_frontend_bench(args.artifact, args.requests, conc, counts, args.baseline_pythonpath, images,
                       tuple(args.server_arg), args.baseline or SINGLE_PROCESS_BASELINE, max(1, args.rounds))
    return 0


def add_repository_bench(bsub: argparse._SubParsersAction) -> None:
    """``irpe bench repository``: req/s with two models under load vs one, and fairness."""
    p = bsub.add_parser("repository", help="one server: one model vs two models under load (req/s, share, "
                                           "a quiet model's latency next to a flooded one)")
    p.add_argument("--artifact", default="digits", help="artifact served as models a and b (default: digits)")
    p.add_argument("--requests", type=int, default=400, help="requests per scenario and round")
    p.add_argument("--concurrency", type=int, default=16, help="clients in all")
    p.add_argument("--server-arg", action="append", default=[], help="extra `irpe serve` flag (repeatable)")

    def run(args: argparse.Namespace) -> int:
        """Run the scenarios, print the table and ratios."""
        from irpe.bench.repository import run_repo_bench

        if args.requests < 2 or args.concurrency < 2:
            raise CLIError("--requests and --concurrency must be >= 2")
        run_repo_bench(args.artifact, args.requests, args.concurrency, tuple(args.server_arg))
        return 0

    p.set_defaults(func=run)


def add_triton_bench(bsub: argparse._SubParsersAction) -> None:
    """``irpe bench triton``: irpe serve vs the real tritonserver under NVIDIA's perf_analyzer."""
    p = bsub.add_parser("triton", help="irpe serve vs the real NVIDIA Triton on the same artifact, perf_analyzer "
                                       "at each concurrency, interleaved: infer/s, p50/p99, client-minus-server, "
                                       "server CPU-us per request")
    p.add_argument("--models", default="near-free,deit-tiny", help="comma list of near-free (224 px), tiny (the "
                   "near-free model at 32 px), deit-tiny (exported with random weights; needs torch)")
    p.add_argument("--artifact", help="bench this artifact directory instead of --models (default: none)")
    p.add_argument("--protocols", default="http", help="comma list of http, grpc (default http)")
    p.add_argument("--concurrency", default="1,8,32", help="comma list of perf_analyzer concurrency levels")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (medians reported)")
    p.add_argument("--interval-ms", type=int, default=500, help="perf_analyzer measurement window (3 per run; "
                   "short, since perf_analyzer 2.60's memory grows with the requests a window holds)")
    p.add_argument("--triton-instances", type=int, default=0, help="Triton model instances (default: one per "
                   "usable core, as irpe serve's inference threads)")
    p.add_argument("--triton-threads", type=int, default=1, help="ONNX Runtime threads per Triton instance")
    p.add_argument("--triton-max-batch", type=int, default=32, help="Triton max_batch_size (preferred sizes as "
                   "irpe export writes them)")
    p.add_argument("--perf-analyzer", help="perf_analyzer command line (default: $IRPE_PERF_ANALYZER, "
                   "perf_analyzer on PATH, or scripts/perf-analyzer.sh of this checkout)")
    p.add_argument("--server-arg", action="append", default=[], help="extra `irpe serve` flag (repeatable)")
    p.add_argument("--baseline", help="git commit whose irpe serve runs beside as a third server (irpe/base; "
                   "default: none)")
    p.set_defaults(func=_run_triton)


def triton_options(args: argparse.Namespace) -> Options:
    """The checked options of ``irpe bench triton`` (a ``bench.triton.Options``)."""
    from irpe.bench.triton import MODELS, PROTOCOLS, Options

    models, protocols = _names(args.models), _names(args.protocols)
    levels = _ints(args.concurrency, "--concurrency")
    bad = [m for m in models if m not in MODELS] + [p for p in protocols if p not in PROTOCOLS]
    if bad:
        raise CLIError(f"unknown {', '.join(bad)}: --models from {', '.join(MODELS)}, --protocols from "
                       f"{', '.join(PROTOCOLS)}")
    if not levels or min(levels) < 1 or not protocols or (not models and not args.artifact):
        raise CLIError("--concurrency needs positive integers; --protocols and --models (or --artifact) a name")
    if min(args.rounds, args.triton_threads, args.triton_max_batch) < 1 or args.triton_instances < 0 \
            or args.interval_ms < 100:
        raise CLIError("--rounds, --triton-threads, --triton-max-batch must be >= 1, --triton-instances >= 0 "
                       "(0: one per core), --interval-ms >= 100")
    return Options(models=models, artifact=args.artifact, protocols=protocols, levels=levels, rounds=args.rounds,
                   interval_ms=args.interval_ms, instances=args.triton_instances, threads=args.triton_threads,
                   max_batch=args.triton_max_batch, server_args=tuple(args.server_arg),
                   perf_analyzer=args.perf_analyzer, baseline=args.baseline)


def _run_triton(args: argparse.Namespace) -> int:
    from irpe.bench.triton import BenchError, run_triton_bench
    from irpe.bench.tritonserver import TritonUnavailable

    opts = triton_options(args)
    try:
        run_triton_bench(opts)
    except (BenchError, TritonUnavailable) as e:
        raise CLIError(str(e)) from None
    return 0


def add_rpe_lookup_bench(bsub: argparse._SubParsersAction) -> None:
    """``irpe bench rpe-lookup``: the iRPE-K lookup's forms on one attention core, per runtime."""
    p = bsub.add_parser("rpe-lookup", help="the iRPE-K lookup as rows / last-axis Gather / one-hot MatMul on one "
                                           "attention core: ONNX Runtime fp32, OpenVINO f32 and bf16, interleaved")
    p.add_argument("--batch", type=int, default=8, help="images per attention call")
    p.add_argument("--rounds", type=int, default=20, help="interleaved timed rounds (median reported)")
    p.add_argument("--threads", type=int, default=0, help="threads per runtime (default: all cores)")
    p.add_argument("--paths", default="ort-fp32,ov-f32,ov-bf16", help="comma list of ort-fp32, ov-f32, ov-bf16")

    def run(args: argparse.Namespace) -> int:
        from irpe.bench.rpe_lookup import Dims, format_lookup, run_rpe_lookup_bench
        from irpe.server.config import usable_cpus

        paths = tuple(_names(args.paths))
        if args.batch < 1 or args.rounds < 1 or not paths or set(paths) - {"ort-fp32", "ov-f32", "ov-bf16"}:
            raise CLIError("--batch and --rounds must be >= 1; --paths takes ort-fp32, ov-f32, ov-bf16")
        medians = run_rpe_lookup_bench(Dims(batch=args.batch), args.rounds, args.threads or usable_cpus(), paths)
        print(f"one DeiT-S attention core, batch {args.batch}, {args.rounds} interleaved rounds, medians "
              "(+ what the iRPE-K term adds):")
        print(format_lookup(medians))
        return 0

    p.set_defaults(func=run)


def _ints(text: str, flag: str) -> list[int]:
    """A comma list of integers (empty items skipped); otherwise an error naming ``flag``."""
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise CLIError(f"{flag} must be a comma list of integers, got {text!r}") from None


def _names(text: str) -> list[str]:
    """A comma list of names, lower case (empty items skipped)."""
    return [v.strip().lower() for v in text.split(",") if v.strip()]
