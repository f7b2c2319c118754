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
(0.5 s for 16 MB), whichever thread it runs in. ModelStreamInfer's requests are split the same way. RPCs the
servicer does not implement answer UNIMPLEMENTED, with no traceback.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc.service_pb2_grpc import GRPCInferenceServiceServicer

from irpe.artifact.protowire import Malformed, fields

SERVICE = "inference.GRPCInferenceService"
RAW_INPUT_CONTENTS = 7  # ModelInferRequest.raw_input_contents: repeated bytes
FIELD_BUDGET = 256  # top-level fields a request may have (see the module docstring)
STREAMED = ("ModelInfer", "ModelStreamInfer")  # RPCs whose requests are split


class TooManyFields(DecodeError):
    """A request of more top-level fields than :data:`FIELD_BUDGET`."""


@dataclass
class InferCall:
    """A ModelInfer request: the message without its raw tensors, and the tensors as views (in order)."""

    message: pb.ModelInferRequest
    raw: list[memoryview] = field(default_factory=list)


def parse_infer(data: bytes) -> InferCall:
    """Split a serialized ModelInferRequest (see the module docstring)."""
    spans = _raw_spans(data)
    if spans is None:
        raise TooManyFields(f"more than {FIELD_BUDGET} top-level fields; a ModelInferRequest has one per input, "
                            "output, parameter and raw tensor")
    if not spans:  # nothing to split off, or not well-formed: protobuf's own parse, answer or error
        return InferCall(pb.ModelInferRequest.FromString(data))
    view, rest, last = memoryview(data), [], 0
    for at, _, end in spans:
        rest.append(view[last:at])
        last = end
    rest.append(view[last:])
    return InferCall(pb.ModelInferRequest.FromString(b"".join(rest)), [view[a:b] for _, a, b in spans])


def _raw_spans(data: bytes) -> list[tuple[int, int, int]] | None:
    """(field start, tensor start, tensor end) of each raw tensor; [] when the message is malformed (protobuf
    then parses it, and fails), None past FIELD_BUDGET top-level fields."""
    spans = []
    try:
        for count, (number, wire, a, b, at) in enumerate(fields(data, 0, len(data))):
            if count >= FIELD_BUDGET:
                return None
            if number == RAW_INPUT_CONTENTS and wire == 2:
                spans.append((at, a, b))
    except Malformed:
        return []
    return spans


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
