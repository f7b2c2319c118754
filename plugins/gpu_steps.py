"""The GPU steps of :mod:`irpe.plugins.gpu_check`: Triton kernels, AOT PTX with CuPy, PyTorch CUDA against ONNX
Runtime, ONNX Runtime's CUDA provider, TensorRT.

Each step takes a :class:`~irpe.plugins.gpu_check.StepContext` and returns a
:class:`~irpe.plugins.gpu_check.Finding`, raises :class:`~irpe.plugins.gpu_check.Skip` with the reason when a
dependency is missing, or raises on a mismatch. Nothing here needs a compiled extension of ours: ONNX Runtime
runs the exported graph's standard ops, and the project is importable from a plain checkout.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .gpu_check import Finding, Skip, StepContext
from .ops import BUCKET_SUM_OP, RPE_INDEX_OP, bucket_sum_ref, rpe_index_ref

TOLERANCE = {"float32": 1e-4, "float16": 2e-2}  # kernels against NumPy (fp16: inputs rounded, fp32 accumulation)
# model logits against ONNX Runtime fp32: bound = atol + rtol * max|logit|
LOGIT_TOLERANCE = {"float32": (1e-4, 1e-3), "float16": (5e-2, 5e-2)}
PARITY_BATCH = 8


def require(module: str, why: str) -> Any:
    """``import module``, or :class:`Skip` naming what is missing and how to get it.

    Args:
        module: the import name.
        why: how to get it, for the reason.

    Returns:
        The module.

    Raises:
        Skip: it cannot be imported.
    """
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise Skip(f"{module} is not installed ({why}): {e}") from None


def require_torch(context: StepContext) -> Any:
    """torch with the context's device usable, or :class:`Skip` saying what is missing."""
    torch = require("torch", "pip install '.[export]' from the irpe-deploy checkout's root")
    if context.device == "cuda" and not torch.cuda.is_available():
        raise Skip("no CUDA GPU visible to torch")
    return torch


def require_cuda(context: StepContext, what: str) -> None:
    """:class:`Skip` unless the steps run on CUDA (``what`` needs a GPU whatever torch does)."""
    if context.device != "cuda":
        raise Skip(f"{what} needs a CUDA GPU (this run uses {context.device})")


def synchronizer(torch: Any, device: str) -> Callable[[], object]:
    """The call that waits for ``device``'s queued work."""
    return torch.cuda.synchronize if device == "cuda" else (lambda: None)


def time_us(fn: Callable[[], object], sync: Callable[[], object], reps: int) -> float:
    """Mean microseconds per call after one warm-up call."""
    fn()
    sync()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    sync()
    return (time.perf_counter() - start) / reps * 1e6


