"""``irpe export``: checkpoint -> artifact directory (ONNX, model.json, TensorRT plan, Triton repo)."""

from __future__ import annotations

import argparse

from irpe.commands import CLIError


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="export a checkpoint to ONNX / TensorRT / a Triton repository")
    p.add_argument("checkpoint", help="checkpoint file, or a published variant name with --pretrained")
    p.add_argument("-o", "--output", required=True, help="artifact directory to write")
    p.add_argument("--pretrained", action="store_true", help="CHECKPOINT names a published variant: download its "
                   "released weights (cached; IRPE_CACHE, IRPE_MODEL_MIRROR, IRPE_OFFLINE)")
    p.add_argument("--model", help="registered variant name (default: from the checkpoint)")
    add_model_overrides(p)
    p.add_argument("--format", default="onnx", help="comma list of onnx, tensorrt, triton")
    p.add_argument("--rpe-plugin", action="store_true", help="emit the iRPE lookups as irpe::RPEIndex / "
                   "RPEBucketSum plugin ops (default: standard ONNX ops)")
    p.add_argument("--opset", type=int, default=17, help="ONNX opset of model.onnx")
    p.add_argument("--max-batch", type=int, default=32,
                   help="largest batch of the TensorRT plan's profile and of the Triton model config")
    p.add_argument("--fp16", action="store_true", help="write model.onnx as a float16 graph (fp16 weights and "
                   "compute; FP32 images in, FP32 logits out) and build any TensorRT plan from it (default: FP32)")
    add_int8_options(p)
    p.set_defaults(func=run)


def add_int8_options(p: argparse.ArgumentParser) -> None:
    """--int8 and its calibration / fidelity options."""
    g = p.add_argument_group("int8 / bf16 (CPU: OpenVINO, ONNX Runtime; GPU: TensorRT explicit quantization)")
    g.add_argument("--int8", action="store_true", help="model.onnx becomes a calibrated int8 QDQ graph")
    g.add_argument("--calibration", help="'digits' or a directory of images: calibrates --int8 and holds "
                   "out other images for the fidelity reports (also the bf16 one) in model.json (default: none, "
                   "no fidelity report)")
    g.add_argument("--calibration-size", type=int, default=64, help="calibration images (default 64)")
    g.add_argument("--heldout-size", type=int, default=400,
                   help="held-out images for fidelity (default 400; digits has 360)")
    g.add_argument("--calibration-method", choices=["percentile", "entropy", "minmax"], default="percentile",
                   help="how --int8 sets each activation's range from the calibration images")
    g.add_argument("--int8-scope", choices=["linear", "rpe", "attention", "all"], default="linear",
                   help="MatMuls quantized: linear layers (default); rpe: + iRPE matmuls; attention: + q @ k^T; "
                        "all: both")
    g.add_argument("--min-top1", type=float, help="int8 floor: top-1 agreement with fp32 (default 0.99)")
    g.add_argument("--min-cosine", type=float, help="int8 floor: mean logit cosine with fp32 (default 0.99)")
    g.add_argument("--max-accuracy-drop", type=float,
                   help="int8 floor on labelled held-out images, as a fraction (default 0.003 = 0.3 point)")


def add_model_overrides(p: argparse.ArgumentParser) -> None:
    """The create_model overrides, shared by export, train and classify."""
    p.add_argument("--img-size", type=int, help="input image side in pixels (default: the variant's)")
    p.add_argument("--num-classes", type=int, help="classifier outputs (default: the variant's)")
    p.add_argument("--rpe-on", help='where relative position encoding applies: "" or any of q, k, v combined, '
                   "e.g. qkv (default: the variant's)")
    p.add_argument("--rpe-method", choices=["euc", "quant", "cross", "product"],
                   help="how relative positions map to buckets (default: the variant's)")
    p.add_argument("--rpe-mode", choices=["bias", "ctx"],
                   help="bias: a learned scalar per bucket; ctx: contextual, from the queries, keys or values "
                   "(default: the variant's)")
    p.add_argument("--rpe-ratio", type=float, help="bucket ratio: larger gives more, finer buckets "
                   "(default: the variant's)")
    p.add_argument("--rpe-unshared", action="store_true", help="one table per head (default: one table shared "
                   "by the heads)")


def model_overrides(args: argparse.Namespace) -> dict[str, object]:
    """create_model keyword overrides from parsed args (None values dropped)."""
    out = {"img_size": args.img_size, "num_classes": args.num_classes, "rpe_on": args.rpe_on,
           "rpe_method": args.rpe_method, "rpe_mode": args.rpe_mode, "rpe_ratio": args.rpe_ratio,
           "rpe_shared": False if args.rpe_unshared else None}
    return {k: v for k, v in out.items() if v is not None}


def int8_options(args: argparse.Namespace) -> dict[str, object]:
    """reduced_precision keywords from the parsed --calibration-* / floor options."""
    if args.calibration_size < 1 or args.heldout_size < 1:
        raise CLIError("--calibration-size and --heldout-size must be >= 1")
    floors = {"top1_agreement": args.min_top1, "cosine_mean": args.min_cosine,
              "accuracy_drop": args.max_accuracy_drop}
    return {"calibration_size": args.calibration_size, "heldout": args.heldout_size,
            "method": args.calibration_method, "scope": args.int8_scope, "floors": floors}


def run(args: argparse.Namespace) -> int:
    """Export, print where the artifact went; library errors become one-line CLI errors (exit 2)."""
    from irpe.export import ExportOptions, export_artifact

    if args.max_batch < 1:
        raise CLIError(f"--max-batch must be >= 1, got {args.max_batch}")
    checkpoint, name = pretrained_checkpoint(args.checkpoint, args.model) if args.pretrained else \
        (args.checkpoint, args.model)
    options = ExportOptions(name=name, overrides=model_overrides(args), formats=args.format,
                            rpe_plugin=args.rpe_plugin, opset=args.opset, max_batch=args.max_batch, fp16=args.fp16,
                            progress=True, int8=args.int8, calibration=args.calibration,
                            calibration_options=int8_options(args))
    out = export_artifact(checkpoint, args.output, options)
    print(out / "model.json")
    return 0


def pretrained_checkpoint(name: str, model: str | None) -> tuple[str, str]:
    """(cached checkpoint path, variant name) of a published variant, downloading it when needed."""
    from irpe.models.pretrained import download_pretrained

    return str(download_pretrained(name)), model or name
