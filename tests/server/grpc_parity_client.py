"""The gRPC half of tests/server/end_to_end/test_triton_parity.py, run in a child process (tritonclient.grpc and kserve
cannot share one process's protobuf pool): ``python -m tests.server.grpc_parity_client HOST:PORT MODEL SHM_KEY``
sends a fixed list of RPCs through the raw stub and prints ``{probe: [status code, answer]}`` as JSON (the answer:
the message as a dict, or the error's text)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import numpy as np


def _images(n: int, seed: int = 3) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 3, 32, 32), dtype=np.float32)


def _infer(pb: Any, model: str, x: np.ndarray, datatype: str = "FP32", name: str = "images",
           outputs: list[str] | None = None, params: dict[str, Any] | None = None) -> Any:
    req = pb.ModelInferRequest(model_name=model)
    tensor = req.inputs.add(name=name, datatype=datatype, shape=list(x.shape))
    for key, value in (params or {}).items():
        if isinstance(value, str):
            tensor.parameters[key].string_param = value
        else:
            tensor.parameters[key].int64_param = value
    if not params:
        req.raw_input_contents.append((x.astype(np.float64) if datatype == "FP64" else x).tobytes())
    for out in outputs or []:
        req.outputs.add(name=out)
    return req


def probes(pb: Any, model: str, key: str) -> dict[str, Callable[[Any], Any]]:
    """name -> call(stub)."""
    x = _images(2)
    shm_in = {"shared_memory_region": "io", "shared_memory_byte_size": x.nbytes}
    return {
        "live": lambda s: s.ServerLive(pb.ServerLiveRequest()),
        "ready": lambda s: s.ServerReady(pb.ServerReadyRequest()),
        "server_metadata": lambda s: s.ServerMetadata(pb.ServerMetadataRequest()),
        "model_metadata": lambda s: s.ModelMetadata(pb.ModelMetadataRequest(name=model)),
        "model_metadata_nope": lambda s: s.ModelMetadata(pb.ModelMetadataRequest(name="nope")),
        "model_ready": lambda s: s.ModelReady(pb.ModelReadyRequest(name=model)),
        "model_ready_v2": lambda s: s.ModelReady(pb.ModelReadyRequest(name=model, version="2")),
        "config": lambda s: s.ModelConfig(pb.ModelConfigRequest(name=model)),
        "config_nope": lambda s: s.ModelConfig(pb.ModelConfigRequest(name="nope")),
        "stats_nope": lambda s: s.ModelStatistics(pb.ModelStatisticsRequest(name="nope")),
        "index": lambda s: s.RepositoryIndex(pb.RepositoryIndexRequest()),
        "load": lambda s: s.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name=model)),
        "unload_nope": lambda s: s.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(model_name="nope")),
        "infer": lambda s: s.ModelInfer(_infer(pb, model, x)),
        "infer_9": lambda s: s.ModelInfer(_infer(pb, model, _images(9))),
        "infer_fp64": lambda s: s.ModelInfer(_infer(pb, model, x, "FP64")),
        "infer_name": lambda s: s.ModelInfer(_infer(pb, model, x, name="pixels")),
        "infer_output": lambda s: s.ModelInfer(_infer(pb, model, x, outputs=["probs"])),
        "infer_nope": lambda s: s.ModelInfer(_infer(pb, "nope", x)),
        "shm_register": lambda s: s.SystemSharedMemoryRegister(pb.SystemSharedMemoryRegisterRequest(
            name="io", key=key, offset=0, byte_size=65536)),
        "shm_status": lambda s: s.SystemSharedMemoryStatus(pb.SystemSharedMemoryStatusRequest()),
        "shm_status_nope": lambda s: s.SystemSharedMemoryStatus(pb.SystemSharedMemoryStatusRequest(name="nope")),
        "shm_infer": lambda s: s.ModelInfer(_infer(pb, model, x, params=shm_in)),
        "shm_infer_nope": lambda s: s.ModelInfer(_infer(pb, model, x, params={**shm_in,
                                                                                "shared_memory_region": "nope"})),
        "shm_infer_offset": lambda s: s.ModelInfer(_infer(pb, model, x, params={**shm_in,
                                                                                  "shared_memory_offset": 65528})),
        "shm_unregister": lambda s: s.SystemSharedMemoryUnregister(pb.SystemSharedMemoryUnregisterRequest()),
        "cuda_shm_status": lambda s: s.CudaSharedMemoryStatus(pb.CudaSharedMemoryStatusRequest()),
        "log_settings": lambda s: s.LogSettings(pb.LogSettingsRequest()),
        "trace_setting": lambda s: s.TraceSetting(pb.TraceSettingRequest()),
    }


def _answer(call: Callable[[Any], Any], stub: Any) -> list[Any]:
    import grpc
    from google.protobuf.json_format import MessageToDict

    try:
        reply = call(stub)
    except grpc.RpcError as e:
        return [e.code().name, e.details()]
    out = MessageToDict(reply, preserving_proto_field_name=True)
    if "raw_output_contents" in out:  # the logits as numbers
        out["raw_output_contents"] = [np.frombuffer(r, "<f4").tolist() for r in reply.raw_output_contents]
    return ["OK", out]


def main(address: str, model: str, key: str) -> dict[str, list[Any]]:
    import grpc
    import tritonclient.grpc.service_pb2 as pb
    import tritonclient.grpc.service_pb2_grpc as pb_grpc
    import tritonclient.utils.shared_memory as shm

    x = _images(2)
    handle = shm.create_shared_memory_region("io", key, 65536)
    shm.set_shared_memory_region(handle, [x])
    try:
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            return {name: _answer(call, stub) for name, call in probes(pb, model, key).items()}
    finally:
        shm.destroy_shared_memory_region(handle)


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:4])))
