"""``inference.GRPCInferenceService`` through Ray Serve's gRPC proxy.

Ray's proxy registers the service with :func:`add_inference_service` (:data:`SERVICER_FUNCTIONS`, the Serve
config's ``grpc_options.grpc_servicer_functions``) and calls the replica's method of the RPC's name with the
request and a ``grpc_context``. The request travels as its bytes, parsed in the replica after the key check:
Ray's proxy pickles the request on its way to the replica, and tritonclient's generated messages do not
pickle (their module, ``grpc_service_pb2``, is not importable by that name), so registering tritonclient's
own ``add_GRPCInferenceServiceServicer_to_server`` fails every call with UNKNOWN. The methods here hand the
message to irpe's own
:class:`~..grpc.servicer.InferenceServicer` (the answers ``irpe serve --grpc-port`` gives) after the call
gate's key check (:meth:`~..grpc.gate.CallGate.check`); an error sets the status on Ray's context and raises,
and Ray's proxy ends the call with that status and message. With one application on the cluster, Ray's proxy
routes a call without ``application`` metadata to it, so tritonclient.grpc calls need no change.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from ..grpc.gate import CallGate, MessageError
from ..grpc.handlers import InferCall
from ..grpc.limits import GrpcLimits
from ..grpc.servicer import InferenceServicer
from ..grpc.status import grpc_code

SERVICE = "/inference.GRPCInferenceService/"
SERVICER_FUNCTIONS = ["irpe.server.hosting.ray_grpc.add_inference_service"]
STREAMING = ("ModelStreamInfer",)
METHODS = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods_by_name


def add_inference_service(servicer: Any, server: Any) -> None:
    """Register ``inference.GRPCInferenceService`` on Ray's gRPC proxy with the requests left as bytes.

    Args:
        servicer: the proxy's stand-in servicer (Ray replaces every behaviour with its routing).
        server: Ray's gRPC proxy server.
    """
    handlers = {name: (grpc.stream_stream_rpc_method_handler if name in STREAMING
                       else grpc.unary_unary_rpc_method_handler)(getattr(servicer, name))
                for name in METHODS}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("inference.GRPCInferenceService",
                                                                          handlers),))


def parse(name: str, data: bytes) -> Any:
    """The request message of RPC ``name`` from its bytes.

    Raises:
        APIError: 400 (INVALID_ARGUMENT) when the bytes do not parse.
    """
    from ..errors import APIError

    try:
        return getattr(pb, METHODS[name].input_type.name).FromString(data)
    except DecodeError as e:
        raise APIError(400, "invalid_input", f"the {name} request does not parse: {e}") from None


class Aborted(grpc.aio.AbortError):
    """The RPC ended with the status set on Ray's context (Ray's proxy sends it to the client)."""


class RayContext:
    """What irpe's servicer asks of a gRPC context, over Ray's serializable ``RayServegRPCContext``."""

    def __init__(self, ray_context: Any):
        self.ray_context = ray_context

    def peer(self) -> str:
        return str(self.ray_context.peer())

    def invocation_metadata(self) -> list[tuple[str, str]]:
        return list(self.ray_context.invocation_metadata())

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        """End the RPC with ``code`` and ``details``.

        Raises:
            Aborted: always (as grpc.aio's ``abort``).
        """
        self.ray_context.set_code(code)
        self.ray_context.set_details(details)
        raise Aborted(details)


class RayGrpcMethods:
    """The RPCs as methods of the replica, named as Ray's proxy calls them (each takes ``grpc_context``)."""

    def __init__(self, service: Any, shm: Any):
        self.servicer = InferenceServicer(service, shm)
        settings = service.settings
        self.gate = CallGate(settings, GrpcLimits.from_settings(settings), self.servicer.observe)

    async def _admit(self, name: str, grpc_context: Any) -> RayContext:
        """The call's context once its key fits; else the call ends UNAUTHENTICATED / PERMISSION_DENIED."""
        from ..errors import APIError

        context = RayContext(grpc_context)
        try:
            self.gate.check(SERVICE + name, context.invocation_metadata())
        except APIError as e:
            self.servicer.observe(SERVICE + name, grpc_code(e.status), 0.0)
            await context.abort(grpc_code(e.status), e.message)
        return context

    async def ModelStreamInfer(self, request_stream: AsyncIterator[Any],
                               grpc_context: Any) -> AsyncIterator[Any]:
        """The bidirectional stream: each message handed on as the servicer's split request."""
        from ..errors import APIError

        context = await self._admit("ModelStreamInfer", grpc_context)

        async def calls() -> AsyncIterator[InferCall]:
            async for data in request_stream:
                try:
                    message = parse("ModelStreamInfer", data)
                except APIError as e:  # the stream ends with it once the answers in flight are sent
                    raise MessageError(grpc.StatusCode.INVALID_ARGUMENT, e.message) from None
                yield InferCall(message)

        async for answer in self.servicer.ModelStreamInfer(calls(), context):  # type: ignore[arg-type]
            yield answer


def _unary(name: str) -> Callable[..., Awaitable[Any]]:
    """The replica method of one unary RPC: the key, then irpe's servicer (UNIMPLEMENTED where irpe's is)."""
    own = name in vars(InferenceServicer) and name in vars(service_pb2_grpc.GRPCInferenceServiceServicer)

    async def method(self: RayGrpcMethods, request: bytes, grpc_context: Any) -> Any:
        from ..errors import APIError

        start = time.perf_counter()
        context = await self._admit(name, grpc_context)
        if not own:
            self.servicer.observe(SERVICE + name, grpc.StatusCode.UNIMPLEMENTED, time.perf_counter() - start)
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{name} is not implemented by irpe-deploy")
        try:
            message = parse(name, request)
        except APIError as e:
            await context.abort(grpc_code(e.status), e.message)
        return await getattr(self.servicer, name)(message, context)

    method.__name__ = method.__qualname__ = name
    return method


for _name in METHODS:
    if _name not in STREAMING:
        setattr(RayGrpcMethods, _name, _unary(_name))
