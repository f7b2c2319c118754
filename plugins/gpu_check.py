"""``python -m irpe.plugins.gpu_check`` (what scripts/gpu-check.sh runs) on a GPU host, and skipping on CPU.

Steps, each printing ``PASS``/``FAIL``/``SKIP <reason>`` with its time and figures:

1. nvidia-smi: GPU name, compute capability, driver, memory.
2. The Triton kernels on the GPU against NumPy, fp32 and fp16, at the shape corners of tests/plugins (us/call).
3. The ahead-of-time PTX loaded and launched with CuPy with exactly the grid, block, dynamic shared memory and
   argument list the TensorRT plugin declares (inputs, B*H, Lq, Lk, K, output), against NumPy.
4. The PyTorch model on CUDA against ONNX Runtime CPU, fp32 and fp16, and img/s at batch 1 / 8 / 64.
5. Where TensorRT imports: engine build from the exported ONNX and parity with ONNX Runtime.

Exit status 1 if a step failed (a skipped step is not a failure).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .ops import BUCKET_SUM_OP, RPE_INDEX_OP, bucket_sum_ref, rpe_index_ref

# (B, H, L, K): tests/plugins/test_kernels.py's corners (L = skip + grid^2) plus DeiT-S at 224 px
CORNERS = [(1, 1, 49, 9), (64, 1, 51, 82), (1, 2, 578, 82), (64, 1, 197, 9), (2, 3, 576, 9), (8, 6, 197, 82)]
MODEL = "deit_tiny_patch16_224_ctx_product_50_shared_k"
TOLERANCE = {"float32": 1e-4, "float16": 2e-2}


class Skip(Exception):
    """A step that cannot run on this host; the message is the reason."""


def cuda_torch() -> Any:
    """torch with a usable CUDA device, or :class:`Skip` saying what is missing."""
    try:
        import torch
    except ImportError:
        raise Skip("torch is not installed (pip install 'irpe-deploy[export]')") from None
    if not torch.cuda.is_available():
        raise Skip("no CUDA GPU visible to torch")
    return torch


def time_us(fn: Callable[[], object], sync: Callable[[], object], reps: int = 50) -> float:
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


def step_nvidia_smi() -> str:
    if shutil.which("nvidia-smi") is None:
        raise Skip("nvidia-smi not found (no NVIDIA driver on this host)")
    res = subprocess.run(["nvidia-smi", "--query-gpu=name,compute_cap,driver_version,memory.total",
                          "--format=csv,noheader"], capture_output=True, text=True, timeout=60)
    if res.returncode != 0:
        raise RuntimeError(f"nvidia-smi failed: {res.stderr.strip()}")
    return res.stdout.strip()


def _check_kernels(torch: Any, kernels: Any, dtype: Any, corner: tuple[int, ...]) -> tuple[float, float]:
    b, h, lq, k = corner
    lut, attn, index = problem(b, h, lq, k)
    t_lut, t_attn = (torch.from_numpy(a).cuda().to(dtype) for a in (lut, attn))
    t_idx, tol = torch.from_numpy(index).cuda(), TOLERANCE[str(dtype).split(".")[-1]]
    got = kernels.rpe_index(t_lut, t_idx).float().cpu().numpy()
    np.testing.assert_allclose(got, rpe_index_ref(t_lut.float().cpu().numpy(), index), rtol=tol, atol=tol)
    got = kernels.bucket_sum(t_attn, t_idx, k).float().cpu().numpy()
    want = bucket_sum_ref(t_attn.float().cpu().numpy().astype(np.float64), index, k)
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    sync = torch.cuda.synchronize
    return (time_us(lambda: kernels.rpe_index(t_lut, t_idx), sync),
            time_us(lambda: kernels.bucket_sum(t_attn, t_idx, k), sync))


def step_triton_kernels() -> str:
    torch = cuda_torch()
    try:
        from . import kernels
    except ImportError:
        raise Skip("triton is not installed (pip install 'irpe-deploy[plugins]')") from None
    lines = []
    for dtype in (torch.float32, torch.float16):
        for corner in CORNERS:
            idx_us, sum_us = _check_kernels(torch, kernels, dtype, corner)
        lines.append(f"{str(dtype).split('.')[-1]} all {len(CORNERS)} corners ok; at B,H,L,K={corner}: "
                     f"RPEIndex {idx_us:.1f} us/call, RPEBucketSum {sum_us:.1f} us/call")
    return "; ".join(lines)


def _launch_ptx(cupy: Any, ck: Any, x: np.ndarray, index: np.ndarray, out_shape: tuple[int, ...],
                dtype: Any) -> np.ndarray:
    """Launch as TensorRT's AOT path does: args = inputs, (B*H, Lq, Lk, K) as int32, outputs."""
    module = cupy.cuda.function.Module()
    module.load(ck.ptx.encode())
    fn = module.get_function(ck.kernel_name)
    b, h, lq, lk = x.shape[0], x.shape[1], index.shape[0], index.shape[1]
    k = out_shape[-1] if ck.block_k else x.shape[-1]
    y = cupy.full(out_shape, cupy.nan, dtype)
    args = (cupy.asarray(x.astype(dtype)), cupy.asarray(index), *np.int32([b * h, lq, lk, k]), y)
    fn(ck.grid(b * h, lq), (ck.block_x, 1, 1), args, shared_mem=ck.shared_mem)
    cupy.cuda.Device().synchronize()
    return cupy.asnumpy(y).astype(np.float64)


