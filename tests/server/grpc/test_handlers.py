"""server/grpc/handlers.py: a ModelInfer request split into its message and views of its raw tensors, equal to what
protobuf parses whole; malformed bytes fail as protobuf fails them; the method table covers the service.

Each check runs in its own process (``python -c``): tritonclient.grpc's messages and kserve's share the protobuf
package ``inference``, so the test process, which imports kserve, must not import tritonclient.grpc
(:mod:`tests.server.grpc_client`)."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[3]
CHECKS = ("raw_views", "no_raw", "malformed", "mutants", "method_table", "known_layout", "known_checks")


@pytest.mark.parametrize("check", CHECKS)
def test_in_its_own_process(check: str) -> None:
    code = f"from tests.server.grpc.test_handlers import _check_{check} as c; c(); print('passed')"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip().endswith("passed"), out.stderr[-3000:]


def _modules() -> tuple[Any, Any, Any]:
    from google.protobuf.message import DecodeError
    from tritonclient.grpc import service_pb2 as pb

    from irpe.server.grpc import handlers

    return pb, DecodeError, handlers


def _request(raws: list[bytes]) -> Any:
    pb = _modules()[0]
    req = pb.ModelInferRequest(model_name="m", model_version="2", id="abc")
    req.parameters["priority"].int64_param = 3
    t = req.inputs.add(name="images", datatype="FP32")
    t.shape.extend([1, 3, 4, 4])
    req.raw_input_contents.extend(raws)
    req.outputs.add(name="logits").parameters["classification"].int64_param = 2
    return req


def _joined(call: Any) -> Any:
    whole = _modules()[0].ModelInferRequest()
    whole.CopyFrom(call.message)
    whole.raw_input_contents.extend(bytes(r) for r in call.raw)
    return whole


def _check_raw_views() -> None:
    """The raw tensors are views of the received bytes; the rest is parsed."""
    pb, _, h = _modules()
    raws = [np.arange(48, dtype="<f4").tobytes(), b"\x00" * 200_000]  # one short, one with a 3-byte length
    data = _request(raws).SerializeToString()
    call = h.parse_infer(data)
    assert [bytes(r) for r in call.raw] == raws
    assert all(isinstance(r, memoryview) and r.obj is data for r in call.raw)  # no copy
    assert len(call.message.raw_input_contents) == 0
    assert _joined(call) == pb.ModelInferRequest.FromString(data)
    assert call.message.outputs[0].parameters["classification"].int64_param == 2


def _check_no_raw() -> None:
    """A request without raw tensors is protobuf's own parse."""
    pb, _, h = _modules()
    req = _request([])
    req.inputs[0].contents.fp32_contents.extend([0.5] * 48)
    data = req.SerializeToString()
    call = h.parse_infer(data)
    assert call.raw == [] and call.message == pb.ModelInferRequest.FromString(data)


def _check_malformed() -> None:
    """Malformed bytes fail as protobuf fails them."""
    pb, DecodeError, h = _modules()
    data = _request([b"x" * 1000]).SerializeToString()
    for bad in (data[:-10], data[:5] + b"\xff" * 12, b"\x3b\x00", b"\x0a\xff\xff\xff\xff\x0f"):
        with pytest.raises(DecodeError):
            pb.ModelInferRequest.FromString(bad)
        with pytest.raises(DecodeError):
            h.parse_infer(bad)


def _check_mutants() -> None:
    """Random byte flips and cuts: the split parse fails exactly when protobuf's does, and agrees with it
    when both succeed."""
    pb, DecodeError, h = _modules()
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
                h.parse_infer(blob)
            continue
        assert _joined(h.parse_infer(blob)) == want
        agreed += 1
    assert agreed > 50  # the comparison ran on many parseable mutants


def _check_known_layout() -> None:
    """A request of a layout seen before (its one raw tensor last) takes the first's parse: the same message, a
    view of its own tensor; another head of the same size, a tensor not last or two tensors are parsed anew."""
    pb, _, h = _modules()
    first, second = (_request([np.full(48, v, dtype="<f4").tobytes()]).SerializeToString() for v in (1.0, 2.0))
    a, b = h.parse_infer(first), h.parse_infer(second)
    assert a.known is not None and b.known is a.known and b.message is a.message and b.size == a.size
    assert bytes(b.raw[0]) == np.full(48, 2.0, dtype="<f4").tobytes() and b.raw[0].obj is second
    assert _joined(b) == pb.ModelInferRequest.FromString(second)
    other = _request([np.full(48, 1.0, dtype="<f4").tobytes()])
    other.model_version = "3"  # same size, another head
    c = h.parse_infer(other.SerializeToString())
    assert c.message is not a.message and c.message.model_version == "3"
    assert _joined(c) == other
    not_last = _request([b"x" * 48]).SerializeToString() + b"\x1a\x01z"  # an id after the tensor
    assert h.parse_infer(not_last).known is None
    assert h.parse_infer(_request([b"x" * 48, b"y" * 4]).SerializeToString()).known is None
    assert h.parse_infer(not_last).message.id == "z"


def _check_known_checks() -> None:
    """codec.known_checked: the remembered checks hold only for their artifact and batch limit; the tensor's values
    are checked on every request, with the full path's error."""
    from irpe.server.grpc import codec
    from irpe.server.pipeline.oip import ProtocolError

    _, _, h = _modules()
    data = _request([np.full(48, 1.0, dtype="<f4").tobytes()]).SerializeToString()
    call, artifact = h.parse_infer(data), object()
    assert codec.known_checked(call.known, artifact, 8, call.raw) is None  # nothing remembered yet
    call.known.checked = (artifact, 8, (1, 3, 4, 4), 2)
    images, k = codec.known_checked(call.known, artifact, 8, call.raw)
    assert images.shape == (1, 3, 4, 4) and k == 2 and float(images.max()) == 1.0
    assert codec.known_checked(call.known, object(), 8, call.raw) is None
    assert codec.known_checked(call.known, artifact, 4, call.raw) is None
    assert codec.known_checked(None, artifact, 8, call.raw) is None
    nan = h.parse_infer(_request([np.full(48, np.nan, dtype="<f4").tobytes()]).SerializeToString())
    assert nan.known is call.known
    with pytest.raises(ProtocolError, match="48 non-finite value"):
        codec.known_checked(nan.known, artifact, 8, nan.raw)


def _check_method_table() -> None:
    """The method table covers every RPC of the service."""
    pb, _, h = _modules()

    class Everything:
        def __getattr__(self, name: str):  # noqa: ANN204
            return lambda *a: name

    handler = h.service_handler(Everything())
    methods = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods
    assert len(methods) >= 19
    for m in methods:
        details = type("D", (), {"method": f"/inference.GRPCInferenceService/{m.name}"})()
        method = handler.service(details)
        assert method is not None and method.request_streaming == m.client_streaming
        assert method.response_streaming == m.server_streaming
    infer = handler.service(type("D", (), {"method": "/inference.GRPCInferenceService/ModelInfer"})())
    assert infer.request_deserializer is h.parse_infer
