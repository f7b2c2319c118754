"""Triton kernels (CPU interpreter, see conftest.py) against the NumPy references over many shapes."""

import numpy as np
import pytest
import torch

from irpe.plugins import kernels, ops


def _space_sample(n: int, seed: int = 0, budget: float = 3e6) -> list[tuple[int, int, int, int, int]]:
    """(batch, heads, grid, skip, buckets): corners of each dimension plus a seeded sample.

    The interpreter runs every program on the CPU, so sampled cases keep B*H*L*L under ``budget``
    (batch 64 with grid 24 at once would take ~10 s per case here)."""
    edges = [(1, 1, 7, 0, 9), (64, 1, 7, 2, 82), (1, 2, 24, 2, 82), (64, 1, 14, 1, 9), (2, 3, 24, 0, 9)]
    rng = np.random.default_rng(seed)
    sample: list[tuple[int, int, int, int, int]] = []
    while len(sample) < n:
        b, h, g, skip, k = (int(rng.integers(1, 65)), int(rng.integers(1, 4)), int(rng.integers(7, 25)),
                            int(rng.integers(0, 3)), int(rng.integers(9, 83)))
        if b * h * (skip + g * g) ** 2 <= budget:
            sample.append((b, h, g, skip, k))
    return edges + sample


CASES = _space_sample(7)


def _index(lq: int, k: int, rng) -> np.ndarray:
    index = rng.integers(0, k, (lq, lq)).astype(np.int32)
    index[0, 0], index[-1, -1] = 0, k - 1  # both ends of the bucket range
    return index


def _block_j(lk: int) -> int:
    """Large shapes use one key block per program to keep the interpreter fast."""
    return 1024 if lk > 200 else None


@pytest.fixture(autouse=True, scope="module")
def _interpreted():
    """Kernels must be interpreted; one BLAS thread (the interpreter's tl.dot is many small matmuls, and
    multi-threaded OpenBLAS on a loaded 2-core box is ~100x slower for them)."""
    from triton.runtime.jit import JITFunction

    assert not isinstance(kernels.rpe_index_kernel, JITFunction), \
        "triton was imported before TRITON_INTERPRET=1; run these tests through tests/plugins/conftest.py"
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        yield
        return
    with threadpool_limits(limits=1, user_api="blas"):
        yield


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "b{}h{}g{}s{}k{}".format(*c))
def test_rpe_index_kernel_matches_reference(case, dtype):
    b, h, g, skip, k = case
    lq = skip + g * g
    rng = np.random.default_rng(hash(case) % 2**32)
    index, lut = _index(lq, k, rng), rng.standard_normal((b, h, lq, k)).astype(dtype)
    kwargs = {"block_j": _block_j(lq)} if _block_j(lq) else {}
    out = kernels.rpe_index(torch.from_numpy(lut), torch.from_numpy(index), **kwargs).numpy()
    assert out.dtype == dtype
    np.testing.assert_array_equal(out, ops.rpe_index_ref(lut, index))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "b{}h{}g{}s{}k{}".format(*c))
def test_bucket_sum_kernel_matches_reference(case, dtype):
    b, h, g, skip, k = case
    lq = skip + g * g
    rng = np.random.default_rng(hash(case) % 2**32)
    index = _index(lq, k, rng)
    attn = rng.random((b, h, lq, lq)).astype(np.float32)
    attn = (attn / attn.sum(-1, keepdims=True)).astype(dtype)  # softmax-like rows
    kwargs = {"block_j": _block_j(lq)} if _block_j(lq) else {}
    out = kernels.bucket_sum(torch.from_numpy(attn), torch.from_numpy(index), k, **kwargs).numpy()
    assert out.dtype == dtype and out.shape == (b, h, lq, k)
    exact = ops.bucket_sum_ref(attn.astype(np.float64), index, k)
    tol = 1e-6 if dtype == np.float32 else 2e-3  # fp16: one rounding of an fp32 sum
    np.testing.assert_allclose(out.astype(np.float64), exact, rtol=tol, atol=tol * 1e-2)


def test_default_blocks_loop_over_keys():
    """Default BLOCK_J is smaller than Lk here, so the key loop runs several times (ragged last block)."""
    rng = np.random.default_rng(5)
    lq, k = 2 + 10 * 10, 40
    index = _index(lq, k, rng)
    lut = rng.standard_normal((3, 2, lq, k)).astype(np.float32)
    attn = rng.random((3, 2, lq, lq)).astype(np.float32)
    assert lq % kernels.INDEX_BLOCK_J and lq % kernels.SUM_BLOCK_J
    out = kernels.rpe_index(torch.from_numpy(lut), torch.from_numpy(index)).numpy()
    np.testing.assert_array_equal(out, ops.rpe_index_ref(lut, index))
    sums = kernels.bucket_sum(torch.from_numpy(attn), torch.from_numpy(index), k).numpy()
    np.testing.assert_allclose(sums, ops.bucket_sum_ref(attn, index, k), rtol=1e-6, atol=1e-6)


def test_real_irpe_table_product_method():
    from irpe.models.buckets import bucket_ids, num_buckets

    k = num_buckets("product", 1.9, 1)
    index = np.ascontiguousarray(bucket_ids("product", 1.9, 14, 14, 1), dtype=np.int32)
    rng = np.random.default_rng(6)
    lut = rng.standard_normal((2, 1, index.shape[0], k)).astype(np.float16)
    out = kernels.rpe_index(torch.from_numpy(lut), torch.from_numpy(index)).numpy()
    np.testing.assert_array_equal(out, ops.rpe_index_ref(lut, index))


def test_wrappers_reject_bad_inputs():
    lut = torch.zeros((1, 1, 4, 3))
    with pytest.raises(ValueError, match="int32"):
        kernels.rpe_index(lut, torch.zeros((4, 4), dtype=torch.int64))
    with pytest.raises(ValueError, match="float32/float16"):
        kernels.rpe_index(lut.double(), torch.zeros((4, 4), dtype=torch.int32))
    with pytest.raises(ValueError, match="contiguous"):
        kernels.bucket_sum(torch.zeros((1, 1, 4, 4)).transpose(2, 3), torch.zeros((4, 4), dtype=torch.int32), 3)


def test_block_sizes():
    assert kernels.block_k_for(9) == 16 and kernels.block_k_for(82) == 128 and kernels.block_k_for(128) == 128
    assert kernels.block_bh_for(1) == 16 and kernels.block_bh_for(100) == kernels.MAX_BLOCK_BH
