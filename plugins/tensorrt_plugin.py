"""TensorRT quickly deployable plugins (``tensorrt.plugin``, TensorRT >= 10.9) for irpe::RPEIndex and
irpe::RPEBucketSum.

Written to NVIDIA's documented QDP API (TensorRT OSS ``samples/python/quickly_deployable_plugins`` and the
``tensorrt.plugin`` docstrings): ``@trtp.register`` describes outputs symbolically, ``@trtp.autotune``
advertises FP32/FP16 (index INT32), ``@trtp.impl`` is the JIT path (launches the Triton kernel through
torch on the TensorRT stream) and ``@trtp.aot_impl`` returns ``(kernel_name, ptx, KernelLaunchParams,
SymIntExprs)`` so the engine embeds the PTX and runs without Python. Kernel scalar args sit between the
input and output tensors, matching :mod:`irpe.plugins.kernels`.

This module deliberately has no ``from __future__ import annotations``: ``trtp.register`` inspects real
annotation objects. ``tensorrt`` is imported only inside :func:`register`.

``num_buckets`` is declared ``npt.NDArray[np.int32]``, not ``int``: the ONNX parser hands an INT attribute over
as a kINT32 field of length 1 (onnx-tensorrt ``loadFields``), whose ``.data`` is a 1-element array
(pyPlugin.cpp), and TensorRT 10.x's creator converts ``int`` attributes with ``int(f.data)``
(tensorrt/plugin/_lib.py), which NumPy 2.4 (installed here) rejects for 1-D arrays; arrays use ``f.data.astype``.
"""

import functools

import numpy as np
import numpy.typing as npt

from .ops import BUCKET_SUM_OP, PLUGIN_NAMESPACE, RPE_INDEX_OP, plugin_id

MIN_TENSORRT = (10, 9)  # first release with aot_impl (10.8's tensorrt.plugin has none)
MAX_TENSORRT = (12, 0)  # exclusive: 10.9 .. 11.x are exercised by tests/plugins/test_tensorrt_plugin.py
TENSORRT_PIP = "tensorrt-cu12>=10.9,<12"  # as the Dockerfile installs it


class TensorRTUnavailable(RuntimeError):
    """TensorRT (or a GPU it needs) is not available here; the message says what was asked and how to fix it."""


def missing_tensorrt_message(what: str, detail: str = "") -> str:
    """The user-facing message when ``what`` needs TensorRT and it cannot be imported."""
    found = f" ({detail})" if detail else ""
    return (f"{what} needs NVIDIA TensorRT >= {MIN_TENSORRT[0]}.{MIN_TENSORRT[1]} with its Python bindings, "
            f"which were not found{found}. Run on a machine with an NVIDIA GPU and CUDA 12+, either inside the "
            "NVIDIA container `nvcr.io/nvidia/tensorrt:<yy.mm>-py3` or after `pip install tensorrt` "
            f"('{TENSORRT_PIP}') on a CUDA host; the ONNX export and ONNX Runtime paths do not need TensorRT.")


def import_tensorrt(what: str):
    """``(tensorrt, tensorrt.plugin)``, or :class:`TensorRTUnavailable` with a clear message."""
    try:
        import tensorrt as trt
    except ImportError as e:
        raise TensorRTUnavailable(missing_tensorrt_message(what, f"import tensorrt: {e}")) from None
    version = tuple(int(p) for p in trt.__version__.split(".")[:2])
    if version < MIN_TENSORRT:
        raise TensorRTUnavailable(missing_tensorrt_message(what, f"found TensorRT {trt.__version__}, too old "
                                                                 "for ONNX-imported AOT Python plugins"))
    if version >= MAX_TENSORRT:
        raise TensorRTUnavailable(f"{what} supports TensorRT {MIN_TENSORRT[0]}.{MIN_TENSORRT[1]} to "
                                  f"{MAX_TENSORRT[0] - 1}.x; found {trt.__version__}. Install a supported "
                                  f"release: pip install '{TENSORRT_PIP}'")
    import tensorrt.plugin as trtp

    return trt, trtp


def _dtype_name(trt, dtype) -> str:
    if dtype == trt.float32:
        return "fp32"
    if dtype == trt.float16:
        return "fp16"
    raise ValueError(f"iRPE plugins support FP32 and FP16, got {dtype}")


def _current_arch() -> int:
    """Compute capability of the GPU the engine is being built on, e.g. 80 or 90."""
    from triton.runtime import driver

    target = driver.active.get_current_target()
    return int(target.arch)


def _aot_return(trtp):
    """The return annotation ``trtp.aot_impl`` requires (tensorrt/plugin/_validate.py, _validate_aot_impl)."""
    return tuple[str | bytes, str | bytes, trtp.KernelLaunchParams, trtp.SymIntExprs]


