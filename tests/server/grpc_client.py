"""gRPC clients against ``irpe serve --grpc-port``, run in a child process of the test
(``python -m tests.server.grpc_client MODE HOST:PORT [KEY]``; prints one JSON object of what it saw).

A child process because ``tritonclient.grpc`` and the ``kserve`` package both register protobuf messages
named ``inference.*``: one process cannot import both, and the test suite imports kserve's REST client.
Modes: ``triton`` (tritonclient.grpc, sync: every unary RPC and typed contents through the raw stub),
``aio`` (tritonclient.grpc.aio, concurrent), ``stream`` (ModelStreamInfer through tritonclient),
``errors`` (status codes), ``burst`` (a burst at a slow model), ``kserve`` (kserve's InferenceGRPCClient).
"""

from __future__ import annotations

import asyncio
import json
import queue
import sys
from typing import Any

import numpy as np

MODEL = "tiny-mean"


def images(n: int, seed: int) -> np.ndarray:
    """The test's images (the parent computes the expected logits from the same seed)."""
    return np.random.default_rng(seed).standard_normal((n, 3, 32, 32), dtype=np.float32)


def _input(x: np.ndarray, datatype: str = "FP32") -> Any:
    import tritonclient.grpc as g

    i = g.InferInput("images", list(x.shape), datatype)
    i.set_data_from_numpy(x.astype(np.float64) if datatype == "FP64" else x)
    return i


def _headers(key: str) -> dict[str, str] | None:
    return {"authorization": f"Bearer {key}"} if key else None


def triton(address: str, key: str) -> dict[str, Any]:
    import tritonclient.grpc as g
    from tritonclient.utils import InferenceServerException

    h = _headers(key)
    c = g.InferenceServerClient(address)
    out: dict[str, Any] = {"live": c.is_server_live(), "ready": c.is_server_ready(),
                           "model_ready": c.is_model_ready(MODEL, headers=h),
                           "server": c.get_server_metadata(headers=h, as_json=True),
                           "metadata": c.get_model_metadata(MODEL, headers=h, as_json=True),
                           "config": c.get_model_config(MODEL, headers=h, as_json=True)["config"]}
    res = c.infer(MODEL, [_input(images(3, 1))], headers=h, request_id="r-1")
    out["logits"], out["id"] = res.as_numpy("logits").tolist(), res.get_response().id
    res = c.infer(MODEL, [_input(images(2, 2))], headers=h,
                  outputs=[g.InferRequestedOutput("logits", class_count=3)])
    out["classes"] = [[s.decode() for s in row] for row in res.as_numpy("logits")]
    out["typed"] = _typed_contents(address, key)
    out["stats"] = c.get_inference_statistics(MODEL, headers=h, as_json=True)["model_stats"]
    out["index"] = c.get_model_repository_index(headers=h, as_json=True)["models"]
    try:  # not --model-control explicit: Triton's UNAVAILABLE, as over HTTP (503)
        c.load_model(MODEL, headers=h)
        out["load"] = "OK"
    except InferenceServerException as e:
        out["load"] = e.status()
    out["loaded_again"] = c.is_model_ready(MODEL, headers=h)
    c.close()
    return out


def _typed_contents(address: str, key: str) -> list[list[float]]:
    """``contents.fp32_contents`` instead of raw bytes, through the generated stub."""
    import grpc
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc

    x = images(2, 3)
    req = pb.ModelInferRequest(model_name=MODEL)
    spec = req.inputs.add(name="images", datatype="FP32", shape=list(x.shape))
    spec.contents.fp32_contents.extend(x.reshape(-1).tolist())
    with grpc.insecure_channel(address) as channel:
        res = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(
            req, metadata=[("authorization", f"Bearer {key}")] if key else None, timeout=30)
    assert res.outputs[0].datatype == "FP32" and list(res.outputs[0].shape) == [2, 10], res
    return np.frombuffer(res.raw_output_contents[0], "<f4").reshape(2, 10).tolist()


