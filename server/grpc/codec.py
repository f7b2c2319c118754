"""The gRPC wire of the Open Inference Protocol: protobuf messages to and from what :mod:`..pipeline.oip` checks
and answers.

The messages are ``tritonclient.grpc``'s, generated from the published ``grpc_service.proto`` and
``model_config.proto`` (the ``grpc`` extra). An inference request carries the one FP32 input ``images``
[N,3,H,W] either as ``raw_input_contents`` (little-endian bytes, Triton's and perf_analyzer's way) or as
typed ``contents.fp32_contents``; the answer always carries its output in ``raw_output_contents``, as Triton
does. An output with ``parameters["classification"]`` k gets the classification extension's BYTES strings.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as config_pb2
from tritonclient.grpc import service_pb2 as pb

from irpe.artifact import ModelArtifact
from irpe.artifact.protowire import length_delimited
from irpe.artifact.protowire import write_varint as _varint

from ..pipeline import oip
from ..pipeline.oip import ProtocolError
from ..pipeline.sysshm import OwnedRegions

_ITEM = 4  # bytes per FP32
INLINE_MESSAGE_BYTES = 64 << 10  # a parsed message up to this size is checked on the event loop (real: < 1 KB)
ANSWER_HEADS = 256  # answer heads kept (:func:`answer_bytes`; then forgotten at once): per version, output, batch size


def param_value(p: pb.InferParameter) -> Any:
    """An ``InferParameter``'s value (bool, int, str or float; None when unset)."""
    which = p.WhichOneof("parameter_choice")
    return getattr(p, which) if which else None


def params(field: Any) -> dict[str, Any]:
    """A ``map<string, InferParameter>`` as a plain dict."""
    return {k: param_value(v) for k, v in field.items()}


def raw_inputs(req: pb.ModelInferRequest) -> list[bytes]:
    """``raw_input_contents``, read once: every access to a protobuf bytes field makes a new copy (600 KB for
    one 224 px image)."""
    return list(req.raw_input_contents)


def inline(raw: Sequence[bytes | memoryview], size: int = 0) -> bool:
    """Whether checking the request costs less than a hop to the decode pool: raw bytes (:func:`raw_inputs`),
    small, and a small message (``size``: the bytes protobuf parsed, the raw tensors left out)."""
    return len(raw) == 1 and len(raw[0]) <= oip.INLINE_BYTES and size <= INLINE_MESSAGE_BYTES


def checked(req: pb.ModelInferRequest, artifact: ModelArtifact, max_images: int, shm: OwnedRegions | None,
            raw: Sequence[bytes | memoryview] | None = None) -> tuple[np.ndarray, int, oip.ShmRef | None]:
    """The request checked whole, before any inference: :func:`decode_infer`'s images, then :func:`requested`'s
    classification k and output region (one call: on the event loop or in the decode pool, :func:`inline`).

    Args:
        req: the request (its raw tensors in ``raw`` when split off).
        artifact: the model's artifact.
        max_images: the batch limit.
        shm: the caller's regions (None when the request names none).
        raw: the request's :func:`raw_inputs`, when already read.

    Returns:
        (images, k, the output's region or None).

    Raises:
        ProtocolError: 400 for what the model does not take; APIError: 404 for an unknown region.
    """
    images = decode_infer(req, artifact, max_images, shm, raw)
    k, ref = requested(req, artifact, len(images), shm)
    return images, k, ref


def known_checked(known: Any, artifact: ModelArtifact, max_images: int,
                  raw: Sequence[bytes | memoryview]) -> tuple[np.ndarray, int] | None:
    """:func:`checked`'s images and k for a request of a layout seen before (:class:`.handlers.Known`), whose checks
    passed for this artifact and batch limit: the same message (but for its tensor's values, which are checked
    here), so the same images' shape and k, no region, checked on the event loop as it was.

    Args:
        known: the request's remembered layout (:attr:`.handlers.InferCall.known`; None: not remembered).
        artifact: the model's artifact.
        max_images: the batch limit.
        raw: the request's raw tensor (one).

    Returns:
        (images, k), or None when the layout's checks are not remembered for this artifact and limit.

    Raises:
        ProtocolError: 400 for non-finite values.
    """
    plan = known.checked if known is not None else None
    if plan is None or plan[0] is not artifact or plan[1] != max_images:
        return None
    return oip.check_images(np.frombuffer(raw[0], dtype="<f4").reshape(plan[2]), max_images), plan[3]