def _scalar(attr) -> int:
    """A plugin attribute declared as a 1-element int array, as a Python int (SymInt32 needs a real int)."""
    arr = np.asarray(attr).reshape(-1)
    if arr.size != 1:
        raise ValueError(f"num_buckets must be a single integer, got {arr.size} values")
    return int(arr[0])


def _launch(trtp, ck, x):
    """KernelLaunchParams for grid (Lq, cdiv(B*H, BLOCK_BH)) and the symbolic B*H."""
    s = x.shape_expr
    bh = s[0] * s[1]
    params = trtp.KernelLaunchParams()
    params.grid_x = s[2]
    params.grid_y = trtp.cdiv(bh, ck.block_bh)
    params.block_x = ck.block_x
    params.shared_mem = ck.shared_mem
    return params, bh


def _define_rpe_index(trt, trtp) -> None:
    from .ptx import compile_ptx

    pid = plugin_id(RPE_INDEX_OP)

    @trtp.register(pid)
    def rpe_index_desc(lut: trtp.TensorDesc, index: trtp.TensorDesc) -> trtp.TensorDesc:
        s = lut.shape_expr
        return trtp.from_shape_expr((s[0], s[1], s[2], index.shape_expr[1]), dtype=lut.dtype)

    @trtp.autotune(pid)
    def rpe_index_autotune(lut, index, outputs):
        return [trtp.AutoTuneCombination("FP32|FP16, INT32, FP32|FP16", "LINEAR")]

    @trtp.impl(pid)
    def rpe_index_impl(lut, index, outputs, stream):
        import torch

        from .kernels import rpe_index
        with torch.cuda.stream(torch.cuda.ExternalStream(stream)):
            rpe_index(torch.as_tensor(lut, device="cuda"), torch.as_tensor(index, device="cuda"),
                      out=torch.as_tensor(outputs[0], device="cuda"))

    @trtp.aot_impl(pid)
    def rpe_index_aot(lut, index, outputs, tactic) -> _aot_return(trtp):
        ck = compile_ptx(RPE_INDEX_OP, _dtype_name(trt, lut.dtype), _current_arch())
        params, bh = _launch(trtp, ck, lut)
        s = lut.shape_expr
        args = (bh, s[2], index.shape_expr[1], s[3])  # BH, LQ, LK, K
        extra = trtp.SymIntExprs.from_tuple([trtp.SymInt32(e) for e in args])
        return ck.kernel_name.encode(), ck.ptx.encode(), params, extra


def _define_bucket_sum(trt, trtp) -> None:
    from .ptx import compile_ptx

    pid = plugin_id(BUCKET_SUM_OP)

    @trtp.register(pid)
    def bucket_sum_desc(attn: trtp.TensorDesc, index: trtp.TensorDesc,
                        num_buckets: npt.NDArray[np.int32]) -> trtp.TensorDesc:
        s = attn.shape_expr
        return trtp.from_shape_expr((s[0], s[1], s[2], _scalar(num_buckets)), dtype=attn.dtype)

    @trtp.autotune(pid)
    def bucket_sum_autotune(attn, index, num_buckets, outputs):
        return [trtp.AutoTuneCombination("FP32|FP16, INT32, FP32|FP16", "LINEAR")]

    @trtp.impl(pid)
    def bucket_sum_impl(attn, index, num_buckets, outputs, stream):
        import torch

        from .kernels import bucket_sum
        with torch.cuda.stream(torch.cuda.ExternalStream(stream)):
            bucket_sum(torch.as_tensor(attn, device="cuda"), torch.as_tensor(index, device="cuda"),
                       _scalar(num_buckets), out=torch.as_tensor(outputs[0], device="cuda"))

    @trtp.aot_impl(pid)
    def bucket_sum_aot(attn, index, num_buckets, outputs, tactic) -> _aot_return(trtp):
        ck = compile_ptx(BUCKET_SUM_OP, _dtype_name(trt, attn.dtype), _current_arch(),
                         num_buckets=_scalar(num_buckets))
        params, bh = _launch(trtp, ck, attn)
        args = (bh, attn.shape_expr[2], index.shape_expr[1], _scalar(num_buckets))  # BH, LQ, LK, K
        extra = trtp.SymIntExprs.from_tuple([trtp.SymInt32(e) for e in args])
        return ck.kernel_name.encode(), ck.ptx.encode(), params, extra


@functools.cache
def register() -> None:
    """Register both plugins in TensorRT's plugin registry (idempotent: the first call that succeeds registers,
    later calls return at once; ``register.cache_clear()`` forgets it); raises TensorRTUnavailable."""
    trt, trtp = import_tensorrt(f"registering the {PLUGIN_NAMESPACE}:: TensorRT plugins")
    _define_rpe_index(trt, trtp)
    _define_bucket_sum(trt, trtp)
