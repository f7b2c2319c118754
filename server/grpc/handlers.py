"""The gRPC method table of ``inference.GRPCInferenceService``, with ModelInfer's tensor bytes left in place.

The table is built from the service descriptor (the messages of ``tritonclient.grpc``), as the generated
``add_GRPCInferenceServiceServicer_to_server`` builds it, with one difference: a ModelInfer request is split
before protobuf parses it. Its ``raw_input_contents`` (field 7, the tensor bytes: 600 KB for one 224 px image)
become views of the received buffer, and protobuf parses only the rest (names, shapes, parameters). Parsing
the whole message copied the tensor once into the message and once more when read out of it.
The scan (:mod:`.infer_scan`) finds them and checks the request's limits first: past one (the fields of the
request and of its inputs, outputs and parameters, a shape's dimensions, a string's size) the request is
refused unparsed (:class:`~.infer_scan.OverLimit`), since protobuf's parser holds the GIL while it reads them,
whichever thread it runs in. Anything the scan does not understand is handed to protobuf whole, so a malformed
message fails as before. A request id over :data:`MAX_ID_BYTES` is left out too (the servicer refuses the
request without copying it). ModelStreamInfer's requests are split the same way. RPCs the servicer does not
implement answer UNIMPLEMENTED, with no traceback.

A client sends the same message but for its tensor's bytes, call after call. A request whose one raw tensor comes
last (tritonclient's and perf_analyzer's layout) leaves its head, every byte before the tensor's, remembered
(:class:`Known`, at most :data:`KNOWN_LAYOUTS` heads of at most :data:`KNOWN_HEAD_BYTES`): a later request of the
same size that starts with the same head is the same message with another tensor of the same size, and takes the
parse (and the servicer's checks, :func:`.codec.known_checked`) of the first, byte for byte what they would find
again; the tensor's values are checked on every request.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc.service_pb2_grpc import GRPCInferenceServiceServicer

from .codec import serialized
from .infer_scan import FIELD_BUDGET, MAX_ID_BYTES, Cut, OverLimit, TooManyFields, cuts

__all__ = ["FIELD_BUDGET", "MAX_ID_BYTES", "GenericOnly", "InferCall", "OverLimit", "TooManyFields", "parse_infer",
           "service_handler"]
SERVICE = "inference.GRPCInferenceService"
STREAMED = ("ModelInfer", "ModelStreamInfer")  # RPCs whose requests are split
KNOWN_LAYOUTS = 64  # request heads remembered (then forgotten all at once)
KNOWN_HEAD_BYTES = 4096  # the longest head remembered (a real request's is about 150 bytes)


@dataclass
class Known:
    """A request layout seen before (module docstring): its ``head`` (every byte before its one raw tensor), its
    message parsed, the bytes protobuf parsed; ``checked``: what the servicer's checks found of it, set by
    :func:`.codec.known_checked`'s caller (the artifact and batch limit they held for, the shape, k)."""

    head: bytes
    message: pb.ModelInferRequest
    size: int
    checked: tuple[Any, int, tuple[int, ...], int] | None = None


_KNOWN: dict[int, Known] = {}  # by the size of the whole request


@dataclass
class InferCall:
    """A ModelInfer request: the message without its raw tensors, and the tensors as views (in order);
    ``id_bytes``: the size of a request id over MAX_ID_BYTES, left out of the message (0: none); ``size``: the
    bytes protobuf parsed (what the servicer's checks of the message may cost)."""

    message: pb.ModelInferRequest
    raw: list[memoryview] = field(default_factory=list)
    id_bytes: int = 0
    size: int = 0
    known: Known | None = None  # its layout, when remembered (module docstring)


def parse_infer(data: bytes) -> InferCall:
    """Split a serialized ModelInferRequest (see the module docstring).

    Args:
        data: the message as received.

    Returns:
        The request.

    Raises:
        DecodeError: protobuf's, for a malformed message; :class:`~.infer_scan.OverLimit` past a limit.
    """
    known = _KNOWN.get(len(data))
    if known is not None and data.startswith(known.head):
        return InferCall(known.message, [memoryview(data)[len(known.head):]], size=known.size, known=known)
    found = cuts(data)
    if not found:  # nothing to split off, or not well-formed: protobuf's own parse, answer or error
        return InferCall(pb.ModelInferRequest.FromString(data), size=len(data))
    view, rest, last = memoryview(data), [], 0
    for cut in found:
        rest.append(view[last:cut.at])
        last = cut.b
    rest.append(view[last:])
    kept = b"".join(rest)
    message = pb.ModelInferRequest.FromString(kept)
    long_ids = [c.b - c.a for c in found if not c.raw]
    if long_ids:
        return InferCall(message, [view[c.a:c.b] for c in found if c.raw], max(long_ids), len(kept))
    return InferCall(message, [view[c.a:c.b] for c in found], size=len(kept), known=_remember(data, found, message))


def _remember(data: bytes, found: list[Cut], message: pb.ModelInferRequest) -> Known | None:
    """The layout of a request whose one raw tensor comes last, remembered (module docstring); else None."""
    if len(found) != 1 or found[0].b != len(data) or found[0].a > KNOWN_HEAD_BYTES:
        return None
    if len(_KNOWN) >= KNOWN_LAYOUTS:
        _KNOWN.clear()
    known = _KNOWN[len(data)] = Known(data[:found[0].a], message, found[0].at)
    return known


def unimplemented(name: str) -> Callable[[Any, grpc.aio.ServicerContext], Awaitable[None]]:
    """An RPC this server does not implement: UNIMPLEMENTED, naming it (the generated base class raises
    NotImplementedError, which gRPC logs with a traceback per call)."""

    async def answer(request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{SERVICE}/{name} is not implemented by this server")

    return answer


def service_handler(servicer: Any) -> grpc.GenericRpcHandler:
    """Every RPC of the service, answered by ``servicer``'s method of the same name."""
    makers = {(False, False): grpc.unary_unary_rpc_method_handler, (False, True): grpc.unary_stream_rpc_method_handler,
              (True, False): grpc.stream_unary_rpc_method_handler, (True, True): grpc.stream_stream_rpc_method_handler}
    handlers = {}
    for method in pb.DESCRIPTOR.services_by_name[SERVICE.split(".")[-1]].methods:
        request, response = getattr(pb, method.input_type.name), getattr(pb, method.output_type.name)
        make = makers[(method.client_streaming, method.server_streaming)]
        parse = parse_infer if method.name in STREAMED else request.FromString
        behavior = getattr(servicer, method.name)
        if getattr(type(servicer), method.name, None) is getattr(GRPCInferenceServiceServicer, method.name):
            behavior = unimplemented(method.name)
        serialize = serialized if method.name == "ModelInfer" else response.SerializeToString
        handlers[method.name] = make(behavior, request_deserializer=parse, response_serializer=serialize)
    return grpc.method_handlers_generic_handler(SERVICE, handlers)


class GenericOnly:
    """A gRPC server as the generated ``add_*Servicer_to_server`` functions see it: their method table is added as a
    generic handler only, not also as registered methods. grpc.aio keeps one pending call request per registered
    method besides the generic one and, for every call it accepts, waits on all of them at once
    (``asyncio.wait``): each registered method costs every call, ModelInfer's too. Every method is answered the
    same either way, behind the same call gate (an interceptor sees every call)."""

    def __init__(self, server: grpc.aio.Server):
        self.server = server

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        """Add ``handlers`` to the server."""
        self.server.add_generic_rpc_handlers(handlers)

    def add_registered_method_handlers(self, service: str, handlers: Any) -> None:
        """Nothing: the same table came as a generic handler."""
