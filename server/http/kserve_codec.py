"""The Open Inference Protocol's wire format: request parsing, response rendering, HTTP compression.

Every check happens before the work it guards, so a request costs at most what its size allows:
strict JSON (no ``NaN``/``Infinity`` constants, integers of at most 20 digits, ASCII-digit header
lengths), exactly the datatype the metadata declares (FP32), at most one output entry per model output
(a repeated output is refused, not rendered again), and an inflated body never larger than the body
limit. Any violation is a :class:`ProtocolError` (HTTP 400 or 413); nothing here raises anything else.
"""

from __future__ import annotations

import gzip
import json
import math
import zlib
from typing import Any, NamedTuple

import numpy as np
import orjson

from irpe.artifact import ModelArtifact

from ..pipeline import oip
from ..pipeline.oip import DATATYPE, ProtocolError
from ..pipeline.sysshm import OwnedRegions

__all__ = ["DATATYPE", "ProtocolError"]
MAX_INT_DIGITS = 20  # any count or size that fits an int64; longer integers are refused before int()
_ITEM = 4  # bytes per FP32
_DATATYPE_JSON = json.dumps(DATATYPE)


def _refuse_constant(token: str) -> float:
    raise ProtocolError(f"request JSON contains {token}, which is not JSON; send finite numbers")


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ProtocolError(f"request JSON has an integer of {len(text)} digits; at most {MAX_INT_DIGITS} allowed")
    return int(text)


_DECODER = json.JSONDecoder(parse_constant=_refuse_constant, parse_int=_bounded_int)  # json.loads makes one a call
_PLAIN = json.JSONDecoder(parse_constant=_refuse_constant)  # for a text without MAX_INT_DIGITS + 1 digits in a row
_DIGITS = bytes(48 if 48 <= i <= 57 else 120 for i in range(256))  # every digit "0", anything else "x"
_LONG = b"0" * (MAX_INT_DIGITS + 1)
PLAIN_BYTES = 2048  # a header up to this size is searched for 21 digits in a row (see loads)
_ENCODER = json.JSONEncoder(allow_nan=False)  # what json.dumps(..., allow_nan=False) makes on every call
_ESCAPE = json.encoder.encode_basestring_ascii  # a str as json.dumps writes it (ensure_ascii)


