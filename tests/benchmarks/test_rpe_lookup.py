"""bench/rpe_lookup.py: every form of the iRPE-K lookup computes the same attention core (ONNX Runtime and
OpenVINO, small sizes), and a short real run prints every path and form."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from irpe.bench.rpe_lookup import FORMS, Dims, attention_core, format_lookup, run_rpe_lookup_bench

SMALL = Dims(batch=2, heads=2, tokens=17, width=8, buckets=5)


def _reference(feed: dict[str, np.ndarray], seed: int = 0) -> np.ndarray:
    """softmax(q kᵀ / sqrt(d) + q·W[:, bucket]) v in NumPy, with the bench's table and weight."""
    rng = np.random.default_rng(seed)
    bucket = rng.integers(0, SMALL.buckets, size=(SMALL.tokens, SMALL.tokens))
    weight = (0.1 * rng.standard_normal((SMALL.width, SMALL.buckets))).astype(np.float32)
    q = feed["q"] * np.float32(SMALL.width ** -0.5)
    scores = q @ feed["k"].transpose(0, 1, 3, 2)
    lut = q @ weight  # (N, H, n, K)
    scores = scores + np.take_along_axis(lut, np.broadcast_to(bucket, scores.shape), axis=-1)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ feed["v"]


def test_every_form_computes_the_reference() -> None:
    rng = np.random.default_rng(3)
    feed = {n: rng.standard_normal((SMALL.batch, SMALL.heads, SMALL.tokens, SMALL.width)).astype(np.float32)
            for n in "qkv"}
    want = _reference(feed)
    for form in FORMS[1:]:
        session = ort.InferenceSession(attention_core(form, SMALL), providers=["CPUExecutionProvider"])
        np.testing.assert_allclose(session.run(None, feed)[0], want, rtol=1e-5, atol=1e-5, err_msg=form)
    plain = ort.InferenceSession(attention_core("plain", SMALL), providers=["CPUExecutionProvider"])
    assert np.abs(plain.run(None, feed)[0] - want).max() > 1e-3  # the term moves the answer


def test_a_short_run_times_every_form_on_every_path(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("openvino", reason="OpenVINO is in the cpu extra")
    medians = run_rpe_lookup_bench(SMALL, rounds=2, threads=1)
    assert set(medians) == {(f, p) for f in FORMS for p in ("ort-fp32", "ov-f32", "ov-bf16")}
    assert all(v > 0 for v in medians.values())
    text = format_lookup(medians)
    assert all(p in text for p in ("ort-fp32", "ov-f32", "ov-bf16")) and all(f in text for f in FORMS)
    assert "max |d| against rows" in capsys.readouterr().out
