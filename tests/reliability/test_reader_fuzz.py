"""Property-based fuzzing (Hypothesis, bounded) of the readers that see untrusted bytes without a library:
the protobuf wire reader (artifact/protowire.py), the ONNX graph reader (artifact/onnx_wire.py), the external
tensor scan (artifact/onnx_scan.py) and the JPEG frame reader (server/pipeline/jpeg.py), each against the
library that has an answer (protobuf, onnx, Pillow).

Properties: where the library reads the bytes, the reader here finds the same fields (or, where it reads less
than the library, a subset the library agrees with); where the library refuses them, the reader refuses too or
reads only what it needs; nothing but the reader's own refusal (``Malformed``) is ever raised.
"""

from __future__ import annotations

import io
import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from google.protobuf import empty_pb2
from google.protobuf.message import DecodeError
from google.protobuf.unknown_fields import UnknownFieldSet
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from PIL import Image

from irpe.artifact import Preprocess, onnx_wire
from irpe.artifact.onnx_scan import TooDeep, external_tensors
from irpe.artifact.protowire import Malformed, fields
from irpe.server.pipeline.jpeg import plain_size, read_frame
from tests.server.helpers import encode, image

FUZZ = settings(max_examples=300, deadline=2000, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")


OVERLONG = [b"\xff" * 9 + b"\x01", b"\xff" * 9 + b"\x7f", b"\x80" * 9 + b"\x02", b"\xff" * 10 + b"\x01"]


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | 0x80 if value else byte)
        if not value:
            return bytes(out)


@st.composite
def wire_messages(draw: st.DrawFn) -> bytes:
    """Protobuf messages field by field (any number, every wire type, groups, lengths right or wrong)."""
    out = bytearray()
    for _ in range(draw(st.integers(0, 6))):
        number = draw(st.one_of(st.integers(1, 20), st.sampled_from([0, 2**29 - 1, 2**29, 2**32, 2**61])))
        wire = draw(st.sampled_from([0, 0, 1, 2, 2, 3, 4, 5, 6, 7]))
        out += _varint(number << 3 | wire)
        if wire == 0:
            out += draw(st.one_of(st.integers(0, 300).map(_varint), st.integers(0, 2**64 - 1).map(_varint),
                                  st.sampled_from(OVERLONG)))
        elif wire in (1, 5):
            out += draw(st.binary(min_size=8 if wire == 1 else 4, max_size=8 if wire == 1 else 4))
        elif wire == 2:
            payload = draw(st.binary(max_size=12))
            out += _varint(len(payload) + draw(st.sampled_from([0, 0, 0, 1, -1]))) if payload else b"\x00"
            out += payload
        elif wire == 3:
            out += draw(wire_messages()) + _varint(draw(st.sampled_from([number, number + 1])) << 3 | 4)
    if draw(st.booleans()):
        cut = draw(st.integers(0, len(out)))
        out = out[:cut]
    return bytes(out)


def _protobuf_fields(data: bytes) -> list[tuple[int, int, object]] | None:
    """protobuf's reading of ``data`` as a message of unknown fields: (number, wire, value) per varint or
    length-delimited field (groups and fixed-width fields left out, as protowire steps over them), or None."""
    message = empty_pb2.Empty()
    try:
        message.ParseFromString(data)
    except DecodeError:
        return None
    return [(f.field_number, f.wire_type, f.data) for f in UnknownFieldSet(message) if f.wire_type in (0, 2)]


def _protowire_fields(data: bytes) -> list[tuple[int, int, object]] | None:
    try:
        return [(n, w, a if w == 0 else data[a:b]) for n, w, a, b, _ in fields(data, 0, len(data))]
    except Malformed:
        return None


@FUZZ
@given(st.one_of(wire_messages(), st.binary(max_size=64)))
def test_protowire_reads_what_protobuf_reads_and_refuses_what_it_refuses(data: bytes) -> None:
    assert _protowire_fields(data) == _protobuf_fields(data)


