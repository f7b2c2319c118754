"""server/grpc/handlers.py: a ModelInfer request split into its message and views of its raw tensors, equal to what
protobuf parses whole; malformed bytes fail as protobuf fails them; the method table covers the service."""

from __future__ import annotations

import random

import numpy as np
import pytest
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as pb

from irpe.server.grpc.handlers import InferCall, parse_infer, service_handler


def _request(raws: list[bytes]) -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name="m", model_version="2", id="abc")
    req.parameters["priority"].int64_param = 3
    t = req.inputs.add(name="images", datatype="FP32")
    t.shape.extend([1, 3, 4, 4])
    req.raw_input_contents.extend(raws)
    req.outputs.add(name="logits").parameters["classification"].int64_param = 2
    return req


def _joined(call: InferCall) -> pb.ModelInferRequest:
    whole = pb.ModelInferRequest()
    whole.CopyFrom(call.message)
    whole.raw_input_contents.extend(bytes(r) for r in call.raw)
    return whole


def test_raw_tensors_are_views_of_the_received_bytes_and_the_rest_is_parsed() -> None:
    raws = [np.arange(48, dtype="<f4").tobytes(), b"\x00" * 200_000]  # one short, one with a 3-byte length
    data = _request(raws).SerializeToString()
    call = parse_infer(data)
    assert [bytes(r) for r in call.raw] == raws
    assert all(isinstance(r, memoryview) and r.obj is data for r in call.raw)  # no copy
    assert len(call.message.raw_input_contents) == 0
    assert _joined(call) == pb.ModelInferRequest.FromString(data)
    assert call.message.outputs[0].parameters["classification"].int64_param == 2


def test_a_request_without_raw_tensors_is_protobufs_own_parse() -> None:
    req = _request([])
    req.inputs[0].contents.fp32_contents.extend([0.5] * 48)
    data = req.SerializeToString()
    call = parse_infer(data)
    assert call.raw == [] and call.message == pb.ModelInferRequest.FromString(data)


def test_malformed_bytes_fail_as_protobuf_fails_them() -> None:
    data = _request([b"x" * 1000]).SerializeToString()
    for bad in (data[:-10], data[:5] + b"\xff" * 12, b"\x3b\x00", b"\x0a\xff\xff\xff\xff\x0f"):
        with pytest.raises(DecodeError):
            pb.ModelInferRequest.FromString(bad)
        with pytest.raises(DecodeError):
            parse_infer(bad)


def test_mutated_messages_parse_alike() -> None:
    """Random byte flips and cuts: the split parse fails exactly when protobuf's does, and agrees with it
    when both succeed."""
    rng = random.Random(7)
    data = _request([b"\x01\x02\x03\x04" * 30, b"tail"]).SerializeToString()
    agreed = 0
    for _ in range(400):
        b = bytearray(data)
        for _ in range(rng.randint(1, 3)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        blob = bytes(b[:rng.randint(len(b) // 2, len(b))]) if rng.random() < 0.3 else bytes(b)
        try:
            want = pb.ModelInferRequest.FromString(blob)
        except DecodeError:
            with pytest.raises(DecodeError):
                parse_infer(blob)
            continue
        assert _joined(parse_infer(blob)) == want
        agreed += 1
    assert agreed > 50  # the comparison ran on many parseable mutants


def test_the_method_table_covers_every_rpc_of_the_service() -> None:
    class Everything:
        def __getattr__(self, name: str):  # noqa: ANN204
            return lambda *a: name

    handler = service_handler(Everything())
    methods = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods
    assert len(methods) >= 19
    for m in methods:
        details = type("D", (), {"method": f"/inference.GRPCInferenceService/{m.name}"})()
        h = handler.service(details)
        assert h is not None and h.request_streaming == m.client_streaming
        assert h.response_streaming == m.server_streaming
    infer = handler.service(type("D", (), {"method": "/inference.GRPCInferenceService/ModelInfer"})())
    assert infer.request_deserializer is parse_infer
