"""Ahead-of-time PTX for the iRPE kernels, compiled with no GPU present (triton.compile + GPUTarget).

The result carries what a TensorRT AOT plugin needs: kernel name, PTX text and launch parameters
(block size from ``num_warps``, dynamic shared memory, and the grid as a function of ``B*H`` and ``Lq``).

Triton >= 3.3 appends hidden pointer parameters (``global_scratch``, ``profile_scratch``) to every kernel
entry. TensorRT's AOT launcher passes only inputs, extra scalar args and outputs, so when those hidden
parameters are unused (scratch sizes 0, no reference in the body) they are removed from the ``.entry``
signature; otherwise compilation fails loudly rather than producing a kernel TensorRT cannot launch.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from functools import lru_cache

from .ops import BUCKET_SUM_OP, RPE_INDEX_OP

# Every compute capability TensorRT 10.9+ runs on from Ampere to Blackwell that Triton's bundled ptxas
# (CUDA 12.9) assembles: A100, A10/A40/RTX 30, Orin, L4/L40/RTX 40, H100/H200, B200/GB200, B300, RTX 50, DGX Spark.
ARCHS = (80, 86, 87, 89, 90, 100, 103, 120, 121)
DEFAULT_PTX_VERSION = 80  # PTX ISA 8.0 (CUDA 12.0): loadable by any CUDA 12+ driver that TensorRT 10 needs
# Blackwell targets (Triton emits sm_100a / sm_103a / sm_120a / sm_121a) need a newer ISA; LLVM refuses 8.0
# ("Minimum required PTX version is 8.6" for sm_100a). Their drivers (CUDA >= 12.8/12.9) load these ISAs.
MIN_PTX_VERSION = {100: 86, 101: 86, 103: 88, 120: 87, 121: 88}


def ptx_version_for(arch: int) -> int:
    """The PTX ISA to emit for ``sm_<arch>``: 8.0 up to Hopper, the minimum LLVM accepts for Blackwell."""
    return max(DEFAULT_PTX_VERSION, MIN_PTX_VERSION.get(int(arch), DEFAULT_PTX_VERSION))
_DTYPES = {"fp32": "fp32", "float32": "fp32", "fp16": "fp16", "float16": "fp16"}
_SCALARS = ("BH", "LQ", "LK", "K")


@dataclass(frozen=True)
class CompiledKernel:
    """One AOT-compiled kernel: PTX text plus launch parameters."""

    op: str
    dtype: str
    arch: int
    kernel_name: str
    ptx: str
    num_warps: int
    shared_mem: int
    block_bh: int
    block_j: int
    block_k: int | None = None

    @property
    def block_x(self) -> int:
        """Threads per block (``num_warps * 32``)."""
        return self.num_warps * 32

    def grid(self, bh: int, lq: int) -> tuple[int, int, int]:
        """Concrete grid ``(Lq, cdiv(B*H, BLOCK_BH), 1)``."""
        return lq, -(-bh // self.block_bh), 1


def _signature(op: str, dtype: str) -> dict[str, str]:
    first = "attn_ptr" if op == BUCKET_SUM_OP else "lut_ptr"
    sig = {first: f"*{dtype}", "index_ptr": "*i32"}
    sig.update({name: "i32" for name in _SCALARS})
    sig["out_ptr"] = f"*{dtype}"
    return sig


def strip_unused_trailing_params(ptx: str, kernel_name: str, keep: int) -> str:
    """Drop ``.param`` entries after the first ``keep`` from the kernel's ``.entry`` if the body never reads them."""
    m = re.search(r"\.entry\s+" + re.escape(kernel_name) + r"\s*\((.*?)\)", ptx, flags=re.S)
    if m is None:
        raise ValueError(f"PTX has no .entry {kernel_name}")
    params = [p.strip() for p in m.group(1).split(",") if p.strip()]
    body = ptx[m.end():]
    for extra in params[keep:]:
        pname = extra.split()[-1]
        if re.search(r"\b" + re.escape(pname) + r"\b", body):
            raise RuntimeError(f"kernel {kernel_name} reads hidden parameter {pname}; TensorRT's AOT launcher "
                               "cannot supply it (use a Triton version whose kernel needs no scratch memory)")
    new_params = ",\n".join("\t" + p for p in params[:keep])
    return ptx[:m.start(1)] + "\n" + new_params + "\n" + ptx[m.end(1):]


