"""``irpe bench rpe-lookup``: the iRPE-K lookup's forms on one attention core, per runtime.

One ONNX graph per form of ``scores + q·W[:, bucket]`` inside an attention core (``softmax(q kᵀ + term) v``),
DeiT-S sizes by default, timed interleaved on ONNX Runtime fp32 and OpenVINO f32/bf16 against the same core
without the term:

* ``rows``: what ``export/rpe_graph.py`` emits (the lut laid out as rows (n·K, N, H), whole rows gathered by a
  constant index, one transpose back);
* ``lastaxis``: a Gather on the last axis of the natural (N, H, n·K) layout (OpenVINO's preferred form);
* ``onehot``: a batched MatMul against a constant (n, K, n) one-hot.

Every form is checked against ``rows`` on ONNX Runtime before it is timed (max |d| printed). The bucket table
is random (the forms' costs do not depend on its values).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

FORMS = ("plain", "rows", "lastaxis", "onehot")


@dataclass(frozen=True)
class Dims:
    """Batch, heads, tokens, head width, buckets."""

    batch: int = 8
    heads: int = 6
    tokens: int = 197
    width: int = 64
    buckets: int = 50


def _term(form: str, d: Dims, bucket: np.ndarray, nodes: list, inits: list) -> None:
    """Append the nodes computing ``term`` (N, H, n, n) from ``lut`` (N, H, n, K) in ``form``."""
    from onnx import helper, numpy_helper

    n, k = d.tokens, d.buckets
    flat = np.arange(n)[:, None] * k + bucket
    if form == "rows":
        inits += [numpy_helper.from_array(np.array([n * k, -1, d.heads], np.int64), "rows_shape"),
                  numpy_helper.from_array(flat.reshape(-1).astype(np.int64), "rows_index"),
                  numpy_helper.from_array(np.array([n, n, -1, d.heads], np.int64), "grid_shape")]
        nodes += [helper.make_node("Transpose", ["lut"], ["lut_t"], perm=[2, 3, 0, 1]),
                  helper.make_node("Reshape", ["lut_t", "rows_shape"], ["rows"]),
                  helper.make_node("Gather", ["rows", "rows_index"], ["picked"], axis=0),
                  helper.make_node("Reshape", ["picked", "grid_shape"], ["grid"]),
                  helper.make_node("Transpose", ["grid"], ["term"], perm=[2, 3, 0, 1])]
    elif form == "lastaxis":
        inits += [numpy_helper.from_array(np.array([0, 0, n * k], np.int64), "flat_shape"),
                  numpy_helper.from_array(flat.astype(np.int64), "flat_index")]
        nodes += [helper.make_node("Reshape", ["lut", "flat_shape"], ["lut_flat"]),
                  helper.make_node("Gather", ["lut_flat", "flat_index"], ["term"], axis=2)]
    else:
        onehot = np.zeros((n, k, n), np.float32)
        onehot[np.arange(n)[:, None], bucket, np.arange(n)[None, :]] = 1
        inits += [numpy_helper.from_array(onehot, "onehot"), numpy_helper.from_array(np.array([3], np.int64), "axis3"),
                  numpy_helper.from_array(np.array([0, 0, n, n], np.int64), "square")]
        nodes += [helper.make_node("Unsqueeze", ["lut", "axis3"], ["lut_row"]),
                  helper.make_node("MatMul", ["lut_row", "onehot"], ["summed"]),
                  helper.make_node("Reshape", ["summed", "square"], ["term"])]


def attention_core(form: str, d: Dims, seed: int = 0) -> bytes:
    """The serialized ONNX model of one attention core with the K-side term in ``form``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    bucket = rng.integers(0, d.buckets, size=(d.tokens, d.tokens))
    weight = (0.1 * rng.standard_normal((d.width, d.buckets))).astype(np.float32)
    inits = [numpy_helper.from_array(weight, "W"), numpy_helper.from_array(np.float32(d.width ** -0.5), "scale")]
    nodes = [helper.make_node("Mul", ["q", "scale"], ["qs"]),
             helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["qs", "kt"], ["scores"])]
    scores = "scores"
    if form != "plain":
        nodes.append(helper.make_node("MatMul", ["qs", "W"], ["lut"]))
        _term(form, d, bucket, nodes, inits)
        nodes.append(helper.make_node("Add", ["scores", "term"], ["scores_rpe"]))
        scores = "scores_rpe"
    nodes += [helper.make_node("Softmax", [scores], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v"], ["o"])]

    def io(name: str) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, ["N", d.heads, d.tokens, d.width])

    graph = helper.make_graph(nodes, form, [io("q"), io("k"), io("v")], [io("o")], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model.SerializeToString()


def runners(model: bytes, threads: int, paths: tuple[str, ...]) -> dict[str, Callable[[dict], object]]:
    """path -> run(feed) for ``ort-fp32``, ``ov-f32``, ``ov-bf16`` (OpenVINO paths only when installed)."""
    import onnxruntime as ort

    out: dict[str, Callable[[dict], object]] = {}
    if "ort-fp32" in paths:
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.log_severity_level = 3
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        session = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
        out["ort-fp32"] = lambda feed: session.run(None, feed)
    ov_paths = [p for p in paths if p.startswith("ov-")]
    if ov_paths:
        import openvino as ov

        core = ov.Core()
        for path in ov_paths:
            compiled = core.compile_model(core.read_model(model, b""), "CPU", {
                "INFERENCE_PRECISION_HINT": path[3:], "INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1})
            request = compiled.create_infer_request()
            out[path] = (lambda r: lambda feed: r.infer(feed))(request)
    return out


def run_rpe_lookup_bench(d: Dims, rounds: int, threads: int,
                         paths: tuple[str, ...] = ("ort-fp32", "ov-f32", "ov-bf16")) -> dict[tuple[str, str], float]:
    """Median seconds per (form, path), every form and path interleaved round by round."""
    feed = {name: np.random.default_rng(1).standard_normal((d.batch, d.heads, d.tokens, d.width)).astype(np.float32)
            for name in "qkv"}
    run = {form: runners(attention_core(form, d), threads, paths) for form in FORMS}
    reference = np.asarray(run["rows"]["ort-fp32"](feed)[0]) if "ort-fp32" in paths else None
    for form in FORMS[2:]:
        if reference is not None:
            diff = float(np.abs(np.asarray(run[form]["ort-fp32"](feed)[0]) - reference).max())
            print(f"{form}: max |d| against rows on ONNX Runtime {diff:.2e}", flush=True)
    times: dict[tuple[str, str], list[float]] = {(f, p): [] for f in FORMS for p in run[f]}
    for _ in range(rounds):
        for (form, path), spent in times.items():
            start = time.perf_counter()
            run[form][path](feed)
            spent.append(time.perf_counter() - start)
    return {key: statistics.median(v) for key, v in times.items()}


def format_lookup(medians: dict[tuple[str, str], float]) -> str:
    """One line per path: each form's median and what it adds to the plain core."""
    paths = list(dict.fromkeys(p for _, p in medians))
    lines = [f"{'path':<9} " + " ".join(f"{f:>18}" for f in FORMS)]
    for path in paths:
        base = medians[("plain", path)]
        cells = [f"{1e3 * medians[(f, path)]:8.2f} ms (+{1e3 * (medians[(f, path)] - base):5.2f})" for f in FORMS]
        lines.append(f"{path:<9} " + " ".join(f"{c:>18}" for c in cells))
    return "\n".join(lines)