def problem(b: int, h: int, lq: int, k: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(lut [B,H,L,K], attn [B,H,L,L], index int32 [L,L]) with both ends of the bucket range present."""
    rng = np.random.default_rng(seed)
    index = rng.integers(0, k, (lq, lq)).astype(np.int32)
    index[0, 0], index[-1, -1] = 0, k - 1
    return (rng.standard_normal((b, h, lq, k)).astype(np.float32), rng.random((b, h, lq, lq)).astype(np.float32),
            index)


def _check_kernels(torch: Any, kernels: Any, context: StepContext, dtype: Any,
                   corner: tuple[int, int, int, int]) -> dict[str, float]:
    b, h, lq, k = corner
    lut, attn, index = problem(b, h, lq, k)
    t_lut, t_attn = (torch.from_numpy(a).to(context.device, dtype) for a in (lut, attn))
    t_idx, tol = torch.from_numpy(index).to(context.device), TOLERANCE[str(dtype).split(".")[-1]]
    got = kernels.rpe_index(t_lut, t_idx).float().cpu().numpy()
    np.testing.assert_allclose(got, rpe_index_ref(t_lut.float().cpu().numpy(), index), rtol=tol, atol=tol)
    got = kernels.bucket_sum(t_attn, t_idx, k).float().cpu().numpy()
    want = bucket_sum_ref(t_attn.float().cpu().numpy().astype(np.float64), index, k)
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    sync, reps = synchronizer(torch, context.device), context.profile.reps
    return {"rpe_index_us": round(time_us(lambda: kernels.rpe_index(t_lut, t_idx), sync, reps), 1),
            "bucket_sum_us": round(time_us(lambda: kernels.bucket_sum(t_attn, t_idx, k), sync, reps), 1)}


def step_triton_kernels(context: StepContext) -> Finding:
    """RPEIndex and RPEBucketSum (Triton) on the device against NumPy at every corner, fp32 and fp16.

    Args:
        context: the scratch folder, the profile and the device.

    Returns:
        The finding: one line and its figures.

    Raises:
        Skip: no torch, no GPU or no triton.
        AssertionError: a kernel's output differs from NumPy beyond TOLERANCE.
    """
    torch = require_torch(context)
    require("triton", "pip install '.[plugins]' from the irpe-deploy checkout's root")
    from . import kernels

    figures: dict[str, Any] = {}
    lines = []
    for dtype in (torch.float32, torch.float16):
        name = str(dtype).split(".")[-1]
        figures[name] = {"x".join(map(str, corner)): _check_kernels(torch, kernels, context, dtype, corner)
                         for corner in context.profile.corners}
        last = figures[name]["x".join(map(str, context.profile.corners[-1]))]
        lines.append(f"{name} ok at {len(context.profile.corners)} shape corners; at B,H,L,K="
                     f"{context.profile.corners[-1]}: RPEIndex {last['rpe_index_us']:.1f} us/call, "
                     f"RPEBucketSum {last['bucket_sum_us']:.1f} us/call")
    return Finding("; ".join(lines), figures)


def _launch_ptx(cupy: Any, compiled: Any, x: np.ndarray, index: np.ndarray, out_shape: tuple[int, ...],
                dtype: Any) -> np.ndarray:
    """Launch as TensorRT's AOT path does: args = inputs, (B*H, Lq, Lk, K) as int32, outputs."""
    module = cupy.cuda.function.Module()
    module.load(compiled.ptx.encode())
    kernel = module.get_function(compiled.kernel_name)
    b, h, lq, lk = x.shape[0], x.shape[1], index.shape[0], index.shape[1]
    k = out_shape[-1] if compiled.block_k else x.shape[-1]
    out = cupy.full(out_shape, cupy.nan, dtype)
    args = (cupy.asarray(x.astype(dtype)), cupy.asarray(index), *np.int32([b * h, lq, lk, k]), out)
    kernel(compiled.grid(b * h, lq), (compiled.block_x, 1, 1), args, shared_mem=compiled.shared_mem)
    cupy.cuda.Device().synchronize()
    return cupy.asnumpy(out).astype(np.float64)


def _check_ptx_corner(cupy: Any, arch: int, corner: tuple[int, int, int, int], dtype: Any, name: str) -> None:
    from .ptx import compile_ptx

    b, h, lq, k = corner
    lut, attn, index = problem(b, h, lq, k, seed=1)
    compiled = compile_ptx(RPE_INDEX_OP, name, arch)
    got = _launch_ptx(cupy, compiled, lut, index, (b, h, lq, lq), dtype)
    np.testing.assert_allclose(got, rpe_index_ref(lut.astype(dtype), index), rtol=0, atol=0)
    compiled = compile_ptx(BUCKET_SUM_OP, name, arch, num_buckets=k)
    got = _launch_ptx(cupy, compiled, attn, index, (b, h, lq, k), dtype)
    tol = TOLERANCE["float32" if name == "fp32" else "float16"]
    np.testing.assert_allclose(got, bucket_sum_ref(attn.astype(dtype).astype(np.float64), index, k),
                               rtol=tol, atol=tol)


def step_ptx_with_cupy(context: StepContext) -> Finding:
    """The AOT PTX the TensorRT plugin embeds, launched with CuPy exactly as declared, against NumPy.

    Args:
        context: the scratch folder, the profile and the device.

    Returns:
        The finding: one line and its figures.

    Raises:
        Skip: not on CUDA, no torch, no CuPy or no triton.
        AssertionError: a launch's output differs from NumPy.
    """
    require_cuda(context, "launching PTX")
    torch = require_torch(context)
    cupy = require("cupy", "pip install cupy-cuda12x")
    require("triton", "pip install '.[plugins]' from the irpe-deploy checkout's root")
    from .ptx import compile_ptx

    major, minor = torch.cuda.get_device_capability()
    arch = major * 10 + minor
    for dtype, name in ((np.float32, "fp32"), (np.float16, "fp16")):
        for corner in context.profile.corners:
            _check_ptx_corner(cupy, arch, corner, dtype, name)
    isa = compile_ptx(RPE_INDEX_OP, "fp32", arch).ptx.split(".version ")[1].split()[0]
    launches = 4 * len(context.profile.corners)
    return Finding(f"{launches} launches on sm_{arch} (PTX ISA {isa}) match NumPy",
                   {"launches": launches, "arch": arch, "ptx_isa": isa})


def _model(torch: Any, context: StepContext) -> Any:
    """The profile's model with seeded random weights and non-zero iRPE tables (so the lookups count)."""
    from irpe.models import create_model

    torch.manual_seed(0)
    model = create_model(context.profile.model, img_size=context.profile.img_size).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lookup_table" in name:
                param.normal_(0.0, 0.1)
    return model


def _export_onnx(model: Any, path: Path, *, rpe_plugin: bool = False) -> Path:
    import onnx

    from irpe.export.onnx import build_onnx

    onnx.save(build_onnx(model, rpe_plugin=rpe_plugin), str(path))
    return path


def _images_per_second(torch: Any, model: Any, context: StepContext, batch: int, dtype: Any) -> float:
    size = context.profile.img_size
    x = torch.randn(batch, 3, size, size, device=context.device, dtype=dtype)
    reps = max(2, context.profile.reps // 5)
    return batch / time_us(lambda: model(x), synchronizer(torch, context.device), reps) * 1e6


def _compare_dtype(torch: Any, model: Any, context: StepContext, x: np.ndarray, want: np.ndarray,
                   dtype: Any) -> dict[str, Any]:
    name = str(dtype).split(".")[-1]
    on_device = model.to(context.device, dtype)
    with torch.inference_mode():
        got = on_device(torch.from_numpy(x).to(context.device, dtype)).float().cpu().numpy()
        rates = {f"b{n}": round(_images_per_second(torch, on_device, context, n, dtype), 1)
                 for n in context.profile.batches}
    atol, rtol = LOGIT_TOLERANCE[name]
    bound = atol + rtol * float(np.abs(want).max())
    diff = float(np.abs(got - want).max())
    figures = {"max_abs_diff": diff, "bound": bound, "top1_equal": float((got.argmax(1) == want.argmax(1)).mean()),
               "img_per_s": rates}
    if diff > bound:
        raise AssertionError(f"{name}: max|PyTorch {context.device} - ONNX Runtime| {diff:.3g} exceeds "
                             f"{bound:.3g} (= {atol:g} + {rtol:g} x max|logit|); figures {figures}")
    return figures


def step_torch_vs_onnxruntime(context: StepContext) -> Finding:
    """The exported graph on ONNX Runtime CPU against the PyTorch model on the device, fp32 and fp16; img/s.

    Args:
        context: the scratch folder, the profile and the device.

    Returns:
        The finding: one line and its figures.

    Raises:
        Skip: no torch, no GPU, no onnx or no onnxruntime.
        AssertionError: the logits differ beyond LOGIT_TOLERANCE.
    """
    torch = require_torch(context)
    require("onnx", "pip install '.[export]' from the irpe-deploy checkout's root")
    require("onnxruntime", "pip install onnxruntime")
    from irpe.export.parity import ort_session

    model = _model(torch, context)
    path = _export_onnx(model, context.workdir / "model.onnx")
    size = context.profile.img_size
    x = np.random.default_rng(0).standard_normal((PARITY_BATCH, 3, size, size), dtype=np.float32)
    want = ort_session(path).run(None, {"images": x})[0]
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False  # fp32 means fp32
    try:
        figures = {str(dtype).split(".")[-1]: _compare_dtype(torch, model, context, x, want, dtype)
                   for dtype in (torch.float32, torch.float16)}
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
    lines = [f"{name} max|diff| {f['max_abs_diff']:.1e} (bound {f['bound']:.1e}), "
             + ", ".join(f"{b} {rate:.0f} img/s" for b, rate in f["img_per_s"].items())
             for name, f in figures.items()]
    return Finding(f"{context.profile.model} on {context.device}: " + "; ".join(lines), figures)


def step_onnxruntime_cuda(context: StepContext) -> Finding:
    """The exported graph on ONNX Runtime's CUDA execution provider against its CPU provider.

    Args:
        context: the scratch folder, the profile and the device.

    Returns:
        The finding: one line and its figures.

    Raises:
        Skip: not on CUDA, no onnxruntime-gpu, or no model.onnx from the step before.
        AssertionError: ONNX Runtime fell back to the CPU or the logits differ.
    """
    require_cuda(context, "ONNX Runtime's CUDA provider")
    ort = require("onnxruntime", "pip install '.[gpu]' from the irpe-deploy checkout's root")
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise Skip(f"this onnxruntime has no CUDAExecutionProvider (providers: {ort.get_available_providers()}); "
                   "onnxruntime-gpu has it: pip install '.[gpu]' from the irpe-deploy checkout's root")
    path = context.workdir / "model.onnx"
    if not path.is_file():
        raise Skip("no model.onnx: the PyTorch CUDA vs ONNX Runtime CPU step did not export one")
    size = context.profile.img_size
    x = np.random.default_rng(1).standard_normal((PARITY_BATCH, 3, size, size), dtype=np.float32)
    cpu = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    cuda = ort.InferenceSession(str(path), providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    if cuda.get_providers()[0] != "CUDAExecutionProvider":
        raise AssertionError(f"ONNX Runtime fell back to {cuda.get_providers()} (CUDA or cuDNN libraries missing)")
    want, got = (session.run(None, {"images": x})[0] for session in (cpu, cuda))
    diff = float(np.abs(got - want).max())
    bound = 1e-3 + 1e-3 * float(np.abs(want).max())  # cuDNN may pick TF32 convolutions
    per_batch_us = time_us(lambda: cuda.run(None, {"images": x}), lambda: None, context.profile.reps)
    figures = {"max_abs_diff": diff, "bound": bound, "img_per_s_b8": round(PARITY_BATCH / per_batch_us * 1e6, 1)}
    if diff > bound:
        raise AssertionError(f"ONNX Runtime CUDA vs CPU: max|diff| {diff:.3g} exceeds {bound:.3g}")
    return Finding(f"max|diff| vs CPU {diff:.1e} (bound {bound:.1e}), b{PARITY_BATCH} "
                   f"{figures['img_per_s_b8']:.0f} img/s", figures)


def _engine_parity(onnx_path: Path, plan_path: Path, context: StepContext, *, use_plugin: bool) -> dict[str, Any]:
    from irpe.export.tensorrt import compare_engine_with_onnxruntime, engine_from_onnx

    start = time.perf_counter()
    engine_from_onnx(onnx_path, plan_path, max_batch=PARITY_BATCH, img_size=context.profile.img_size,
                     use_plugin=use_plugin)
    built = time.perf_counter() - start
    report = compare_engine_with_onnxruntime(plan_path, onnx_path, img_size=context.profile.img_size,
                                             batch_sizes=(1, PARITY_BATCH))
    if not report["ok"]:
        raise AssertionError(f"{plan_path.name} vs ONNX Runtime: {report}")
    return {"build_s": round(built, 1), "max_abs_diff": report["max_abs_diff"]}


def step_tensorrt(context: StepContext) -> Finding:
    """TensorRT engines from the exported graphs (standard, and iRPE AOT plugins) against ONNX Runtime.

    Args:
        context: the scratch folder, the profile and the device.

    Returns:
        The finding: one line and its figures.

    Raises:
        Skip: not on CUDA, no torch, no onnx, no supported TensorRT, or no model.onnx.
        AssertionError: an engine's logits differ from ONNX Runtime.
    """
    require_cuda(context, "TensorRT")
    torch = require_torch(context)
    require("onnx", "pip install '.[export]' from the irpe-deploy checkout's root")
    from irpe.export.tensorrt import TensorRTUnavailable, import_tensorrt

    try:
        trt, _ = import_tensorrt("the TensorRT step of the GPU check")
    except TensorRTUnavailable as e:
        raise Skip(str(e)) from None
    onnx_path = context.workdir / "model.onnx"
    if not onnx_path.is_file():
        raise Skip("no model.onnx: the PyTorch CUDA vs ONNX Runtime CPU step did not export one")
    plugin_path = _export_onnx(_model(torch, context), context.workdir / "model.plugin.onnx", rpe_plugin=True)
    figures: dict[str, Any] = {"tensorrt": trt.__version__}
    figures["standard"] = _engine_parity(onnx_path, context.workdir / "model.plan", context, use_plugin=False)
    figures["rpe_plugin"] = _engine_parity(plugin_path, context.workdir / "model.plugin.plan", context,
                                           use_plugin=True)
    return Finding(f"TensorRT {trt.__version__}: " + "; ".join(
        f"{kind} engine built in {f['build_s']:.0f} s, max|diff| vs ONNX Runtime {f['max_abs_diff']:.1e}"
        for kind, f in figures.items() if kind != "tensorrt"), figures)
