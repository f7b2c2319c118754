"""The front-end floor of ``irpe bench triton``: a minimal KServe v2 server on the same stack as ``irpe serve``
(uvicorn with httptools on uvloop, and grpc.aio on that loop), answering perf_analyzer with no model: infer reads
the request and answers a fixed all-zero output (binary over HTTP, raw contents over gRPC); metadata and config
are those ``irpe serve`` gave for the benched model; statistics count the answered requests, as the CPU meter
(:mod:`.server_cpu`) reads them.

``python empty_kserve.py HTTP_PORT GRPC_PORT MODEL_JSON [ARTIFACT_DIR]`` (MODEL_JSON: ``{"metadata": ...,
"config": ...}``, both as ``irpe serve`` answers them over HTTP; ARTIFACT_DIR is read by :mod:`.engine_floor`,
the same server running the artifact's engine); ``/readyz`` answers 200 for the bench's start-up wait.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

Scope = dict[str, Any]


class Floor:
    """The fixed answers of one model and the answered count. A subclass answers infer otherwise by
    :meth:`http_infer` and :meth:`grpc_infer` (``keep_body``: the request's body is kept for it)."""

    keep_body = False

    def __init__(self, model: dict[str, Any]):
        meta = model["metadata"]
        self.name, self.config, self.meta_json = meta["name"], model["config"], json.dumps(meta).encode()
        out = meta["outputs"][0]
        self.out_name, self.out_type = out["name"], out["datatype"]
        self.out_shape = [1, *(max(d, 1) for d in out["shape"][1:])]
        size = 4
        for d in self.out_shape:
            size *= d
        self.zeros, self.count = bytes(size), 0
        header = json.dumps({"model_name": self.name, "model_version": "1", "outputs": [
            {"name": self.out_name, "datatype": self.out_type, "shape": self.out_shape,
             "parameters": {"binary_data_size": size}}]}).encode()
        self.infer_headers = [(b"content-type", b"application/octet-stream"),
                              (b"inference-header-content-length", str(len(header)).encode()),
                              (b"content-length", str(len(header) + size).encode())]
        self.infer_body = header + self.zeros
        self.pb: Any = None  # tritonclient.grpc.service_pb2, set by grpc_servicer
        self.grpc_out: Any = None  # the output tensor's description in a ModelInferResponse

    async def http_infer(self, scope: Scope, body: bytes) -> tuple[list[tuple[bytes, bytes]], bytes]:
        """An HTTP infer's answer headers and body: the fixed all-zero output."""
        return self.infer_headers, self.infer_body

    async def grpc_infer(self, request: Any) -> Any:
        """A gRPC ModelInfer's answer: the fixed all-zero output."""
        return self.pb.ModelInferResponse(model_name=self.name, model_version="1", outputs=[self.grpc_out],
                                          raw_output_contents=[self.zeros])

    def stats(self) -> dict[str, Any]:
        """Triton's statistics extension: the answered count (no times)."""
        zero = {"count": 0, "ns": 0}
        phases = {k: zero for k in ("fail", "queue", "compute_input", "compute_infer", "compute_output")}
        return {"model_stats": [{"name": self.name, "version": "1", "last_inference": 0,
                                 "inference_count": self.count, "execution_count": self.count,
                                 "inference_stats": {"success": {"count": self.count, "ns": 0}, **phases},
                                 "batch_stats": []}]}

    async def asgi(self, scope: Scope, receive: Any, send: Any) -> None:
        """HTTP: infer, model metadata, config and statistics; 200 ``{}`` elsewhere (ready, live)."""
        if scope["type"] != "http":
            return
        more, chunks = True, []
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":  # the client left mid-body (perf_analyzer killed): no answer
                return
            if self.keep_body:
                chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        path = scope["path"]
        if path.endswith("/infer"):
            headers, body = await self.http_infer(scope, b"".join(chunks))
            self.count += 1
        else:
            body = (json.dumps(self.stats()).encode() if path.endswith("/stats") else
                    json.dumps(self.config).encode() if path.endswith("/config") else
                    self.meta_json if path.rstrip("/").endswith(self.name) else b"{}")
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def grpc_servicer(floor: Floor) -> Any:
    """grpc.aio servicer of the same answers."""
    from google.protobuf import json_format
    from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc

    meta = json.loads(floor.meta_json)
    metadata = service_pb2.ModelMetadataResponse(name=meta["name"], versions=meta.get("versions", ["1"]),
                                                 platform=meta.get("platform", ""), inputs=meta["inputs"],
                                                 outputs=meta["outputs"])
    config = service_pb2.ModelConfigResponse(config=json_format.ParseDict(
        floor.config, model_config_pb2.ModelConfig(), ignore_unknown_fields=True))
    floor.pb = service_pb2
    floor.grpc_out = service_pb2.ModelInferResponse.InferOutputTensor(name=floor.out_name, datatype=floor.out_type,
                                                                      shape=floor.out_shape)

    class Servicer(service_pb2_grpc.GRPCInferenceServiceServicer):
        async def ServerMetadata(self, request: Any, context: Any) -> Any:  # noqa: N802 (the proto's names)
            return service_pb2.ServerMetadataResponse(name="floor", version="0")

        async def ServerLive(self, request: Any, context: Any) -> Any:  # noqa: N802
            return service_pb2.ServerLiveResponse(live=True)

        async def ServerReady(self, request: Any, context: Any) -> Any:  # noqa: N802
            return service_pb2.ServerReadyResponse(ready=True)

        async def ModelReady(self, request: Any, context: Any) -> Any:  # noqa: N802
            return service_pb2.ModelReadyResponse(ready=True)

        async def ModelMetadata(self, request: Any, context: Any) -> Any:  # noqa: N802
            return metadata

        async def ModelConfig(self, request: Any, context: Any) -> Any:  # noqa: N802
            return config

        async def ModelStatistics(self, request: Any, context: Any) -> Any:  # noqa: N802
            return json_format.ParseDict(floor.stats(), service_pb2.ModelStatisticsResponse())

        async def ModelInfer(self, request: Any, context: Any) -> Any:  # noqa: N802
            answer = await floor.grpc_infer(request)
            floor.count += 1
            return answer

    return Servicer()


async def serve(http_port: int, grpc_port: int, floor: Floor) -> None:
    """Both listeners on 127.0.0.1 until stopped (uvicorn's signal handling ends both)."""
    import grpc
    import uvicorn
    from tritonclient.grpc import service_pb2_grpc

    server = grpc.aio.server()
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(grpc_servicer(floor), server)
    server.add_insecure_port(f"127.0.0.1:{grpc_port}")
    await server.start()
    config = uvicorn.Config(floor.asgi, host="127.0.0.1", port=http_port, log_level="warning", http="httptools",
                            loop="none", access_log=False, lifespan="off", interface="asgi3")
    try:
        await uvicorn.Server(config).serve()
    finally:
        await server.stop(0)


if __name__ == "__main__":
    import uvloop

    with open(sys.argv[3]) as f:
        uvloop.run(serve(int(sys.argv[1]), int(sys.argv[2]), Floor(json.load(f))))


def floor_server(irpe_http: str, artifact: Path, work: str, engine: bool = False) -> Any:
    """Context manager: the floor on two free ports, with the metadata and config ``irpe serve`` at
    ``irpe_http`` gives for ``artifact``'s model (written under ``work``); ``engine``: the floor running the
    artifact's engine (:mod:`.engine_floor`). Yields ``{"http", "grpc", "pid"}`` as :func:`.triton.irpe_server`
    does."""
    import contextlib
    import urllib.request

    from irpe.artifact import load_artifact

    from .serve import _free_port, server_process

    model = load_artifact(artifact).name
    script = Path(__file__).with_name("engine_floor.py") if engine else Path(__file__)

    @contextlib.contextmanager
    def started() -> Any:
        answers = {}
        for key, tail in (("metadata", ""), ("config", "/config")):
            with urllib.request.urlopen(f"http://{irpe_http}/v2/models/{model}{tail}", timeout=10) as r:
                answers[key] = json.loads(r.read())
        spec = Path(work) / f"floor-{model}.json"
        spec.write_text(json.dumps(answers))
        port, grpc_port = _free_port(), _free_port()
        while grpc_port == port:
            grpc_port = _free_port()
        with server_process([str(script), str(port), str(grpc_port), str(spec), str(artifact)], port) as proc:
            yield {"http": f"127.0.0.1:{port}", "grpc": f"127.0.0.1:{grpc_port}", "pid": str(proc.pid)}

    return started()
