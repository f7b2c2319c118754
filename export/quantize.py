"""Static post-training int8 quantization to a QDQ model.onnx in the form TensorRT's explicit quantization takes.

Form (checked by :func:`qdq_form_violations`): signed int8, symmetric (zero point 0), weights per channel on
the output-channel axis (axis 1 of a MatMul's (in, out) weight), activations per tensor; Q/DQ pairs on both
inputs of the quantized MatMuls and nowhere else, so LayerNorm, Softmax, GELU, the residual Adds and the
iRPE gathers / bucket sums stay float, as TensorRT's guide places them for transformer GEMMs. OpenVINO and
ONNX Runtime run the same file (OpenVINO fuses each DQ -> MatMul into an int8 GEMM).

Calibration (ONNX Runtime's calibrators): ``percentile`` (default) clips each activation at the 99.999th
percentile of |x| over the calibration images: ViT activations after LayerNorm carry a few channels of
outliers 10-50x the rest, and MinMax would spend the int8 range on them (measured on DeiT-S:
logit cosine ``minmax`` < ``percentile``); ``entropy`` (KL, TensorRT's legacy calibrator) is also available,
slower to calibrate.

Scopes (which MatMuls get Q/DQ): ``linear`` = qkv, proj, fc1, fc2 (the weight GEMMs, >90% of the FLOPs);
``rpe`` adds the iRPE q.W / k.W lookups, value-side bucket sums and (K, d) value matmuls; ``attention`` adds
q @ k^T to ``linear`` (OpenVINO then runs its attention subgraph in int8, as NNCF's graph does; attn @ v stays
float: softmax probabilities in [0, 1] waste half of signed int8, logit cosine 0.969 when it was included);
``all`` adds both.
The classifier head is kept float in every scope.
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

METHODS = ("percentile", "entropy", "minmax")
SCOPES = ("linear", "rpe", "attention", "all")
PERCENTILE = 99.999
_LINEAR = ("/matmul",)
_ATTENTION = ("/scores",)
_RPE = (".rpe_k/lut", ".rpe_q/lut", ".rpe_v/onehot_sums", ".rpe_v/col_sums", ".rpe_v/row_sums", ".rpe_v/values")


class QuantizationError(ValueError):
    """Quantization cannot run as asked (bad option, graph not in the expected form)."""


def matmuls_in_scope(proto: onnx.ModelProto, scope: str) -> list[str]:
    """Names of the MatMul nodes that ``scope`` quantizes (the classifier head never)."""
    if scope not in SCOPES:
        raise QuantizationError(f"int8 scope {scope!r}: choose one of {', '.join(SCOPES)}")
    suffixes = (_LINEAR + (_ATTENTION if scope in ("attention", "all") else ())
                + (_RPE if scope in ("rpe", "all") else ()))
    return [n.name for n in proto.graph.node
            if n.op_type == "MatMul" and n.name.endswith(suffixes) and not n.name.startswith("head")]


class _Reader:
    """ONNX Runtime CalibrationDataReader over an (N, 3, S, S) array, one image at a time (its histogram
    collector stacks outputs of equal shape only)."""

    def __init__(self, images: np.ndarray, input_name: str, batch: int = 1) -> None:
        self._batches = iter([{input_name: images[i:i + batch]} for i in range(0, len(images), batch)])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._batches, None)


def qdq_from_onnx(fp32_path: str | Path, out_path: str | Path, calibration: np.ndarray, *,
                  method: str = "percentile", scope: str = "linear", input_name: str = "images") -> Path:
    """Write the int8 QDQ form of ``fp32_path`` to ``out_path``, calibrated on ``calibration`` (N, 3, S, S)."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    if method not in METHODS:
        raise QuantizationError(f"calibration method {method!r}: choose one of {', '.join(METHODS)}")
    if len(calibration) < 1:
        raise QuantizationError("no calibration images; pass --calibration digits or a directory of images")
    proto = onnx.load(str(fp32_path))
    nodes = matmuls_in_scope(proto, scope)
    if not nodes:
        raise QuantizationError(f"{fp32_path}: no MatMul in int8 scope {scope!r}; is it an `irpe export` graph?")
    calib = {"percentile": CalibrationMethod.Percentile, "entropy": CalibrationMethod.Entropy,
             "minmax": CalibrationMethod.MinMax}[method]
    extra = {"ActivationSymmetric": True, "WeightSymmetric": True, "QuantizeBias": False,
             "CalibPercentile": PERCENTILE, "CalibTensorRangeSymmetric": True,
             "QDQOpTypePerChannelSupportToAxis": {"MatMul": -1}, "DedicatedQDQPair": True,
             "OpTypesToExcludeOutputQuantization": ["MatMul"],
             "CalibMaxIntermediateOutputs": 16}  # histograms updated every 16 images: bounded memory
    out_path = Path(out_path)
    with _quiet():
        quantize_static(str(fp32_path), str(out_path), _Reader(np.asarray(calibration, np.float32), input_name),
                        quant_format=QuantFormat.QDQ, op_types_to_quantize=["MatMul"], per_channel=True,
                        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, nodes_to_quantize=nodes,
                        calibrate_method=calib, extra_options=extra)
    quantized = _only_in_scope(onnx.load(str(out_path)), set(nodes))
    onnx.save(quantized, str(out_path))
    bad = qdq_form_violations(quantized)
    if bad:
        raise QuantizationError(f"{out_path}: the QDQ graph is not in TensorRT's form: {bad[:3]}")
    return out_path


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """ONNX Runtime's quantizer prints progress to stdout and a pre-processing hint to the root logger:
    keep stdout for the command's result and drop the hint (the graph is already shape-inferred)."""
    logging.disable(logging.WARNING)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        logging.disable(logging.NOTSET)