def loads(raw: bytes) -> Any:
    """Strict JSON: refuses NaN/Infinity and integers over 20 digits (400, never 500); what ``json.loads`` with
    these hooks returns and raises."""
    if raw[:1] == b"{" and raw[1:2] != b"\x00":  # UTF-8 (what json.detect_encoding says of it)
        encoding = "utf-8"  # a short text (a binary request's header) without 21 digits in a row has no integer
        # over 20 digits (the search: 0.6 us for 200 bytes, 4 us for 2 KB; JSON data keeps the hook)
        decoder = _PLAIN if len(raw) <= PLAIN_BYTES and _LONG not in raw.translate(_DIGITS) else _DECODER
    else:
        encoding, decoder = json.detect_encoding(raw), _DECODER
    try:
        return decoder.decode(raw.decode(encoding, "surrogatepass"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise ProtocolError(f"request header is not valid JSON ({str(e)[:200]})") from None


def header_length(value: str | None, body_size: int) -> int:
    """``Inference-Header-Content-Length``: ASCII digits, at most the body size; absent means all JSON."""
    if value is None:
        return body_size
    text = value.strip()
    if not (text.isascii() and text.isdigit() and len(text) <= MAX_INT_DIGITS):
        raise ProtocolError(f"Inference-Header-Content-Length must be a byte count in ASCII digits, got {value!r}")
    size = int(text)
    if size > body_size:
        raise ProtocolError(f"Inference-Header-Content-Length {size} exceeds the body's {body_size} bytes")
    return size


def _parameters(obj: dict[str, Any], where: str) -> dict[str, Any]:
    params = obj.get("parameters")
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise ProtocolError(f"{where}.parameters must be an object, got {params!r}")
    return params


def _flag(params: dict[str, Any], key: str, where: str, default: bool = False) -> bool:
    value = params.get(key, default)
    if not isinstance(value, bool):
        raise ProtocolError(f"{where}.parameters.{key} must be true or false, got {value!r}")
    return value


def parse_request(header: bytes, artifact: ModelArtifact) -> tuple[dict[str, Any], dict[str, Any]]:
    """The request object and its one input spec, validated against the model metadata."""
    req = loads(header)
    if not isinstance(req, dict):
        raise ProtocolError("request must be a JSON object with 'inputs'")
    if "id" in req and not isinstance(req["id"], str):
        raise ProtocolError(f"request id must be a string, got {type(req['id']).__name__}")
    _parameters(req, "request")
    inputs = req.get("inputs")
    if not isinstance(inputs, list) or len(inputs) != 1 or not isinstance(inputs[0], dict):
        raise ProtocolError(f"expected exactly one input {artifact.input_name!r}")
    spec = inputs[0]
    oip.check_input(spec.get("name"), spec.get("datatype"), spec.get("shape"), artifact)
    _parameters(spec, "input")
    return req, spec


def input_region(spec: dict[str, Any]) -> oip.ShmRef | None:
    """Where the input lies in a client shared-memory region (None: in the body); the region is read later,
    in a thread, once the client's uid is known (:func:`..pipeline.oip.shm_input`)."""
    params = _parameters(spec, "input")
    ref = oip.shm_ref(params, "input")
    if ref is not None and ("data" in spec or "binary_data_size" in params):
        raise ProtocolError(f"input {spec['name']!r} must set only one of 'data', 'binary_data_size' and "
                            "'shared_memory_region'")
    return ref


def input_array(spec: dict[str, Any], body: bytes, offset: int, max_images: int) -> np.ndarray:
    """The ``images`` tensor from JSON ``data`` or binary data after the header (an input in shared memory:
    :func:`input_region`); finite FP32 only, at most ``max_images`` (the config's ``max_batch_size``: Triton's
    400)."""
    shape = spec["shape"]
    oip.check_batch(shape[0], max_images)  # before the tensor is built
    want_bytes = math.prod(shape) * _ITEM  # Python ints: no int64 wrap-around for a 20-digit N
    params = _parameters(spec, "input")
    if "binary_data_size" in params:
        size = oip.count(params["binary_data_size"], "binary_data_size")
        if size != want_bytes or offset + size > len(body):
            raise ProtocolError(f"input {spec['name']!r}: binary_data_size {size} must equal {want_bytes} "
                                f"(shape {shape}, FP32) and fit the {len(body) - offset} bytes after the header")
        images = np.frombuffer(body, dtype="<f4", count=size // _ITEM, offset=offset).reshape(shape)
    else:
        images = _json_data(spec.get("data"), shape, want_bytes // _ITEM)
    return oip.check_images(images, max_images)


def _json_data(data: object, shape: list[int], count: int) -> np.ndarray:
    if not isinstance(data, list):
        raise ProtocolError("input needs 'data' (a list of numbers) or parameters.binary_data_size")
    try:
        arr = np.asarray(data)
    except (ValueError, TypeError, RecursionError) as e:
        raise ProtocolError(f"input data is not a (nested) list of numbers ({str(e)[:120]})") from None
    if arr.dtype.kind not in "iuf" or arr.size != count:
        raise ProtocolError(f"input data must hold {count} numbers for shape {shape}, got {arr.size} of "
                            f"kind {arr.dtype.name}")
    with np.errstate(over="ignore"):  # beyond the FP32 range becomes inf, refused by the caller
        return arr.astype(np.float32).reshape(shape)


def _registry(shm: OwnedRegions | None) -> OwnedRegions:
    if shm is None:
        raise ProtocolError("this endpoint takes no shared memory")
    return shm


class Output(NamedTuple):
    """One requested output: classification ``k`` (0: the logits), binary or JSON, or a shared-memory region."""

    k: int
    binary: bool
    shm: oip.ShmRef | None = None


def requested_outputs(req: dict[str, Any], artifact: ModelArtifact) -> list[Output]:
    """One :class:`Output` per requested output: at most one entry per model output (H1)."""
    default_binary = _flag(_parameters(req, "request"), "binary_data_output", "request")
    wanted = req.get("outputs")
    if wanted is None or wanted == []:  # none listed: every model output, with the request's default
        return [Output(0, default_binary)]
    if not isinstance(wanted, list) or not all(isinstance(o, dict) for o in wanted):
        raise ProtocolError(f'outputs must be a list of objects like {{"name": "{artifact.output_name}"}}')
    out = []
    for o in wanted:
        params = _parameters(o, "output")
        k = oip.classification(o.get("name"), params, artifact, len(wanted))
        ref = oip.shm_ref(params, "output")
        if ref is not None and k:
            raise ProtocolError("an output can't set both 'shared_memory_region' and 'classification'")
        out.append(Output(k, _flag(params, "binary_data", "output", default_binary), ref))
    return out


def render(req: dict[str, Any], request_id: str, logits: np.ndarray, artifact: ModelArtifact, name: str = "",
           version: str = "1", shm: OwnedRegions | None = None, outputs: list[Output] | None = None,
           ) -> tuple[bytes, int | None]:
    """The response body, and the JSON header length when binary outputs follow it (``name``/``version``:
    the model version that computed it; default: model.json's name, version 1; ``outputs``:
    :func:`requested_outputs` of ``req`` when already known)."""
    outputs = requested_outputs(req, artifact) if outputs is None else outputs
    name = name or artifact.name
    answer_id = req.get("id") or request_id
    if len(outputs) == 1 and not outputs[0].k and outputs[0].shm is None and (quick := _render_logits(
            name, version, answer_id, artifact.output_name, logits, outputs[0].binary)) is not None:
        return quick
    head: dict[str, Any] = {"model_name": name, "model_version": version, "id": answer_id, "outputs": []}
    blobs = []
    for k, binary, ref in outputs:
        if ref is not None:  # written to the client's region; the answer names it without data
            oip.shm_output(_registry(shm), ref, artifact.output_name, logits)
            head["outputs"].append({"name": artifact.output_name, "datatype": DATATYPE, "shape": list(logits.shape)})
            continue
        if k:
            out: dict[str, Any] = {"name": artifact.output_name, "datatype": "BYTES", "shape": [len(logits), k]}
            strings = oip.classes(logits, k, artifact.labels)
            blob, data = (oip.bytes_tensor(strings), None) if binary else (b"", strings)
        else:
            out = {"name": artifact.output_name, "datatype": DATATYPE, "shape": list(logits.shape)}
            flat = np.ascontiguousarray(logits, dtype="<f4")
            blob, data = (flat.tobytes(), None) if binary else (b"", flat.reshape(-1).tolist())
        if binary:
            out["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            out["data"] = data
        head["outputs"].append(out)
    text = _ENCODER.encode(head).encode()
    return (text + b"".join(blobs), len(text)) if blobs else (text, None)


def _render_logits(name: str, version: str, answer_id: str, output: str, logits: np.ndarray, binary: bool,
                   ) -> tuple[bytes, int | None] | None:
    """:func:`render`'s answer for the logits as one output, the same bytes for a fraction of the CPU: the JSON
    written around the values, the values by orjson where its text is ``float.__repr__``'s (None elsewhere:
    :func:`render` then writes it with ``json``)."""
    flat = np.ascontiguousarray(logits, dtype="<f4")
    head = (f'{{"model_name": {_ESCAPE(name)}, "model_version": {_ESCAPE(version)}, "id": {_ESCAPE(answer_id)}, '
            f'"outputs": [{{"name": {_ESCAPE(output)}, "datatype": {_DATATYPE_JSON}, "shape": '
            f'[{", ".join(map(str, logits.shape))}], ')
    if binary:
        blob = flat.tobytes()
        text = f'{head}"parameters": {{"binary_data_size": {len(blob)}}}}}]}}'.encode()
        return text + blob, len(text)
    values = _floats_json(flat.reshape(-1).tolist())
    return None if values is None else (f'{head}"data": '.encode() + values + b"}]}", None)


def _floats_json(values: list[float]) -> bytes | None:
    """``json.dumps(values)`` of floats, or None where orjson's text differs (or json would raise).

    Both write the shortest text that reads back as the same double; they differ only below 1e-4 (json
    ``1e-05``, orjson ``1e-5`` or ``0.00001``), where orjson's text holds ``e-`` or ``0.0000``, and on NaN and
    infinities (json raises with ``allow_nan=False``; orjson writes ``null``). Any of the three falls back
    (a false alarm, such as ``10.000009536743164``, only costs the slow way)."""
    text = orjson.dumps(values)
    if b"e-" in text or b"0.0000" in text or b"null" in text:
        return None
    return text.replace(b",", b", ")


def inflate(body: bytes, encoding: str, limit: int) -> bytes:
    """Decode a ``Content-Encoding: gzip|deflate|identity`` body; 413 once the output passes ``limit``."""
    enc = encoding.strip().lower()
    if enc in ("", "identity"):
        return body
    if enc not in ("gzip", "x-gzip", "deflate"):
        raise ProtocolError(f"unsupported Content-Encoding {encoding!r}; use gzip, deflate or none", 415)
    for wbits in ((31,) if enc != "deflate" else (15, -15)):  # deflate: zlib stream, or raw as some send it
        d = zlib.decompressobj(wbits)
        try:
            out = d.decompress(body, limit + 1)
        except zlib.error:
            continue
        if len(out) > limit or d.unconsumed_tail:
            raise ProtocolError(f"request body inflates to more than {limit} bytes (--max-body-mb)", 413)
        if not d.eof:
            raise ProtocolError(f"truncated {enc} request body")
        return out
    raise ProtocolError(f"request body is not valid {enc} data")


def negotiate(accept: str | None) -> str | None:
    """The response encoding for an ``Accept-Encoding`` header: gzip, deflate or None."""
    if not accept:
        return None
    weights = {}
    for part in accept.lower().split(","):
        name, _, q = part.strip().partition(";")
        try:
            weights[name.strip()] = float(q.strip()[2:]) if q.strip().startswith("q=") else 1.0
        except ValueError:
            weights[name.strip()] = 0.0
    usable = [(w, name) for name, w in weights.items() if name in ("gzip", "deflate") and 0 < w <= 1]
    return max(usable)[1] if usable else None


def compress(body: bytes, encoding: str) -> bytes:
    """gzip or deflate (zlib stream, as HTTP's ``deflate`` means) at a fast level."""
    return gzip.compress(body, compresslevel=1) if encoding == "gzip" else zlib.compress(body, 1)
