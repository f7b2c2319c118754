"""server/grpc/infer_scan.py: a ModelInferRequest's limits checked on the wire before protobuf parses it. Requests
at a limit parse as protobuf parses them; past one (a shape's dimensions, input parameters, fields in all, a
string's size, groups) they are refused in milliseconds with a short message, also when a packed field holds
millions of values in one field.

Each check runs in its own process, as in test_handlers.py (the test process imports kserve, whose protobuf
messages clash with tritonclient.grpc's)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.server.grpc_hostile import varint

REPO = Path(__file__).resolve().parents[3]
CHECKS = ("shape", "parameters", "strings", "groups", "real_requests", "huge_messages_cost_nothing")
FAST_S = 0.25  # a refusal of a 19 MB message takes ~1 ms; the margin is for this shared 2-core machine


@pytest.mark.parametrize("check", CHECKS)
def test_in_its_own_process(check: str) -> None:
    code = f"from tests.server.grpc.test_infer_scan import _check_{check} as c; c(); print('passed')"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip().endswith("passed"), out.stderr[-3000:]


def _modules() -> tuple[Any, Any]:
    from tritonclient.grpc import service_pb2 as pb

    from irpe.server.grpc import infer_scan

    return pb, infer_scan


def _request(shape: list[int], params: int = 0) -> Any:
    pb = _modules()[0]
    req = pb.ModelInferRequest(model_name="tiny-mean")
    t = req.inputs.add(name="images", datatype="FP32")
    t.shape.extend(shape)
    for i in range(params):
        t.parameters[f"p{i}"].int64_param = i
    req.raw_input_contents.append(b"\0" * 64)
    return req


def _refused(data: bytes, reason: str) -> str:
    from irpe.server.grpc import infer_scan

    try:
        infer_scan.cuts(data)
    except infer_scan.OverLimit as e:
        assert reason in str(e) and len(str(e)) < 300, str(e)
        return str(e)
    raise AssertionError(f"not refused: {reason}")


def _check_shape() -> None:
    """64 dimensions parse (packed or one field each); 65 are refused."""
    pb, scan = _modules()
    at_limit = _request([1] * 64).SerializeToString()
    assert [c.raw for c in scan.cuts(at_limit)] == [True]
    _refused(_request([1] * 65).SerializeToString(), "inputs.shape has more than 64 values")
    unpacked = b"".join(b"\x18\x01" for _ in range(65))  # shape (field 3) as 65 varint fields
    tensor = b"\x0a\x06images" + unpacked
    _refused(b"\x2a" + bytes([len(tensor) & 0x7F | 0x80, len(tensor) >> 7]) + tensor, "inputs.shape has more than")


def _check_parameters() -> None:
    """An input of 1 M parameters (or 400) is refused past the budget; 100 pass."""
    pb, scan = _modules()
    assert scan.cuts(_request([1, 3, 32, 32], params=100).SerializeToString())
    _refused(_request([1, 3, 32, 32], params=400).SerializeToString(), "more than 2048 fields in all")
    entry = b"\x22\x0a\x0a\x02p0\x12\x04\x10\x01\x10\x02"  # parameters {key "p0", value {int64_param 1, 2}}
    tensor = b"\x0a\x06images" + entry * 1_000_000
    _refused(b"\x2a" + varint(len(tensor)) + tensor, "more than 2048 fields in all")


def _check_strings() -> None:
    """Names, keys and string values of more than 4,096 bytes are refused; the id keeps its own rule (cut)."""
    pb, scan = _modules()
    req = _request([1, 3, 32, 32])
    req.model_name = "m" * 4096
    assert scan.cuts(req.SerializeToString())
    req.model_name = "m" * 4097
    _refused(req.SerializeToString(), "model_name is a string of 4097 bytes")
    req = _request([1, 3, 32, 32])
    req.inputs[0].parameters["k" * 5000].string_param = "v"
    _refused(req.SerializeToString(), "inputs.parameters.key is a string of 5000 bytes")
    req = _request([1, 3, 32, 32])
    req.outputs.add(name="logits").parameters["classification"].string_param = "x" * 70_000
    _refused(req.SerializeToString(), "outputs.parameters.value.string_param is a string of 70000 bytes")
    req = _request([1, 3, 32, 32])
    req.id = "i" * 10_000
    assert [c.raw for c in scan.cuts(req.SerializeToString())] == [False, True]  # cut out, refused later


def _check_groups() -> None:
    """A group's fields count (a group of 1 M tiny fields was walked whole); deep nesting is refused."""
    _, scan = _modules()
    flood = b"\x7b" + b"\x78\x00" * 1_000_000 + b"\x7c"  # group 15 { 1 M varint fields } END_GROUP 15
    _refused(flood, "more than 2048 fields in all")
    nested = b"\x7b" * 40 + b"\x7c" * 40
    _refused(nested, "groups nested more than 32 deep")
    assert scan.cuts(b"\x7b\x78\x00\x7c") == []  # a small unknown group: nothing to cut, protobuf parses it


def _check_real_requests() -> None:
    """What tritonclient and perf_analyzer send passes unchanged: raw tensors, typed contents, shared memory."""
    pb, scan = _modules()
    req = _request([8, 3, 224, 224])
    req.parameters["priority"].int64_param = 1
    out = req.outputs.add(name="logits")
    out.parameters["classification"].int64_param = 5
    for key, value in (("shared_memory_region", "output_region_of_a_long_name"), ("shared_memory_offset", 0),
                       ("shared_memory_byte_size", 4000)):
        param = req.inputs[0].parameters[key]
        if isinstance(value, str):
            param.string_param = value
        else:
            param.int64_param = value
    data = req.SerializeToString()
    assert [(c.b - c.a, c.raw) for c in scan.cuts(data)] == [(64, True)]
    typed = _request([1, 3, 32, 32])
    del typed.raw_input_contents[:]
    typed.inputs[0].contents.fp32_contents.extend([0.5] * 3072)  # packed fixed32: not a varint, not counted
    assert scan.cuts(typed.SerializeToString()) == []


def _check_huge_messages_cost_nothing() -> None:
    """A 19 M-dimension shape and 1 M parameters (19 and 15 MB) are refused in about a millisecond each, with
    messages of a few hundred bytes."""
    _, scan = _modules()
    shape = b"\x0a\x06images\x12\x04FP32\x1a" + varint(19_000_000) + b"\x01" * 19_000_000
    attacks = [b"\x2a" + varint(len(shape)) + shape]
    entries = b"".join(b"\x22\x0b\x0a\x03p%02d\x12\x04\x10\x01\x10\x02" % (i % 100) for i in range(1_000_000))
    tensor = b"\x0a\x06images" + entries
    attacks.append(b"\x2a" + varint(len(tensor)) + tensor)
    for data in attacks:
        start = time.perf_counter()
        with pytest.raises(scan.OverLimit) as refused:
            scan.cuts(data)
        took = time.perf_counter() - start
        assert took < FAST_S and len(str(refused.value)) < 300, (took, str(refused.value))
