"""The gRPC method table of ``inference.GRPCInferenceService``, with ModelInfer's tensor bytes left in place.

The table is built from the service descriptor (the messages of ``tritonclient.grpc``), as the generated
``add_GRPCInferenceServiceServicer_to_server`` builds it, with one difference: a ModelInfer request is split
before protobuf parses it. Its ``raw_input_contents`` (field 7, the tensor bytes: 600 KB for one 224 px image)
become views of the received buffer, and protobuf parses only the rest (names, shapes, parameters). Parsing
the whole message copied the tensor once into the message and once more when read out of it.
Anything the scan (:mod:`irpe.artifact.protowire`, the wire format read without a schema) does not
understand is handed to protobuf whole, so a malformed message fails as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import grpc
from tritonclient.grpc import service_pb2 as pb

from irpe.artifact.protowire import Malformed, fields

SERVICE = "inference.GRPCInferenceService"
RAW_INPUT_CONTENTS = 7  # ModelInferRequest.raw_input_contents: repeated bytes


@dataclass
class InferCall:
    """A ModelInfer request: the message without its raw tensors, and the tensors as views (in order)."""

    message: pb.ModelInferRequest
    raw: list[memoryview] = field(default_factory=list)


def parse_infer(data: bytes) -> InferCall:
    """Split a serialized ModelInferRequest (see the module docstring)."""
    try:
        spans = [(at, a, b) for number, wire, a, b, at in fields(data, 0, len(data))
                 if number == RAW_INPUT_CONTENTS and wire == 2]
    except Malformed:
        spans = []
    if not spans:  # nothing to split off, or not well-formed: protobuf's own parse, answer or error
        return InferCall(pb.ModelInferRequest.FromString(data))
    view, rest, last = memoryview(data), [], 0
    for at, _, end in spans:
        rest.append(view[last:at])
        last = end
    rest.append(view[last:])
    return InferCall(pb.ModelInferRequest.FromString(b"".join(rest)), [view[a:b] for _, a, b in spans])


def service_handler(servicer: Any) -> grpc.GenericRpcHandler:
    """Every RPC of the service, answered by ``servicer``'s method of the same name."""
    makers = {(False, False): grpc.unary_unary_rpc_method_handler, (False, True): grpc.unary_stream_rpc_method_handler,
              (True, False): grpc.stream_unary_rpc_method_handler, (True, True): grpc.stream_stream_rpc_method_handler}
    handlers = {}
    for method in pb.DESCRIPTOR.services_by_name[SERVICE.split(".")[-1]].methods:
        request, response = getattr(pb, method.input_type.name), getattr(pb, method.output_type.name)
        make = makers[(method.client_streaming, method.server_streaming)]
        parse = parse_infer if method.name == "ModelInfer" else request.FromString
        handlers[method.name] = make(getattr(servicer, method.name), request_deserializer=parse,
                                     response_serializer=response.SerializeToString)
    return grpc.method_handlers_generic_handler(SERVICE, handlers)
