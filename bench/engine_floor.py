"""The engine floor of ``irpe bench triton`` ("floor+engine"): :mod:`.empty_kserve`'s minimal KServe v2 server
(uvicorn with httptools on uvloop, grpc.aio on that loop) running the artifact's real engine the simplest way a
Python server does: each infer request decoded (the binary tensor extension over HTTP, raw contents over gRPC),
run at batch 1 in a pool of one thread per usable core (``loop.run_in_executor``), its logits answered (binary
over HTTP, raw contents over gRPC). The engine is built as ``irpe serve`` builds it with its defaults
(:class:`irpe.server.config.Settings`: backend, device, ONNX Runtime threads per inference thread); no
batching, no limits, no API key, no metrics: what any Python server on this stack reaches with this engine on
this machine.

``python engine_floor.py HTTP_PORT GRPC_PORT MODEL_JSON ARTIFACT_DIR`` (MODEL_JSON as for
:mod:`.empty_kserve`); started by :func:`.empty_kserve.floor_server` with ``engine=True``.
"""

from __future__ import annotations

import asyncio
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from irpe.bench.empty_kserve import Floor, Scope, serve


class EngineFloor(Floor):
    """:class:`.empty_kserve.Floor` whose infer runs the engine on the request's tensor."""

    keep_body = True

    def __init__(self, model: dict[str, Any], artifact: Path):
        from irpe.artifact import load_artifact
        from irpe.server.config import Settings, usable_cpus
        from irpe.server.engines import load_engine

        super().__init__(model)
        art = load_artifact(artifact)
        s = Settings.from_env(env={}, artifact_dir=str(artifact))
        self.engine = load_engine(artifact, art, backend=s.backend, device=s.device, threads=s.resolved_threads(),
                                  max_batch=1, precision=s.precision, streams=s.resolved_inference_threads())
        self.shape = (1, 3, art.preprocess.crop, art.preprocess.crop)
        self.pool = ThreadPoolExecutor(usable_cpus(), thread_name_prefix="engine")
        self.engine.run(np.zeros(self.shape, np.float32))  # warm, as irpe serve warms before it is ready
        self.header = self.infer_body[:len(self.infer_body) - len(self.zeros)]

    async def logits(self, tensor: bytes) -> bytes:
        """The engine's answer for one request's raw float32 tensor, run in the pool."""
        x = np.frombuffer(tensor, np.float32).reshape(self.shape)
        out = await asyncio.get_running_loop().run_in_executor(self.pool, self.engine.run, x)
        return np.ascontiguousarray(out, np.float32).tobytes()

    async def http_infer(self, scope: Scope, body: bytes) -> tuple[list[tuple[bytes, bytes]], bytes]:
        """Binary tensor extension: the tensor follows the JSON header; the logits follow the answer's."""
        size = next(int(v) for k, v in scope["headers"] if k.lower() == b"inference-header-content-length")
        return self.infer_headers, self.header + await self.logits(body[size:])

    async def grpc_infer(self, request: Any) -> Any:
        """ModelInfer with the tensor in ``raw_input_contents``: the logits in ``raw_output_contents``."""
        logits = await self.logits(request.raw_input_contents[0])
        return self.pb.ModelInferResponse(model_name=self.name, model_version="1", outputs=[self.grpc_out],
                                          raw_output_contents=[logits])


if __name__ == "__main__":
    import uvloop

    with open(sys.argv[3]) as f:
        floor = EngineFloor(json.load(f), Path(sys.argv[4]))
    uvloop.run(serve(int(sys.argv[1]), int(sys.argv[2]), floor))
