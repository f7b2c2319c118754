"""Hypothesis fuzz of the gRPC request split (:func:`irpe.server.grpc.handlers.parse_infer`) against protobuf's own
parse of the same bytes; run in a child process by tests/server/hostile_input/test_grpc_listener.py (it imports
tritonclient's messages). Well-formed requests, the same with bytes changed or cut, and messages past the scan's
limits (fields, shape dimensions): the split fails whenever protobuf fails, refuses a message only past a limit,
and otherwise gives protobuf's request."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

MAX_EXAMPLES = 300


def _modules() -> tuple[Any, Any, Any]:
    from google.protobuf.message import DecodeError
    from tritonclient.grpc import service_pb2 as pb

    from irpe.server.grpc import handlers

    return pb, DecodeError, handlers


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    """A serialized ModelInferRequest: names, an id, parameters, inputs, outputs and raw tensors, in any order
    protobuf writes them, plus unknown fields and (sometimes) many tiny fields past the budget."""
    pb = _modules()[0]
    req = pb.ModelInferRequest(model_name=draw(st.text(max_size=12)), id=draw(st.text(max_size=12)))
    for name in draw(st.lists(st.text(max_size=6), max_size=3)):
        req.parameters[name].int64_param = draw(st.integers(-(2**63), 2**63 - 1))
    for _ in range(draw(st.integers(0, 3))):
        spec = req.inputs.add(name=draw(st.text(max_size=8)), datatype="FP32")
        spec.shape.extend(draw(st.lists(st.integers(0, 2**40), max_size=4)))
        if draw(st.integers(0, 9)) == 0:  # past MAX_DIMS, or just under it
            spec.shape.extend([1] * draw(st.integers(55, 75)))
        for i in range(draw(st.sampled_from([0, 0, 3, 400]))):  # 400 parameters: past the total budget
            spec.parameters[f"p{i}"].string_param = "v"
    if draw(st.booleans()):
        req.outputs.add(name="logits").parameters["classification"].int64_param = draw(st.integers(0, 9))
    req.raw_input_contents.extend(draw(st.lists(st.binary(max_size=300), max_size=4)))
    data = req.SerializeToString()
    if draw(st.booleans()):
        data += b"\x78\x00" * draw(st.integers(0, 600))  # unknown varint fields: the budget is 256
    return data


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """A request with some bytes changed and perhaps cut short."""
    data = bytearray(draw(requests()))
    for _ in range(draw(st.integers(0, 4))):
        if data:
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    return bytes(data[:draw(st.integers(0, len(data)))] if draw(st.booleans()) else data)


def _agree(data: bytes) -> None:
    pb, DecodeError, handlers = _modules()
    try:
        want = pb.ModelInferRequest.FromString(data)
    except DecodeError:
        try:
            handlers.parse_infer(data)
        except DecodeError:
            return
        raise AssertionError(f"protobuf refuses {data!r}, the split parsed it") from None
    try:
        call = handlers.parse_infer(data)
    except handlers.OverLimit as e:  # refused only past a limit (a changed byte may merge a few fields)
        _assert_past_a_limit(str(e), want, data)
        return
    if call.id_bytes:  # an id over MAX_ID_BYTES is left out (the servicer refuses the request)
        assert call.id_bytes > handlers.MAX_ID_BYTES and not call.message.id, data
        return
    got = pb.ModelInferRequest()
    got.CopyFrom(call.message)
    got.raw_input_contents.extend(bytes(r) for r in call.raw)
    assert got == want, data


def _assert_past_a_limit(reason: str, want: Any, data: bytes) -> None:
    """The scan's refusal names a limit that protobuf's parse of ``data`` shows was passed."""
    from irpe.server.grpc import infer_scan

    if "top-level fields" in reason:
        assert _top_level_fields(want) > infer_scan.FIELD_BUDGET // 2, data
    elif "fields in all" in reason:  # every field, packed value or charged byte takes a byte of the message
        assert len(data) > infer_scan.TOTAL_BUDGET, data
    elif "shape has more than" in reason:
        assert max(len(t.shape) for t in want.inputs) > infer_scan.MAX_DIMS, data
    else:
        raise AssertionError(f"refused for {reason!r}: {data!r}")


def _top_level_fields(message: Any) -> int:
    """The top-level fields protobuf kept: every element of a repeated field or map, every unknown field."""
    from google.protobuf.unknown_fields import UnknownFieldSet

    count = len(UnknownFieldSet(message))
    for descriptor, value in message.ListFields():
        count += len(value) if descriptor.label == descriptor.LABEL_REPEATED else 1
    return count


def run() -> None:
    """Both properties, bounded: MAX_EXAMPLES examples each, no per-example deadline (a loaded machine)."""
    bounded = settings(max_examples=MAX_EXAMPLES, deadline=None, database=None, derandomize=True,
                       suppress_health_check=[HealthCheck.too_slow])
    bounded(given(requests())(_agree))()
    bounded(given(mutated())(_agree))()