def aio(address: str, key: str, n: int = 8) -> dict[str, Any]:
    import tritonclient.grpc.aio as ga

    async def main() -> list[list[list[float]]]:
        c = ga.InferenceServerClient(address)
        try:
            assert await c.is_server_ready()
            rs = await asyncio.gather(*(c.infer(MODEL, [_input(images(1, 100 + i))], headers=_headers(key))
                                        for i in range(n)))
            return [r.as_numpy("logits").tolist() for r in rs]
        finally:
            await c.close()

    return {"logits": asyncio.run(main())}


def stream(address: str, key: str, n: int = 8) -> dict[str, Any]:
    """``n`` good requests and one of the wrong shape on one stream; answers matched by id."""
    import tritonclient.grpc as g

    answers: queue.Queue = queue.Queue()
    c = g.InferenceServerClient(address)
    c.start_stream(callback=lambda result, error: answers.put((result, error)), headers=_headers(key))
    for i in range(n):
        c.async_stream_infer(MODEL, [_input(images(1, 200 + i))], request_id=f"s-{i}")
    c.async_stream_infer(MODEL, [_input(np.zeros((1, 3, 8, 8), np.float32))], request_id="bad")
    got: dict[str, Any] = {}
    for _ in range(n + 1):
        result, error = answers.get(timeout=30)
        if error is not None:
            got["error"] = str(error)
        else:
            got[result.get_response().id] = result.as_numpy("logits").tolist()
    c.stop_stream()
    c.close()
    return got


def _code(call: Any) -> str:
    from tritonclient.utils import InferenceServerException

    try:
        call()
    except InferenceServerException as e:
        return f"{e.status()} {e.message()}"
    return "OK"


def errors(address: str, key: str) -> dict[str, str]:
    import tritonclient.grpc as g

    c = g.InferenceServerClient(address)
    h = _headers(key)
    big = np.zeros((40, 3, 32, 32), np.float32)  # 480 KB: over a 0.25 MB --max-body-mb
    return {
        "unknown_model": _code(lambda: c.infer("nope", [_input(images(1, 0))], headers=h)),
        "unknown_version": _code(lambda: c.get_model_metadata(MODEL, "7", headers=h)),
        "wrong_shape": _code(lambda: c.infer(MODEL, [_input(np.zeros((1, 3, 8, 8), np.float32))], headers=h)),
        "wrong_datatype": _code(lambda: c.infer(MODEL, [_input(images(1, 0), "FP64")], headers=h)),
        "non_finite": _code(lambda: c.infer(MODEL, [_input(np.full((1, 3, 32, 32), np.nan, np.float32))],
                                            headers=h)),
        "wrong_output": _code(lambda: c.infer(MODEL, [_input(images(1, 0))], headers=h,
                                              outputs=[g.InferRequestedOutput("probs")])),
        "too_big": _code(lambda: c.infer(MODEL, [_input(big)], headers=h)),
        "no_key": _code(lambda: c.infer(MODEL, [_input(images(1, 0))])),
        "wrong_key": _code(lambda: c.get_model_metadata(MODEL, headers={"authorization": "Bearer nope"})),
        "live_without_key": _code(c.is_server_live),
        "cuda_shared_memory": _code(lambda: c.get_cuda_shared_memory_status(headers=h)),
        "shm_off": _code(lambda: c.register_system_shared_memory("r", "/grpctest_none", 4, headers=h)),
    }


def burst(address: str, key: str, n: int = 8) -> dict[str, Any]:
    """``n`` single-image requests at once to the model ``slow``; the status of each."""
    import tritonclient.grpc.aio as ga
    from tritonclient.utils import InferenceServerException

    async def one(c: Any, i: int) -> str:
        try:
            await c.infer("slow", [_input(images(1, i))], headers=_headers(key))
        except InferenceServerException as e:
            return f"{e.status()} {e.message()}"
        return "OK"

    async def main() -> list[str]:
        c = ga.InferenceServerClient(address)
        try:
            return list(await asyncio.gather(*(one(c, i) for i in range(n))))
        finally:
            await c.close()

    return {"statuses": asyncio.run(main())}