def _jit_function(op: str):
    """The kernel as a JITFunction, even when TRITON_INTERPRET=1 wrapped it for the interpreter."""
    from triton.runtime.jit import JITFunction

    from . import kernels

    fn = kernels.bucket_sum_kernel if op == BUCKET_SUM_OP else kernels.rpe_index_kernel
    return fn if isinstance(fn, JITFunction) else JITFunction(fn.fn)


def _compile_elsewhere(**kwargs) -> CompiledKernel:
    """compile_ptx in a child interpreter without TRITON_INTERPRET: the interpreter's patched ``tl`` cannot
    lower kernels to PTX (RPEBucketSum fails in ``create_splat``)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = ("import dataclasses, json, sys\nfrom irpe.plugins.ptx import compile_ptx\n"
            "print(json.dumps(dataclasses.asdict(compile_ptx(**json.loads(sys.argv[1])))))")
    res = subprocess.run([sys.executable, "-c", code, json.dumps(kwargs)], capture_output=True, text=True,
                         env=env, timeout=600)
    if res.returncode != 0:
        raise RuntimeError(f"compiling {kwargs} to PTX failed:\n{res.stderr[-2000:]}")
    return CompiledKernel(**json.loads(res.stdout.strip().splitlines()[-1]))


@lru_cache(maxsize=64)
def compile_ptx(op: str, dtype: str = "fp32", arch: int = 80, *, num_buckets: int | None = None,
                block_bh: int | None = None, num_warps: int = 4,
                ptx_version: int | None = None) -> CompiledKernel:
    """Compile ``op`` (RPEIndex or RPEBucketSum) for ``sm_<arch>`` to PTX; RPEBucketSum needs ``num_buckets``.

    Cached per arguments (TensorRT asks again for every tactic and profile)."""
    import triton
    from triton.backends.compiler import GPUTarget

    from . import kernels

    if op not in (RPE_INDEX_OP, BUCKET_SUM_OP):
        raise ValueError(f"unknown op {op!r}; use {RPE_INDEX_OP!r} or {BUCKET_SUM_OP!r}")
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be fp32 or fp16, got {dtype!r}")
    dtype = _DTYPES[dtype]
    if op == BUCKET_SUM_OP and not num_buckets:
        raise ValueError("RPEBucketSum needs num_buckets to size its one-hot tile")
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return _compile_elsewhere(op=op, dtype=dtype, arch=int(arch), num_buckets=num_buckets, block_bh=block_bh,
                                  num_warps=num_warps, ptx_version=ptx_version)
    block_bh = block_bh or kernels.AOT_BLOCK_BH
    ptx_version = ptx_version or ptx_version_for(arch)
    constexprs = {"BLOCK_BH": block_bh}
    if op == BUCKET_SUM_OP:
        if not num_buckets:
            raise ValueError("RPEBucketSum needs num_buckets to size its one-hot tile")
        block_j, block_k = kernels.SUM_BLOCK_J, kernels.block_k_for(num_buckets)
        constexprs.update(BLOCK_J=block_j, BLOCK_K=block_k)
    else:
        block_j, block_k = kernels.INDEX_BLOCK_J, None
        constexprs["BLOCK_J"] = block_j
    src = triton.compiler.ASTSource(fn=_jit_function(op), signature=_signature(op, dtype), constexprs=constexprs)
    compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                              options={"ptx_version": ptx_version, "num_warps": num_warps,
                                       "enable_fp_fusion": True})
    md = compiled.metadata
    ptx = strip_unused_trailing_params(compiled.asm["ptx"], md.name, keep=len(_signature(op, dtype)))
    return CompiledKernel(op=op, dtype=dtype, arch=arch, kernel_name=md.name, ptx=ptx, num_warps=md.num_warps,
                          shared_mem=md.shared, block_bh=block_bh, block_j=block_j, block_k=block_k)