def step_ptx_with_cupy() -> str:
    torch = cuda_torch()
    try:
        import cupy
    except ImportError:
        raise Skip("cupy is not installed (pip install cupy-cuda12x)") from None
    from .ptx import compile_ptx

    major, minor = torch.cuda.get_device_capability()
    arch, done = major * 10 + minor, 0
    for dtype, name in ((np.float32, "fp32"), (np.float16, "fp16")):
        for b, h, lq, k in CORNERS:
            lut, attn, index = problem(b, h, lq, k, seed=1)
            ck = compile_ptx(RPE_INDEX_OP, name, arch)
            got = _launch_ptx(cupy, ck, lut, index, (b, h, lq, lq), dtype)
            np.testing.assert_allclose(got, rpe_index_ref(lut.astype(dtype), index), rtol=0, atol=0)
            ck = compile_ptx(BUCKET_SUM_OP, name, arch, num_buckets=k)
            got = _launch_ptx(cupy, ck, attn, index, (b, h, lq, k), dtype)
            tol = TOLERANCE["float32" if name == "fp32" else "float16"]
            np.testing.assert_allclose(got, bucket_sum_ref(attn.astype(dtype).astype(np.float64), index, k),
                                       rtol=tol, atol=tol)
            done += 2
    return f"{done} launches on sm_{arch} (PTX ISA of {ck.ptx.split('.version ')[1].split()[0]}) match NumPy"


def _export_onnx(model: Any, workdir: Path) -> Path:
    import onnx

    from irpe.export.onnx import build_onnx

    path = workdir / "model.onnx"
    onnx.save(build_onnx(model), str(path))
    return path


def _images_per_second(torch: Any, model: Any, batch: int, dtype: Any) -> float:
    x = torch.randn(batch, 3, 224, 224, device="cuda", dtype=dtype)
    return batch / time_us(lambda: model(x), torch.cuda.synchronize, reps=10) * 1e6


def step_torch_vs_onnxruntime(workdir: Path) -> str:
    torch = cuda_torch()
    from irpe.export.parity import ort_session
    from irpe.models import create_model

    model = create_model(MODEL, img_size=224).eval()
    path = _export_onnx(model, workdir)
    x = np.random.default_rng(0).standard_normal((8, 3, 224, 224), dtype=np.float32)
    want = ort_session(path).run(None, {"images": x})[0]
    lines = []
    for dtype in (torch.float32, torch.float16):
        m = model.to("cuda", dtype)
        with torch.inference_mode():
            diff = float(np.abs(m(torch.from_numpy(x).to("cuda", dtype)).float().cpu().numpy() - want).max())
            rates = [f"b{n} {_images_per_second(torch, m, n, dtype):.0f} img/s" for n in (1, 8, 64)]
        name = str(dtype).split(".")[-1]
        lines.append(f"{name} max|diff| {diff:.1e} (tol {TOLERANCE[name]:g}), " + ", ".join(rates))
        if diff > TOLERANCE[name] * 10:
            raise AssertionError("; ".join(lines))
    return f"{MODEL}: " + "; ".join(lines)


def step_tensorrt(workdir: Path) -> str:
    cuda_torch()
    from irpe.export.tensorrt import TensorRTUnavailable, compare_engine_with_onnxruntime, engine_from_onnx

    onnx_path = workdir / "model.onnx"
    if not onnx_path.is_file():
        raise Skip("no ONNX model from the previous step")
    start = time.perf_counter()
    try:
        plan = engine_from_onnx(onnx_path, workdir / "model.plan", max_batch=8, img_size=224, use_plugin=False)
    except TensorRTUnavailable as e:
        raise Skip(str(e)) from None
    built = time.perf_counter() - start
    report = compare_engine_with_onnxruntime(plan, onnx_path, img_size=224, batch_sizes=(1, 8))
    if not report["ok"]:
        raise AssertionError(f"engine vs ONNX Runtime: {report}")
    return f"engine built in {built:.0f} s; max|diff| vs ONNX Runtime {report['max_abs_diff']:.1e}"


def steps(workdir: Path) -> list[tuple[str, Callable[[], str]]]:
    return [("nvidia-smi", step_nvidia_smi), ("Triton kernels vs NumPy", step_triton_kernels),
            ("AOT PTX launched with CuPy", step_ptx_with_cupy),
            ("PyTorch CUDA vs ONNX Runtime CPU", lambda: step_torch_vs_onnxruntime(workdir)),
            ("TensorRT engine + parity", lambda: step_tensorrt(workdir))]


def run_all(out: Any = sys.stdout) -> int:
    """Run every step, one line each; 1 if any failed."""
    failed = 0
    with tempfile.TemporaryDirectory(prefix="irpe-gpu-check-") as tmp:
        for name, fn in steps(Path(tmp)):
            start = time.perf_counter()
            try:
                status, detail = "PASS", fn()
            except Skip as e:
                status, detail = "SKIP", str(e)
            except Exception as e:  # noqa: BLE001 - report it and go on with the next step
                status, detail = "FAIL", f"{type(e).__name__}: {str(e)[:600]}"
                failed += 1
            print(f"{status} {name} ({time.perf_counter() - start:.1f} s): {detail}", file=out, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(run_all())