def decode_infer(req: pb.ModelInferRequest, artifact: ModelArtifact, max_images: int,
                 shm: OwnedRegions | None, raw: Sequence[bytes | memoryview] | None = None) -> np.ndarray:
    """The checked ``images`` array of an inference request (every check before any inference; an input in
    shared memory is read after them, so call this in a thread then); ``shm``: the caller's regions (None when
    the request names none); ``raw``: its :func:`raw_inputs` when already read (or the views :mod:`.handlers`
    split off)."""
    raw = raw_inputs(req) if raw is None else raw
    if len(req.inputs) != 1:
        raise ProtocolError(f"expected exactly one input {artifact.input_name!r}, got {len(req.inputs)}")
    spec = req.inputs[0]
    shape = oip.check_input(spec.name, spec.datatype, list(spec.shape), artifact)
    others = [f.name for f, _ in spec.contents.ListFields() if f.name != "fp32_contents"]
    if others:
        raise ProtocolError(f"input {spec.name!r} is FP32: send fp32_contents or raw_input_contents, not "
                            f"{others[0]}")
    given = [what for what, there in (("raw_input_contents", bool(raw)),
                                      ("contents", bool(spec.contents.fp32_contents)),
                                      ("shared_memory_region", "shared_memory_region" in spec.parameters)) if there]
    if len(given) > 1:
        raise ProtocolError(f"input {spec.name!r} must set only one of {' and '.join(given)}")
    ref = oip.shm_ref(params(spec.parameters), "input")
    if ref is not None:
        if shm is None:
            raise ProtocolError(f"input {spec.name!r} names a shared memory region this call may not use")
        return oip.shm_input(shm, ref, spec.name, shape, max_images)
    oip.check_batch(shape[0], max_images)
    return oip.check_images(_tensor(raw, spec, shape), max_images)


def _tensor(raws: Sequence[bytes | memoryview], spec: Any, shape: list[int]) -> np.ndarray:
    count = math.prod(shape)
    if raws:
        if len(raws) != 1:
            raise ProtocolError(f"raw_input_contents has {len(raws)} entries; the model has one input")
        raw = raws[0]
        if len(raw) != count * _ITEM:
            raise ProtocolError(f"input {spec.name!r}: raw_input_contents has {len(raw)} bytes; shape {shape} "
                                f"FP32 needs {count * _ITEM}")
        return np.frombuffer(raw, dtype="<f4").reshape(shape)
    typed = spec.contents.fp32_contents
    if len(typed) != count:
        raise ProtocolError(f"input {spec.name!r}: contents.fp32_contents has {len(typed)} values; shape "
                            f"{shape} needs {count} (or send raw_input_contents)")
    return np.asarray(typed, dtype=np.float32).reshape(shape)


def requested(req: pb.ModelInferRequest, artifact: ModelArtifact, images: int,
              shm: OwnedRegions | None) -> tuple[int, oip.ShmRef | None]:
    """The classification k the request asks for (0: the logits; no outputs listed: the logits), and the
    shared-memory region the logits go to (checked before inference: it exists and holds them)."""
    outs = req.outputs
    if not outs:
        return 0, None
    given = params(outs[0].parameters)
    k = oip.classification(outs[0].name, given, artifact, len(outs))
    ref = oip.shm_ref(given, "output")
    if ref is not None:
        if k:
            raise ProtocolError("an output can't set both 'shared_memory_region' and 'classification'")
        if shm is None:
            raise ProtocolError("the output names a shared memory region this call may not use")
        shm.check(*ref)  # 404 when the caller has not registered it, 400 outside it
        oip.shm_fits(ref, artifact.output_name, images * artifact.num_classes * _ITEM)
    return k, ref


def encode_infer(req: pb.ModelInferRequest, logits: np.ndarray, k: int, artifact: ModelArtifact, name: str,
                 version: str, request_id: str) -> pb.ModelInferResponse:
    """The answer: the logits as FP32, or k classification strings per image as BYTES (``raw_output_contents``
    empty when the logits went to shared memory: pass ``k`` -1)."""
    out = pb.ModelInferResponse(model_name=name, model_version=version, id=req.id or request_id)
    tensor = out.outputs.add(name=artifact.output_name)
    if k > 0:
        tensor.datatype = "BYTES"
        tensor.shape.extend([len(logits), k])
        out.raw_output_contents.append(oip.bytes_tensor(oip.classes(logits, k, artifact.labels)))
    else:
        tensor.datatype = oip.DATATYPE
        tensor.shape.extend(logits.shape)
        if k == 0:
            out.raw_output_contents.append(np.ascontiguousarray(logits, dtype="<f4").tobytes())
    return out