def _seed_model() -> bytes:
    """A small graph with every part onnx_wire reads: nodes with int, ints and tensor attributes, a domain,
    initializers (raw, typed int32 and int64 data), an external tensor, outputs and a subgraph attribute."""
    body = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "body", [],
                             [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    external = numpy_helper.from_array(np.zeros(3, np.float32), "far")
    external.data_location = TensorProto.EXTERNAL
    external.ClearField("raw_data")
    external.external_data.add(key="location", value="weights.bin")
    nodes = [helper.make_node("Transpose", ["a"], ["t"], perm=[2, 3, 0, 1], name="tr"),
             helper.make_node("Gather", ["t", "idx"], ["g"], axis=0),
             helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.arange(4, dtype=np.int64))),
             helper.make_node("If", ["cond"], ["y"], then_branch=body, else_branch=body),
             helper.make_node("Custom", ["g", "c"], ["o"], domain="irpe.ort", num_buckets=5)]
    inits = [numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "w"),
             helper.make_tensor("idx", TensorProto.INT32, [3], [0, -1, 2]),
             helper.make_tensor("big", TensorProto.INT64, [2], [2**40, -5]), external]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 2, 3, 4])],
                              [helper.make_tensor_value_info("o", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


SEED = _seed_model()


@st.composite
def mutated_models(draw: st.DrawFn) -> bytes:
    """The seed model with bytes flipped, overwritten, cut, inserted or repeated."""
    data = bytearray(SEED)
    for _ in range(draw(st.integers(1, 4))):
        pos = draw(st.integers(0, len(data) - 1))
        op = draw(st.sampled_from(["flip", "set", "cut", "insert", "repeat"]))
        if op == "flip":
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif op == "set":
            data[pos] = draw(st.sampled_from([0, 1, 2, 8, 0x0A, 0x12, 0x3A, 0x7F, 0x80, 0xFF]))
        elif op == "cut":
            del data[pos:pos + draw(st.integers(1, 16))]
        elif op == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        else:
            end = min(len(data), pos + draw(st.integers(1, 40)))
            data[pos:pos] = data[pos:end]
        if not data:
            break
    return bytes(data)


def _raw(text: str | bytes) -> bytes:
    """A name as bytes: protobuf gives bytes for a string field that is not UTF-8, onnx_wire keeps them in a
    str (surrogate escapes)."""
    return text if isinstance(text, bytes) else text.encode("utf-8", "surrogateescape")


def _onnx(data: bytes) -> onnx.ModelProto | None:
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except DecodeError:
        return None
    return model


@FUZZ
@given(mutated_models())
def test_onnx_wire_reads_the_graph_onnx_reads(data: bytes) -> None:
    """Where onnx parses the bytes (one graph field), onnx_wire finds the same nodes, initializers and
    outputs, and decodes each initializer as onnx's numpy_helper does (or leaves it undecoded: None)."""
    model = _onnx(data)
    try:
        read = onnx_wire.read(data)
    except Malformed:
        assert model is None or len([n for n, w, *_ in fields(data, 0, len(data)) if n == 7 and w == 2]) != 1
        return
    if model is None:
        return  # bytes onnx_wire does not read (inside weights, types, subgraphs) are left to the runtime
    graph = model.graph
    assert [[_raw(n.op_type), *map(_raw, n.inputs), b"|", *map(_raw, n.outputs), _raw(n.name), _raw(n.domain)]
            for n in read.nodes] == \
        [[_raw(n.op_type), *map(_raw, n.input), b"|", *map(_raw, n.output), _raw(n.name), _raw(n.domain)]
         for n in graph.node]
    assert list(map(_raw, read.outputs)) == [_raw(o.name) for o in graph.output]
    assert set(map(_raw, read.initializers)) == {_raw(t.name) for t in graph.initializer}
    for proto in graph.initializer:
        if isinstance(proto.name, bytes):
            continue
        got = read.array(proto.name)
        if got is not None and [t.name for t in graph.initializer].count(proto.name) == 1:  # one of that name
            want = numpy_helper.to_array(proto)
            assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want, equal_nan=True)


@FUZZ
@given(mutated_models())
def test_onnx_scan_finds_every_external_tensor_onnx_finds(data: bytes) -> None:
    """Where onnx parses the bytes, every tensor it would read from another file is found by the scan (the
    loader refuses the artifact): a file the scan cannot read must not hide one."""
    model = _onnx(data)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model.onnx"
        path.write_bytes(data)
        try:
            found = {t.name for t in external_tensors(path)}
        except TooDeep:
            return
    if model is None:
        return
    from onnx.external_data_helper import _get_all_tensors

    want = {t.name if isinstance(t.name, str) else t.name.decode("utf-8", "replace")  # the scan's reading
            for t in _get_all_tensors(model) if t.data_location == TensorProto.EXTERNAL or len(t.external_data)}
    assert want <= found, (want, found)


def _jpeg_seeds() -> list[bytes]:
    rgb = image((40, 28))
    exif = Image.Exif()
    exif[0x0112] = 6
    out = io.BytesIO()
    rgb.save(out, "JPEG", exif=exif)
    return [encode(rgb, "JPEG", quality=80), encode(rgb, "JPEG", progressive=True),
            encode(rgb.convert("L"), "JPEG"), encode(rgb.convert("CMYK"), "JPEG"), out.getvalue(),
            encode(image((3, 700)), "JPEG", quality=50, restart_marker_blocks=1)]


JPEG_SEEDS = _jpeg_seeds()


@st.composite
def mutated_jpegs(draw: st.DrawFn) -> bytes:
    """A JPEG with its header bytes (the first 700) flipped, set to marker bytes, cut or repeated."""
    data = bytearray(draw(st.sampled_from(JPEG_SEEDS)))
    for _ in range(draw(st.integers(1, 4))):
        pos = draw(st.integers(0, min(len(data), 700) - 1))
        op = draw(st.sampled_from(["flip", "set", "cut", "repeat"]))
        if op == "flip":
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif op == "set":
            data[pos] = draw(st.sampled_from([0x00, 0x01, 0xFF, 0xC0, 0xC2, 0xC4, 0xD0, 0xD8, 0xD9, 0xDA, 0xE1]))
        elif op == "cut":
            del data[pos:pos + draw(st.integers(1, 8))]
        else:
            data[pos:pos] = data[pos:pos + draw(st.integers(2, 24))]
        if len(data) < 4:
            break
    return bytes(data)


@FUZZ
@given(mutated_jpegs())
def test_the_jpeg_frame_reader_gives_the_size_pillow_gives(data: bytes) -> None:
    """Where the frame reader finds a frame and Pillow opens the file as a JPEG, both give the same size and
    component count (the pixel limits are checked on that size before anything decodes); the fast path's size
    is one Pillow opens the file with."""
    frame = read_frame(data)
    strict = read_frame(data, strict=True)
    assert strict is None or strict == frame
    fast = plain_size(data, Preprocess(resize=36, crop=32), 2_000_000)
    try:
        with Image.open(io.BytesIO(data)) as img:
            size, layers, fmt = img.size, len(img.getbands()), img.format
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError):
        assert fast is None, fast
        return
    assert fast is None or fast == size, (fast, size)
    if frame is not None and fmt in ("JPEG", "MPO"):
        assert (frame.width, frame.height) == size, (frame, size)
        assert frame.components == layers or frame.components == 4 and layers == 4, (frame, layers)
