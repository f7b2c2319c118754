"""``inference.GRPCInferenceService`` over the request pipeline (:class:`~..pipeline.service.Service`).

Every RPC asks the same Service the HTTP routes ask (:mod:`..pipeline.oip` builds the answers), so the model
lookup, the queue, the deadline and the repository are one. The API key travels as the ``authorization``
metadata (``Bearer <key>``), checked by the call gate (:mod:`.gate`) before the request is read; ServerLive and
ServerReady need none, as /v2/health/* over HTTP. An
:class:`~..errors.APIError` ends the RPC with the status Triton uses (:mod:`.status`); in ModelStreamInfer it
becomes that response's ``error_message`` and the stream goes on.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from irpe.artifact import ModelArtifact

from ..errors import APIError
from ..pipeline import oip
from ..pipeline.control import check_admin, run_control
from ..pipeline.peer import Endpoint
from ..pipeline.service import Service
from ..pipeline.sysshm import SharedMemoryRegistry
from . import client_shm, codec
from .deadlines import MessageError
from .handlers import InferCall, Known
from .status import grpc_code

log = logging.getLogger("irpe.server")
Handler = Callable[..., Awaitable[Any]]
STREAM_ROUTE = "/inference.GRPCInferenceService/ModelStreamInfer"  # counted per request of the stream
MAX_ID_CHARS = 1024  # a request id is echoed in its answer: a longer one is refused (INVALID_ARGUMENT)


def _authorization(context: grpc.aio.ServicerContext) -> str:
    return next((v for k, v in context.invocation_metadata() or () if k == "authorization" and isinstance(v, str)),
                "")


def rpc() -> Callable[[Handler], Handler]:
    """A unary RPC: an APIError answered with its gRPC status, the call counted and timed in
    ``irpe_requests_total`` / ``irpe_request_latency_seconds`` (method ``GRPC``). The key was checked at call
    start (:mod:`.gate`)."""

    def wrap(fn: Handler) -> Handler:
        route = f"/inference.GRPCInferenceService/{fn.__name__}"

        @functools.wraps(fn)
        async def call(self: InferenceServicer, request: Any, context: grpc.aio.ServicerContext) -> Any:
            start, code = time.perf_counter(), grpc.StatusCode.CANCELLED
            try:
                answer = await fn(self, request, context)
                code = grpc.StatusCode.OK
                return answer
            except APIError as e:
                code = grpc_code(e.status)
                await context.abort(code, e.message)
            except (asyncio.CancelledError, grpc.aio.AbortError):
                raise
            except Exception:
                log.exception("unhandled error in gRPC %s", fn.__name__)
                code = grpc.StatusCode.INTERNAL
                await context.abort(code, "unexpected server error; it has been logged")
            finally:
                self.observe(route, code, time.perf_counter() - start)

        return call

    return wrap


class InferenceServicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    """The RPCs (the CUDA shared-memory, log and trace RPCs answer UNIMPLEMENTED)."""

    def __init__(self, service: Service, shm: SharedMemoryRegistry):
        self.service = service
        self.shm = shm  # client shared memory, the HTTP front end's too
        self.endpoint: Endpoint | None = None  # the listener's one local address, once bound (client_shm)
        self._series: dict[tuple[str, grpc.StatusCode], tuple[Any, Any]] = {}

    def observe(self, route: str, code: grpc.StatusCode, seconds: float) -> None:
        """Count one call (its gRPC status name as ``status``) and its latency (the series looked up once:
        ``labels()`` takes a lock and validates on every call; bounded by the RPCs and codes that exist)."""
        if (series := self._series.get((route, code))) is None:
            m = self.service.metrics
            series = self._series[(route, code)] = (m.requests.labels(route, "GRPC", code.name),
                                                    m.latency.labels(route))
        series[0].inc()
        series[1].observe(seconds)

    @rpc()
    async def ServerLive(self, request: pb.ServerLiveRequest, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    @rpc()
    async def ServerReady(self, request: pb.ServerReadyRequest, context: Any) -> pb.ServerReadyResponse:
        self.service.check_workers()
        return pb.ServerReadyResponse(ready=self.service.routable)  # as /v2/health/ready: false while draining

    @rpc()
    async def ModelReady(self, request: pb.ModelReadyRequest, context: Any) -> pb.ModelReadyResponse:
        try:  # an unknown model is not ready (Triton's answer), not NOT_FOUND
            ready = oip.model_ready(self.service, request.name, request.version or None)
        except APIError as e:
            if e.status != 404:
                raise
            ready = False
        return pb.ModelReadyResponse(ready=ready)

    @rpc()
    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: Any) -> pb.ServerMetadataResponse:
        return codec.server_metadata()

    @rpc()
    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Any) -> pb.ModelMetadataResponse:
        model_version = self.service.model(request.name, request.version or None)
        return codec.model_metadata(oip.model_metadata(self.service, model_version))

    @rpc()
    async def ModelConfig(self, request: pb.ModelConfigRequest, context: Any) -> pb.ModelConfigResponse:
        model_version = self.service.model(request.name, request.version or None)
        return codec.model_config(oip.model_config(self.service, model_version))

    @rpc()
    async def ModelStatistics(self, request: pb.ModelStatisticsRequest,
                              context: Any) -> pb.ModelStatisticsResponse:
        stats = await asyncio.to_thread(oip.statistics, self.service, request.name or None, request.version or None)
        return codec.statistics(stats)

    @rpc()
    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest,
                              context: Any) -> pb.RepositoryIndexResponse:
        return codec.repository_index(oip.repository_index(self.service, request.ready))

    @rpc()  # the admin key where one is set (pipeline/control.py), else the API key
    async def RepositoryModelLoad(self, request: pb.RepositoryModelLoadRequest,
                                  context: Any) -> pb.RepositoryModelLoadResponse:
        check_admin(self.service.settings, _authorization(context))
        if request.parameters:
            raise APIError(400, "invalid_input", f"load parameters {sorted(request.parameters)} are not "
                           "supported: models load from the repository on disk as they are")
        await run_control(self.service, request.model_name, True)
        return pb.RepositoryModelLoadResponse()

    @rpc()
    async def RepositoryModelUnload(self, request: pb.RepositoryModelUnloadRequest,
                                    context: Any) -> pb.RepositoryModelUnloadResponse:
        check_admin(self.service.settings, _authorization(context))
        await run_control(self.service, request.model_name, False)
        return pb.RepositoryModelUnloadResponse()

    @rpc()
    async def SystemSharedMemoryRegister(self, request: pb.SystemSharedMemoryRegisterRequest,
                                         context: Any) -> pb.SystemSharedMemoryRegisterResponse:
        await client_shm.register(self.shm, request, context.peer(), self.endpoint)
        return pb.SystemSharedMemoryRegisterResponse()

    @rpc()
    async def SystemSharedMemoryStatus(self, request: pb.SystemSharedMemoryStatusRequest,
                                       context: Any) -> pb.SystemSharedMemoryStatusResponse:
        regions = await client_shm.status(self.shm, request.name or None, context.peer(), self.endpoint)
        return codec.shm_status(regions)

    @rpc()
    async def SystemSharedMemoryUnregister(self, request: pb.SystemSharedMemoryUnregisterRequest,
                                           context: Any) -> pb.SystemSharedMemoryUnregisterResponse:
        await client_shm.unregister(self.shm, request.name or None, context.peer(), self.endpoint)
        return pb.SystemSharedMemoryUnregisterResponse()

    @rpc()
    async def ModelInfer(self, request: InferCall | pb.ModelInferRequest,
                         context: Any) -> pb.ModelInferResponse | bytes:
        client_shm.PEER.set(context.peer())  # who may use the regions the request names
        if isinstance(request, InferCall):  # :mod:`.handlers`'s split request (the tensors as views)
            return await self.infer(request.message, request.raw or None, request.id_bytes, request.size,
                                    request.known, wire=True)
        return await self.infer(request)

    async def infer(self, req: pb.ModelInferRequest, raw: list[memoryview] | None = None, id_bytes: int = 0,
                    size: int = -1, known: Known | None = None, wire: bool = False) -> Any:
        """One inference: look up and hold the version, decode and check (in the pool unless small), infer,
        answer; ``raw``: the request's raw tensors when they were split off, ``id_bytes`` the size of an id left
        out as too long, ``size`` the bytes protobuf parsed, ``known`` its remembered layout (:mod:`.handlers`;
        -1: the message's size); ``wire``: an answer of logits may come serialized (:func:`.codec.answer_bytes`).
        Returns the ``ModelInferResponse`` (or its bytes)."""
        started = time.perf_counter()
        service = self.service
        name, version = req.model_name, req.model_version or None
        if id_bytes or len(req.id) > MAX_ID_CHARS:
            size = f"{id_bytes} bytes" if id_bytes else f"{len(req.id)} characters"
            raise APIError(400, "invalid_input", f"request id of {size}: at most {MAX_ID_CHARS} characters "
                           "(the id is echoed in the answer); send a shorter id")
        if not service.host.knows(name):
            service.model(name, version)  # 404 before 503: an unknown model is unknown while warming up too
        with service.use(name, version) as model_version:
            artifact = model_version.artifact
            assert artifact is not None
            raw = codec.raw_inputs(req) if raw is None else raw
            max_images = oip.max_images(service)
            fast = codec.known_checked(known, artifact, max_images, raw)
            if fast is not None:  # the layout's checks passed before: only the tensor's values are checked
                (images, k), ref, regions = fast, None, None
            else:
                images, k, ref, regions = await self._checked(req, artifact, max_images, raw, size, known)
            logits = await oip.infer(service, model_version, images, started)
            if ref is not None and regions is not None:
                oip.shm_output(regions, ref, artifact.output_name, logits)
            if wire and k == 0 and ref is None:
                return codec.answer_bytes(model_version.name, str(model_version.version), req.id or oip.random_id(),
                                          artifact.output_name, logits)
            return codec.encode_infer(req, logits, -1 if ref else k, artifact, model_version.name,
                                      str(model_version.version), req.id or oip.random_id())

    async def _checked(self, req: pb.ModelInferRequest, artifact: ModelArtifact, max_images: int,
                       raw: Sequence[bytes | memoryview], size: int, known: Known | None) -> tuple[Any, ...]:
        """:func:`.codec.checked` on the event loop when small, else in the decode pool; (images, k, the output's
        region, the caller's regions). The checks of a remembered layout that passed are kept with it."""
        regions = await client_shm.request_regions(self.shm, req, self.endpoint)  # None unless it names one
        args = (req, artifact, max_images, regions, raw)
        small = codec.inline(raw, req.ByteSize() if size < 0 else size) and regions is None  # a region: pool
        images, k, ref = codec.checked(*args) if small else \
            await asyncio.get_running_loop().run_in_executor(self.service.pool, codec.checked, *args)
        if known is not None and small and ref is None:
            known.checked = (artifact, max_images, images.shape, k)
        return images, k, ref, regions

    async def ModelStreamInfer(self, request_iterator: AsyncIterator[InferCall],
                               context: grpc.aio.ServicerContext) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """Requests of one stream run concurrently (they batch together), at most ``max_batch_size`` at once:
        each holds a slot until its answer is sent, so a client that does not read its answers stops the stream
        being read (gRPC's flow control then holds the client). Answers come as they finish, each with its
        request's id; a failed request is an answer with ``error_message``. A message that does not parse or
        comes late (:mod:`.gate`) ends the stream with its status once the answers in flight are sent."""
        slots = oip.max_images(self.service)  # more could never all be queued
        room = asyncio.Semaphore(slots)
        answers: asyncio.Queue[pb.ModelStreamInferResponse | None] = asyncio.Queue(slots + 1)
        client_shm.PEER.set(context.peer())  # the stream's request tasks inherit it
        feeder = asyncio.ensure_future(self._feed(request_iterator, answers, room))
        try:
            while (answer := await answers.get()) is not None:
                yield answer
                room.release()  # sent: gRPC asks for the next answer once this one is written
            await feeder  # the stream's own error (a bad or late message), after its answers
        finally:
            feeder.cancel()

    async def _feed(self, requests: AsyncIterator[InferCall],
                    answers: asyncio.Queue[pb.ModelStreamInferResponse | None], room: asyncio.Semaphore) -> None:
        """Start each request once a slot is free; the end marker after the last answer; then the stream's
        error, if it had one."""
        tasks: set[asyncio.Task[None]] = set()
        error: MessageError | None = None
        try:
            try:
                async for req in requests:
                    await room.acquire()
                    task = asyncio.ensure_future(self._stream_one(req, answers))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
            except MessageError as e:
                error = e
            if tasks:
                await asyncio.gather(*tasks)
        except asyncio.CancelledError:
            for task in tasks:
                task.cancel()
            raise
        answers.put_nowait(None)
        if error is not None:
            raise error

    async def _stream_one(self, call: InferCall, answers: asyncio.Queue[pb.ModelStreamInferResponse | None]) -> None:
        """Answer one request of a stream (:mod:`.handlers` split it: the message and its raw tensors)."""
        start, code, req = time.perf_counter(), grpc.StatusCode.OK, call.message
        try:
            answer = pb.ModelStreamInferResponse(infer_response=await self.infer(req, call.raw or None,
                                                                                 call.id_bytes, call.size))
        except APIError as e:
            code = grpc_code(e.status)
            answer = pb.ModelStreamInferResponse(error_message=e.message,
                                                 infer_response=pb.ModelInferResponse(id=_echoed(req.id)))
        except Exception:
            log.exception("unhandled error in gRPC ModelStreamInfer")
            code = grpc.StatusCode.INTERNAL
            answer = pb.ModelStreamInferResponse(error_message="unexpected server error; it has been logged",
                                                 infer_response=pb.ModelInferResponse(id=_echoed(req.id)))
        self.observe(STREAM_ROUTE, code, time.perf_counter() - start)
        answers.put_nowait(answer)


def _echoed(request_id: str) -> str:
    """The id an error answer echoes: the request's, or none when it is over MAX_ID_CHARS."""
    return request_id if len(request_id) <= MAX_ID_CHARS else ""
