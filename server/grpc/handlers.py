"""The gRPC method table of ``inference.GRPCInferenceService``, with ModelInfer's tensor bytes left in place.

The table is built from the service descriptor (the messages of ``tritonclient.grpc``), as the generated
``add_GRPCInferenceServiceServicer_to_server`` builds it, with one difference: a ModelInfer request is split
before protobuf parses it. Its ``raw_input_contents`` (field 7, the tensor bytes: 600 KB for one 224 px image)
become views of the received buffer, and protobuf parses only the rest (names, shapes, parameters). Parsing
the whole message copied the tensor once into the message and once more when read out of it.
Anything the scan (:mod:`irpe.artifact.protowire`, the wire format read without a schema) does not
understand is handed to protobuf whole, so a malformed message fails as before. A message of more than
:data:`FIELD_BUDGET` top-level fields is refused unparsed (:class:`TooManyFields`): a real request has one per
input, output, parameter and tensor, and protobuf's parser holds the GIL while it walks millions of tiny fields
(0.5 s for 16 MB), whichever thread it runs in. A request id over :data:`MAX_ID_BYTES` is left out too (the
servicer refuses the request without copying it). ModelStreamInfer's requests are split the same way. RPCs the
servicer does not implement answer UNIMPLEMENTED, with no traceback.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import grpc
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc.service_pb2_grpc import GRPCInferenceServiceServicer

from irpe.artifact.protowire import Malformed, fields

SERVICE = "inference.GRPCInferenceService"
RAW_INPUT_CONTENTS = 7  # ModelInferRequest.raw_input_contents: repeated bytes
REQUEST_ID = 3  # ModelInferRequest.id: string
MAX_ID_BYTES = 4096  # a longer id is left out of the parse (the servicer refuses the request, naming its cap)
FIELD_BUDGET = 256  # top-level fields a request may have (see the module docstring)
STREAMED = ("ModelInfer", "ModelStreamInfer")  # RPCs whose requests are split


class TooManyFields(DecodeError):
    """A request of more top-level fields than :data:`FIELD_BUDGET`."""


@dataclass
class InferCall:
    """A ModelInfer request: the message without its raw tensors, and the tensors as views (in order);
    ``id_bytes``: the size of a request id over MAX_ID_BYTES, left out of the message (0: none)."""

    message: pb.ModelInferRequest
    raw: list[memoryview] = field(default_factory=list)
    id_bytes: int = 0


class Cut(NamedTuple):
    """A field taken out of the message before protobuf parses the rest: at ``at``, its value ``data[a:b]`` (a
    named tuple: one is made per request, and a dataclass costs several times more)."""

    at: int
    a: int
    b: int
    raw: bool  # a raw tensor (else a request id over MAX_ID_BYTES)


def parse_infer(data: bytes) -> InferCall:
    """Split a serialized ModelInferRequest (see the module docstring)."""
    cuts = _cuts(data)
    if cuts is None:
        raise TooManyFields(f"more than {FIELD_BUDGET} top-level fields; a ModelInferRequest has one per input, "
                            "output, parameter and raw tensor")
    if not cuts:  # nothing to split off, or not well-formed: protobuf's own parse, answer or error
        return InferCall(pb.ModelInferRequest.FromString(data))
    view, rest, last = memoryview(data), [], 0
    for cut in cuts:
        rest.append(view[last:cut.at])
        last = cut.b
    rest.append(view[last:])
    message = pb.ModelInferRequest.FromString(b"".join(rest))
    long_ids = [c.b - c.a for c in cuts if not c.raw]
    if long_ids:
        return InferCall(message, [view[c.a:c.b] for c in cuts if c.raw], max(long_ids))
    return InferCall(message, [view[c.a:c.b] for c in cuts])


def _cuts(data: bytes) -> list[Cut] | None:
    """The raw tensors and over-long ids of the message; [] when it is malformed (protobuf then parses it, and
    fails), None past FIELD_BUDGET top-level fields."""
    cuts, count = [], 0
    try:
        for number, wire, a, b, at in fields(data, 0, len(data)):
            count += 1
            if count > FIELD_BUDGET:
                return None
            if wire == 2:
                if number == RAW_INPUT_CONTENTS:
                    cuts.append(Cut(at, a, b, True))
                elif number == REQUEST_ID and b - a > MAX_ID_BYTES:
                    cuts.append(Cut(at, a, b, False))
    except Malformed:
        return []
    return cuts


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
        handlers[method.name] = make(behavior, request_deserializer=parse,
                                     response_serializer=response.SerializeToString)
    return grpc.method_handlers_generic_handler(SERVICE, handlers)