def kserve(address: str, key: str) -> dict[str, Any]:
    from kserve import InferenceGRPCClient, InferInput, InferRequest

    async def main() -> dict[str, Any]:
        c = InferenceGRPCClient(address, timeout=30, retries=0)
        h = list(_headers(key).items()) if key else None
        try:
            out: dict[str, Any] = {"live": await c.is_server_live(headers=h), "ready": await c.is_server_ready(
                headers=h), "model_ready": await c.is_model_ready(MODEL, headers=h)}
            x = images(2, 5)
            inp = InferInput("images", list(x.shape), "FP32")
            inp.set_data_from_numpy(x, binary_data=True)
            res = await c.infer(InferRequest(MODEL, [inp], request_id="k-1"), headers=h)
            out.update(id=res.id, model=res.model_name, logits=res.outputs[0].as_numpy().tolist())
            try:
                await c.infer(InferRequest("nope", [inp]), headers=h)
                out["unknown"] = "OK"
            except Exception as e:  # grpc.aio.AioRpcError
                out["unknown"] = f"{e.code().name} {e.details()}"  # type: ignore[attr-defined]
            return out
        finally:
            await c.close()

    return asyncio.run(main())


def shm(address: str, key: str) -> dict[str, Any]:
    """System shared memory: the input read from one region, the logits written to another."""
    import os

    import tritonclient.grpc as g
    import tritonclient.utils.shared_memory as shm_util

    x, h = images(2, 9), _headers(key)
    c = g.InferenceServerClient(address)
    keys = (f"/grpctest_in_{os.getpid()}", f"/grpctest_out_{os.getpid()}")
    regions = [shm_util.create_shared_memory_region(f"r{i}", k, size) for i, (k, size) in
               enumerate(zip(keys, (x.nbytes, 2 * 10 * 4), strict=True))]
    try:
        shm_util.set_shared_memory_region(regions[0], [x])
        c.register_system_shared_memory("in", keys[0], x.nbytes, headers=h)
        c.register_system_shared_memory("out", keys[1], 80, headers=h)
        status = c.get_system_shared_memory_status(headers=h, as_json=True)
        inp = g.InferInput("images", list(x.shape), "FP32")
        inp.set_shared_memory("in", x.nbytes)
        out = g.InferRequestedOutput("logits")
        out.set_shared_memory("out", 80)
        res = c.infer(MODEL, [inp], outputs=[out], headers=h)
        got = shm_util.get_contents_as_numpy(regions[1], np.float32, [2, 10]).tolist()
        small = g.InferRequestedOutput("logits")
        small.set_shared_memory("out", 40)
        too_small = _code(lambda: c.infer(MODEL, [inp], outputs=[small], headers=h))
        c.unregister_system_shared_memory("in", headers=h)
        gone = _code(lambda: c.infer(MODEL, [inp], headers=h))
        c.unregister_system_shared_memory(headers=h)
        after = c.get_system_shared_memory_status(headers=h, as_json=True)
        return {"status": status, "logits": got, "raw_outputs": len(res.get_response().raw_output_contents),
                "too_small": too_small, "gone": gone, "after": after}
    finally:
        for r in regions:
            shm_util.destroy_shared_memory_region(r)
        c.close()


MODES = {"triton": triton, "aio": aio, "stream": stream, "errors": errors, "burst": burst, "kserve": kserve,
         "shm": shm}

if __name__ == "__main__":
    mode, address = sys.argv[1], sys.argv[2]
    extra = [int(a) for a in sys.argv[4:]]  # burst: how many requests
    print(json.dumps(MODES[mode](address, sys.argv[3] if len(sys.argv) > 3 else "", *extra)))
