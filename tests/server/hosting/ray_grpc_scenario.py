"""The gRPC half of the Ray Serve tests, run by tests/server/hosting/test_ray_grpc.py in a network namespace of
its own (``unshare -n``: only a loopback interface), because Ray's gRPC proxy listens on every address
(``[::]``, no option narrows it). Here: ``irpe serve --grpc-port`` and ``irpe.ray:app`` behind Ray's gRPC proxy
on the same artifact and key, the same unmodified tritonclient.grpc calls to both; prints one JSON line with
each call's answer (its serialized message, or its status and message), keyed by call and server."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))

KEY = "ray-grpc-key"
MODEL = "deit_micro_patch4_32_ctx_product_shared_k"
T = 30.0  # seconds a call may take (a hung call fails the scenario instead of the test's timeout)


def calls(url: str, headers: dict[str, str]) -> dict[str, Any]:
    """Every call's answer: the serialized response (hex) or ``[status, message]``."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(url)
    tensor = np.random.default_rng(1).random((2, 3, 32, 32), dtype=np.float32)
    inp = grpcclient.InferInput("images", [2, 3, 32, 32], "FP32")
    inp.set_data_from_numpy(tensor)
    kw: dict[str, Any] = {"headers": headers, "client_timeout": T}

    def hexed(message: Any) -> str:
        return message.SerializeToString().hex()

    todo = {"live": lambda: client.is_server_live(**kw), "ready": lambda: client.is_server_ready(**kw),
            "model_ready": lambda: client.is_model_ready(MODEL, **kw),
            "server_metadata": lambda: hexed(client.get_server_metadata(**kw)),
            "model_metadata": lambda: hexed(client.get_model_metadata(MODEL, **kw)),
            "model_config": lambda: hexed(client.get_model_config(MODEL, **kw)),
            "infer": lambda: hexed(client.infer(MODEL, [inp], request_id="g1", **kw).get_response()),
            "unknown_model": lambda: client.infer("nope", [inp], request_id="g2", **kw),
            "statistics": lambda: len(client.get_inference_statistics(MODEL, **kw).model_stats)}
    out: dict[str, Any] = {}
    for name, call in todo.items():
        try:
            out[name] = call()
        except InferenceServerException as e:
            out[name] = [e.status(), e.message()]
    out["stream"] = stream(client, inp, headers)
    client.close()
    return out


def stream(client: Any, inp: Any, headers: dict[str, str]) -> Any:
    """Two requests on one ModelStreamInfer stream: their answers (hex, in id order) or the error."""
    import queue

    from tritonclient.utils import InferenceServerException

    answers: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)), headers=headers,
                        stream_timeout=T)
    sent = 0
    for i in range(2):
        try:
            client.async_stream_infer(MODEL, [inp], request_id=f"s{i}")
            sent += 1
        except InferenceServerException:  # the stream ended (its error comes through the callback)
            break
    got = []
    try:
        for _ in range(max(sent, 1)):
            result, error = answers.get(timeout=30)
            got.append(str(error) if error else result.get_response().SerializeToString().hex())
            if error:  # the stream has ended
                break
    except queue.Empty:
        got.append("no answer within 30 s")
    client.stop_stream()
    return sorted(got)


def direct(port: int) -> dict[str, Any]:
    from tests.reliability.procs import server_env, serving

    with serving("digits", "--frontends", "0", "--grpc-port", str(port),  # type: ignore[arg-type]
                 env=server_env(IRPE_API_KEY=KEY)) as _:
        return {"key": calls(f"127.0.0.1:{port}", {"authorization": f"Bearer {KEY}"}),
                "nokey": calls(f"127.0.0.1:{port}", {})}


def through_ray(port: int, http_port: int) -> dict[str, Any]:
    from irpe.server.hosting.ray_serve import SERVICER_FUNCTIONS
    from tests.server.hosting.ray_cluster import ray_serve

    options = {"grpc_options": {"port": port, "grpc_servicer_functions": SERVICER_FUNCTIONS}}
    with ray_serve(http_port, workers=1, **options) as rs:
        start = time.monotonic()
        rs.deploy(model="digits", api_key=KEY, num_replicas="1")
        deployed = time.monotonic() - start
        out = {"key": calls(f"127.0.0.1:{port}", {"authorization": f"Bearer {KEY}"}),
               "nokey": calls(f"127.0.0.1:{port}", {}), "deploy_s": round(deployed, 1)}
    return out


def loopback_up() -> None:
    """Bring up the namespace's loopback interface (``ip link set lo up`` without iproute2)."""
    import fcntl
    import socket
    import struct

    get_flags, set_flags, up = 0x8913, 0x8914, 0x1  # SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = struct.unpack("16sh", fcntl.ioctl(s, get_flags, struct.pack("16sh", b"lo", 0)))[1]
        fcntl.ioctl(s, set_flags, struct.pack("16sh", b"lo", flags | up))


def main() -> None:
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    loopback_up()
    import faulthandler

    faulthandler.dump_traceback_later(300, exit=True)  # a hang anywhere: the stacks, then exit
    ports = [int(p) for p in sys.argv[1:4]]
    result = {"direct": direct(ports[0]), "ray": through_ray(ports[1], ports[2])}
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
