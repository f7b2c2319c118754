"""AOT PTX for sm_80 / sm_90, compiled here without a GPU, and checked by Triton's bundled ptxas."""

import shutil
import subprocess
from pathlib import Path

import pytest

from irpe.plugins import ptx
from irpe.plugins.ops import BUCKET_SUM_OP, RPE_INDEX_OP


def _ptxas() -> str | None:
    import triton

    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    return str(bundled) if bundled.is_file() else shutil.which("ptxas")


FAMILY_HEADS = (80, 90, 100, 120)  # one per PTX ISA / target kind: every op and dtype there, the rest spot-checked
CASES = [(op, dt, arch) for arch in ptx.ARCHS for op in (RPE_INDEX_OP, BUCKET_SUM_OP) for dt in ("fp32", "fp16")
         if arch in FAMILY_HEADS or (op, dt) == (BUCKET_SUM_OP, "fp16")]


def test_every_architecture_is_covered():
    assert {arch for _, _, arch in CASES} == set(ptx.ARCHS) >= {80, 86, 87, 89, 90, 100, 103, 120, 121}


@pytest.mark.parametrize(("op", "dtype", "arch"), CASES)
def test_ptx_compiles_for_arch(op, dtype, arch, tmp_path):
    ck = ptx.compile_ptx(op, dtype, arch, num_buckets=82)
    target = f"sm_{arch}a" if arch >= 90 else f"sm_{arch}"  # Triton emits arch-specific targets from Hopper on
    assert f".target {target}\n" in ck.ptx and f".entry {ck.kernel_name}(" in ck.ptx
    isa = {100: "8.6", 103: "8.8", 120: "8.7", 121: "8.8"}.get(arch, "8.0")
    assert f".version {isa}\n" in ck.ptx, "PTX ISA 8.0 (CUDA 12.0+ drivers) up to Hopper; Blackwell's minimum"
    entry = ck.ptx[ck.ptx.index(".entry"):ck.ptx.index(")", ck.ptx.index(".entry"))]
    assert entry.count(".param") == 7, "lut/attn, index, BH, LQ, LK, K, out: no hidden scratch params"
    assert ck.block_x == ck.num_warps * 32 == 128 and ck.shared_mem < 48 * 1024
    assert ck.grid(bh=12 * 64, lq=197) == (197, -(-768 // ck.block_bh), 1)
    assert (ck.block_k == 128) == (op == BUCKET_SUM_OP)
    tool = _ptxas()
    if tool is None:
        pytest.skip("no ptxas found to assemble the PTX")
    path = tmp_path / "k.ptx"
    path.write_text(ck.ptx)
    res = subprocess.run([tool, f"-arch={target}", str(path), "-o", str(tmp_path / "k.cubin")],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_strip_refuses_a_used_hidden_param():
    text = ".entry k(\n\t.param .u64 k_param_0,\n\t.param .u64 k_param_1\n)\n{\n\tld.param.u64 %rd1, [k_param_1];\n}"
    with pytest.raises(RuntimeError, match="hidden parameter k_param_1"):
        ptx.strip_unused_trailing_params(text, "k", keep=1)
    unused = text.replace("[k_param_1]", "[k_param_0]")
    assert "k_param_1" not in ptx.strip_unused_trailing_params(unused, "k", keep=1)


def test_compile_ptx_argument_errors():
    with pytest.raises(ValueError, match="num_buckets"):
        ptx.compile_ptx(BUCKET_SUM_OP, "fp32", 80)
    with pytest.raises(ValueError, match="unknown op"):
        ptx.compile_ptx("Nope", "fp32", 80)
    with pytest.raises(ValueError, match="fp32 or fp16"):
        ptx.compile_ptx(RPE_INDEX_OP, "bf16", 80)
