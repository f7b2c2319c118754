"""artifact/_ovops + openvino_attention: the fused iRPE attention kernel against a NumPy reference (the AVX-512
BF16 kernel where this CPU has it, and the plain C one everywhere), its checks on untrusted indices and buffers,
and the graph rewrite that puts it into the bf16 OpenVINO graph (same answers as OpenVINO's own bf16, and as
PyTorch within bf16's precision)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from irpe.artifact import openvino_attention as fused
from irpe.artifact.openvino_graph import fused_attention, read_model
from irpe.export.bench import random_model
from irpe.export.onnx import onnx_from_model

_ovops = pytest.importorskip("irpe.artifact._ovops", reason="the C kernels did not build (no C compiler)")
B, H, D, K = 2, 3, 64, 9
SKIP, GH, GW, M = 1, 5, 6, 3  # one class token and a 5 x 6 patch grid; 3 x 3 product buckets + the prefix one
N = SKIP + GH * GW


def bf16(x: np.ndarray) -> np.ndarray:
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def unbf16(h: np.ndarray) -> np.ndarray:
    return (h.astype(np.uint32) << 16).view(np.float32)


def product_buckets() -> np.ndarray:
    """A product-method table on the grid: bucket = a(row offset) * M + b(column offset), prefix rows and
    columns -1 (the value side folds the prefix bucket out)."""
    rows, cols = np.divmod(np.arange(GH * GW), GW)
    clip = lambda d: np.clip(d, -1, 1) + 1  # noqa: E731  (saturating offsets, 3 buckets per axis)
    patch = clip(rows[:, None] - rows[None, :]) * M + clip(cols[:, None] - cols[None, :])
    out = np.full((N, N), -1, np.int32)
    out[SKIP:, SKIP:] = patch
    return out


def inputs(seed: int = 0) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    q, k, v = (bf16(rng.standard_normal((B, H, N, D)) * s) for s in (0.15, 1.0, 1.0))
    return q, np.ascontiguousarray(k.transpose(0, 1, 3, 2)), v


def reference(q, kt, v, luts, indices, bucket, kv):  # noqa: ANN001, ANN201
    """softmax(q kᵀ + the looked-up terms) v and the bucket sums, in float64."""
    s = unbf16(q).astype(np.float64) @ unbf16(kt).astype(np.float64)
    for lut, index in zip(luts, indices, strict=True):
        s += lut.reshape(B, H, -1)[:, :, index.reshape(-1)].reshape(B, H, N, N)
    e = np.exp(s - s.max(-1, keepdims=True))
    p = e / e.sum(-1, keepdims=True)
    ctx = p @ unbf16(v).astype(np.float64)
    if bucket is None:
        return ctx, None
    hot = np.zeros((N, N, kv))
    i, j = np.nonzero(bucket >= 0)
    hot[i, j, bucket[i, j]] = 1
    return ctx, np.einsum("bhij,ijk->ibhk", p, hot).reshape(N, B * H, kv)


def lookups(seed: int = 1) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """A k-side lut read in its query's row (windowed), a q-side one read at the key's row (column-windowed) and
    one read anywhere (gathers)."""
    rng = np.random.default_rng(seed)
    table = product_buckets().clip(0)
    luts = [rng.standard_normal((B, H, N, K)).astype(np.float32) for _ in range(3)]
    rows = np.arange(N)[:, None] * K + table
    cols = np.arange(N)[None, :] * K + table.T
    anywhere = rng.integers(0, N * K, (N, N))
    return luts, [rows, cols, anywhere]


@pytest.mark.parametrize("scalar", [False, True], ids=["vector", "scalar"])
@pytest.mark.parametrize("grid", [True, False], ids=["separable", "generic"])
def test_kernel_matches_the_reference(scalar: bool, grid: bool) -> None:
    q, kt, v = inputs()
    luts, indices = lookups()
    bucket, kv = product_buckets(), M * M
    plan = fused.plan(N, indices, [N * K] * 3, bucket, kv, (SKIP, GH, GW, M) if grid else None)
    ctx, sums = np.empty((B, H, N, D), np.float32), np.empty((N, B * H, kv), np.float32)
    _ovops.attention(q, kt, v, ctx, tuple(luts), plan, sums, 2, scalar)
    want_ctx, want_sums = reference(q, kt, v, luts, indices, bucket, kv)
    # p v runs on bf16 probabilities, as OpenVINO's own bf16 attention does: ~3 significant digits
    np.testing.assert_allclose(ctx, want_ctx, rtol=0, atol=1e-2 * np.abs(want_ctx).max())
    np.testing.assert_allclose(sums, want_sums, rtol=0, atol=1e-5)
    assert not sums[:SKIP].any() and (sums[SKIP:].sum(-1) < 1).all()  # prefix queries and keys in no bucket


def test_kernel_bf16_context_and_luts_without_value_sums() -> None:
    q, kt, v = inputs(2)
    luts, indices = lookups(3)
    plan = fused.plan(N, indices[:2], [N * K] * 2)
    got = np.empty((B, H, N, D), np.uint16)
    _ovops.attention(q, kt, v, got, tuple(bf16(lut) for lut in luts[:2]), plan, None, 1)
    want, _ = reference(q, kt, v, [unbf16(bf16(lut)) for lut in luts[:2]], indices[:2], None, 0)
    np.testing.assert_allclose(unbf16(got), want, rtol=0, atol=2e-2 * np.abs(want).max())


def test_plan_refuses_indices_outside_the_tables() -> None:
    luts, indices = lookups()
    bad = indices[0].copy()
    bad[3, 4] = N * K  # one past the lut plane
    with pytest.raises(ValueError, match="outside the table read"):
        fused.plan(N, [bad], [N * K])
    with pytest.raises(ValueError, match="outside the table read"):
        fused.plan(N, [indices[0]], [N * K], np.full((N, N), 9, np.int32), 9)
    with pytest.raises(ValueError, match=r"int32 values \(n \* n\)"):
        fused.plan(N, [indices[0][:-1]], [N * K])


def test_attention_refuses_buffers_that_do_not_fit_the_plan() -> None:
    q, kt, v = inputs()
    luts, indices = lookups()
    plan = fused.plan(N, indices[:1], [N * K], product_buckets(), M * M)
    ctx = np.empty((B, H, N, D), np.float32)
    sums = np.empty((N, B * H, M * M), np.float32)
    with pytest.raises(ValueError, match="lut 0"):
        _ovops.attention(q, kt, v, ctx, (luts[0][:, :, :, :-1].copy(),), plan, sums, 1)
    with pytest.raises(ValueError, match="sums"):
        _ovops.attention(q, kt, v, ctx, (luts[0],), plan, None, 1)
    with pytest.raises(ValueError, match="kt"):
        _ovops.attention(q, q, v, ctx, (luts[0],), plan, sums, 1)
    with pytest.raises(ValueError, match="bfloat16"):
        _ovops.attention(q.astype(np.float32), kt, v, ctx, (luts[0],), plan, sums, 1)


ov = pytest.importorskip("openvino")
BASE = "deit_tiny_patch16_224_ctx_product_50_shared_k"
CONFIGS = {  # name -> (create_model overrides, layers fused per model when the kernel runs here)
    "ctx_qkv_product": (dict(rpe_on="qkv"), 1),
    "ctx_qk_cross_unshared": (dict(rpe_on="qk", rpe_method="cross", rpe_ratio=20, rpe_shared=False), 1),
    "ctx_qv_euc": (dict(rpe_on="qv", rpe_method="euc", rpe_ratio=20), 1),  # one-hot value sums
    "ctx_v_product_unshared": (dict(rpe_on="v", rpe_shared=False), 0),  # no lookup in the scores: left alone
    "ctx_k_product": (dict(rpe_on="k"), 0),  # k alone: OpenVINO's own fused attention is as fast
    "plain": (dict(rpe_on=""), 0),
}


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_graph_rewrite_keeps_the_answers(config: str, tmp_path: Path) -> None:
    overrides, per_model = CONFIGS[config]
    model = random_model(BASE, img_size=64, rpe_std=0.5, **overrides)
    path = onnx_from_model(model, tmp_path / "model.onnx")
    core = ov.Core()
    rewritten = core.read_model(str(path))
    expected = per_model * model.cfg.depth if fused.available() else 0
    assert fused_attention(rewritten, threads=2) == expected
    assert sum(op.get_type_name() == "IrpeAttention" for op in rewritten.get_ordered_ops()) == expected
    x = np.random.default_rng(4).standard_normal((3, 3, 64, 64)).astype(np.float32)
    hint = {"INFERENCE_PRECISION_HINT": "bf16"}
    got = np.asarray(core.compile_model(read_model(core, path, bf16=True, threads=2), "CPU", hint)
                     .create_infer_request().infer({0: x})[0])
    own = np.asarray(core.compile_model(read_model(core, path), "CPU", hint).create_infer_request().infer({0: x})[0])
    with torch.no_grad():
        want = model(torch.from_numpy(x)).numpy()
    scale = np.abs(want).max()
    assert np.abs(got - want).max() <= max(2 * np.abs(own - want).max(), 0.02 * scale)
    assert (got.argmax(-1) == want.argmax(-1)).mean() >= (own.argmax(-1) == want.argmax(-1)).mean()


def test_off_switch_and_fp32_leave_the_graph_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = random_model(BASE, img_size=48, rpe_std=0.5, rpe_on="qkv")
    path = onnx_from_model(model, tmp_path / "model.onnx")
    core = ov.Core()
    count = lambda m: sum(op.get_type_name() == "IrpeAttention" for op in m.get_ordered_ops())  # noqa: E731
    assert count(read_model(core, path)) == 0  # fp32: OpenVINO's own graph
    monkeypatch.setenv("IRPE_OV_OPS", "0")
    assert not fused.available()
    assert count(read_model(core, path, bf16=True)) == 0