def _only_in_scope(proto: onnx.ModelProto, scope_nodes: set[str]) -> onnx.ModelProto:
    """Rewire nodes outside the scope that ONNX Runtime fed through a shared activation Q/DQ back to the float
    tensor (e.g. q feeds both q @ k^T and the iRPE lookup), then drop Q/DQ nodes nobody reads."""
    graph = proto.graph
    producers = {o: n for n in graph.node for o in n.output}

    def source(name: str) -> str:
        dq = producers.get(name)
        if dq is None or dq.op_type != "DequantizeLinear":
            return name
        q = producers.get(dq.input[0])
        return q.input[0] if q is not None and q.op_type == "QuantizeLinear" else name

    for n in graph.node:
        if n.name not in scope_nodes and n.op_type not in ("QuantizeLinear", "DequantizeLinear"):
            for i, name in enumerate(n.input):
                n.input[i] = source(name)
    while True:
        read = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
        dead = [n for n in graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")
                and not any(o in read for o in n.output)]
        if not dead:
            break
        for n in dead:
            graph.node.remove(n)
    read = {i for n in graph.node for i in n.input}
    unused = [i for i in graph.initializer if i.name not in read]
    for i in unused:
        graph.initializer.remove(i)
    return proto


def _consts(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    return {i.name: numpy_helper.to_array(i) for i in graph.initializer}


def qdq_form_violations(proto: onnx.ModelProto) -> list[str]:
    """Why ``proto`` is not QDQ in TensorRT's form (empty when it is): see the module docstring."""
    graph, consts = proto.graph, _consts(proto.graph)
    producers = {o: n for n in graph.node for o in n.output}
    bad: list[str] = []
    qdq = [n for n in graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    if not qdq:
        return ["no QuantizeLinear/DequantizeLinear nodes"]
    for n in qdq:
        bad += _qdq_node_violations(n, consts)
    quantized = 0
    for n in graph.node:
        if n.op_type != "MatMul":
            continue
        dq = [producers.get(i) for i in n.input]
        if all(p is not None and p.op_type == "DequantizeLinear" for p in dq):
            quantized += 1
            bad += _weight_violations(n, dq[1], consts)  # type: ignore[arg-type]
        elif any(p is not None and p.op_type == "DequantizeLinear" for p in dq):
            bad.append(f"{n.name}: only one MatMul input is dequantized (TensorRT needs both)")
    users = {n.op_type for n in graph.node for i in n.input if producers.get(i) is not None
             and producers[i].op_type == "DequantizeLinear"}
    if users - {"MatMul"}:
        bad.append(f"DequantizeLinear feeds {sorted(users - {'MatMul'})}: only MatMul inputs are quantized")
    if not quantized:
        bad.append("no MatMul has dequantized inputs")
    return bad


def _qdq_node_violations(n: onnx.NodeProto, consts: dict[str, np.ndarray]) -> list[str]:
    if len(n.input) < 3 or n.input[2] not in consts:
        return [f"{n.name}: no constant zero point"]
    zp = consts[n.input[2]]
    out = []
    if zp.dtype != np.int8:
        out.append(f"{n.name}: zero point is {zp.dtype}, not int8")
    if np.any(zp != 0):
        out.append(f"{n.name}: zero point is not 0 (asymmetric)")
    if n.input[1] not in consts or np.any(consts[n.input[1]] <= 0):
        out.append(f"{n.name}: scale is not a positive constant")
    return out


def _weight_violations(mm: onnx.NodeProto, dq: onnx.NodeProto, consts: dict[str, np.ndarray]) -> list[str]:
    """A constant MatMul weight must be per-channel on its output axis (the last)."""
    if dq.input[0] not in consts:
        return []  # activation x activation (attention) MatMul: per-tensor both sides
    w, scale = consts[dq.input[0]], consts[dq.input[1]]
    axis = next((a.i for a in dq.attribute if a.name == "axis"), 1)
    if w.dtype != np.int8:
        return [f"{mm.name}: weight stored as {w.dtype}, not int8"]
    if scale.ndim != 1 or scale.shape[0] != w.shape[-1] or axis % w.ndim != w.ndim - 1:
        return [f"{mm.name}: weight scale {scale.shape} on axis {axis} is not per output channel of {w.shape}"]
    return []


def quantized_matmuls(proto: onnx.ModelProto) -> list[str]:
    """Names of the MatMuls whose inputs are both dequantized."""
    producers = {o: n.op_type for n in proto.graph.node for o in n.output}
    return [n.name for n in proto.graph.node if n.op_type == "MatMul"
            and all(producers.get(i) == "DequantizeLinear" for i in n.input)]


def summary(proto: onnx.ModelProto, *, method: str, scope: str, images: int, source: str) -> dict[str, Any]:
    """model.json ``quantization``: what was quantized, how, on what."""
    return {"precision": "int8", "format": "qdq", "scheme": "int8 symmetric (zero point 0); weights per output "
            "channel, activations per tensor", "method": method, "percentile": PERCENTILE if method == "percentile"
            else None, "scope": scope, "matmuls": len(quantized_matmuls(proto)),
            "calibration": {"source": source, "images": images}}


def qdq_into(target: onnx.ModelProto, qdq: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``target`` (e.g. the --rpe-plugin graph of the same model) with the Q/DQ pairs of ``qdq`` (the
    quantized standard graph) around each same-named MatMul; its other nodes (irpe:: plugin ops) stay float.

    The linear MatMuls read the same tensors in both graphs (one builder), so activation Q/DQ nodes, int8
    weights and scales are copied as they are; float weights no longer read are dropped."""
    out = onnx.ModelProto()
    out.CopyFrom(target)
    producers = {o: n for n in qdq.graph.node for o in n.output}
    consts = {i.name: i for i in qdq.graph.initializer}
    have = {i.name for i in out.graph.initializer} | {o for n in out.graph.node for o in n.output}
    have |= {i.name for i in out.graph.input}
    wanted = {n.name: n for n in qdq.graph.node if n.name in set(quantized_matmuls(qdq))}

    def copy_chain(name: str) -> None:
        if name in have:
            return
        have.add(name)
        if name in consts:
            out.graph.initializer.append(consts[name])
            return
        node = producers[name]
        for i in node.input:
            copy_chain(i)
        out.graph.node.append(node)

    scope = set()
    for mm in list(out.graph.node):
        if mm.op_type == "MatMul" and mm.name in wanted:
            for i in wanted[mm.name].input:
                copy_chain(i)
            mm.input[:] = wanted[mm.name].input
            scope.add(mm.name)
    _toposort(out.graph)
    return _only_in_scope(out, scope)


def _toposort(graph: onnx.GraphProto) -> None:
    """Order ``graph.node`` so every node comes after the producers of its inputs."""
    producer = {o: i for i, n in enumerate(graph.node) for o in n.output}
    order: list[int] = []
    state: dict[int, int] = {}
    for start in range(len(graph.node)):
        stack = [(start, False)]
        while stack:
            i, done = stack.pop()
            if done:
                state[i] = 2
                order.append(i)
                continue
            if state.get(i):
                continue
            state[i] = 1
            stack.append((i, True))
            stack += [(producer[x], False) for x in graph.node[i].input if x in producer and not state.get(producer[x])]
    nodes = [graph.node[i] for i in order]
    del graph.node[:]
    graph.node.extend(nodes)