def answer_bytes(name: str, version: str, request_id: str, output: str, logits: np.ndarray) -> bytes:
    """:func:`encode_infer`'s answer carrying the logits (k 0) as ``SerializeToString`` writes it, built as bytes:
    the same fields in field-number order (model_name 1, model_version 2, id 3, outputs 5, raw_output_contents 6),
    an empty string left out as proto3 leaves it out. Every answer of a model is the same but for its id and its
    logits: the rest is made once per (name, version, output, shape) and kept (:func:`serialized` sends it as it is).

    Args:
        name: the model's name.
        version: its version.
        request_id: the answer's id.
        output: the output tensor's name.
        logits: the logits [N, classes].

    Returns:
        The serialized ``ModelInferResponse``.
    """
    key = (name, version, output, logits.shape)
    if (head := _HEADS.get(key)) is None:
        if len(_HEADS) >= ANSWER_HEADS:
            _HEADS.clear()
        shape = b"".join(_varint(d) for d in logits.shape)
        tensor = _field(1, output.encode()) + _field(2, oip.DATATYPE.encode()) + _field(3, shape)
        head = _HEADS[key] = (_field(1, name.encode()) + _field(2, version.encode()), _field(5, tensor))
    rid, raw = request_id.encode(), np.ascontiguousarray(logits, dtype="<f4").tobytes()
    n, m = len(rid), len(raw)
    return b"".join((head[0], b"\x1a" if n else b"", _SIZES[n] if n < 128 else _varint(n), rid, head[1], b"\x32",
                     _SIZES[m] if m < 128 else _varint(m), raw))


def serialized(answer: pb.ModelInferResponse | bytes) -> bytes:
    """ModelInfer's response serializer: an answer :func:`answer_bytes` made is sent as it is."""
    return answer if type(answer) is bytes else answer.SerializeToString()  # type: ignore[union-attr]


_HEADS: dict[tuple[str, str, str, tuple[int, ...]], tuple[bytes, bytes]] = {}
_SIZES = [b""] + [bytes((n,)) for n in range(1, 128)]  # a length under 128 as its varint (0: no field at all)


def _field(number: int, data: bytes) -> bytes:
    """A length-delimited field (wire type 2); an empty one left out, as proto3 leaves out an empty string."""
    return length_delimited(number, data) if data else b""


def server_metadata() -> pb.ServerMetadataResponse:
    """Server name, version and extensions."""
    return pb.ServerMetadataResponse(**oip.server_metadata())


def model_metadata(meta: dict[str, Any]) -> pb.ModelMetadataResponse:
    """:func:`..pipeline.oip.model_metadata` as the message (which has no ``parameters``)."""
    tensors = {k: [pb.ModelMetadataResponse.TensorMetadata(**t) for t in meta[k]] for k in ("inputs", "outputs")}
    return pb.ModelMetadataResponse(name=meta["name"], versions=meta["versions"], platform=meta["platform"],
                                    **tensors)


def model_config(config: dict[str, Any]) -> pb.ModelConfigResponse:
    """Triton's model configuration message from its JSON form."""
    return pb.ModelConfigResponse(config=json_format.ParseDict(config, config_pb2.ModelConfig()))


def statistics(stats: dict[str, Any]) -> pb.ModelStatisticsResponse:
    """Triton's statistics message from its JSON form."""
    return json_format.ParseDict(stats, pb.ModelStatisticsResponse())


def repository_index(entries: list[dict[str, str]]) -> pb.RepositoryIndexResponse:
    """The repository index message."""
    return pb.RepositoryIndexResponse(models=[pb.RepositoryIndexResponse.ModelIndex(**e) for e in entries])


def shm_status(regions: list[dict[str, Any]]) -> pb.SystemSharedMemoryStatusResponse:
    """The registered system shared-memory regions, keyed by name."""
    out = pb.SystemSharedMemoryStatusResponse()
    for r in regions:
        out.regions[r["name"]].CopyFrom(pb.SystemSharedMemoryStatusResponse.RegionStatus(**r))
    return out
