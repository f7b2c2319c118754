"""Clients of the balancer in tests/deploy/test_haproxy.py, run inside its balancer namespace against HAProxy on
127.0.0.1 (``python -m tests.deploy.lb_client MODE ...``). A process of its own: tritonclient.grpc's protobuf
messages clash with the kserve package's in the test process.

Modes:
  ``load HTTP GRPC KEY OUT STOP``: continuous load (two HTTP /classify workers, one gRPC ModelInfer worker)
  until the file STOP exists; every request is one JSON line in OUT: its start (time.monotonic, the same clock
  as the test's), the protocol, the first attempt's outcome and the outcome after up to 3 client retries.
  ``check HTTP GRPC KEY``: what the balancer answers without the key, with it, and to an oversized head (one
  JSON object on stdout).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

MODEL = "deit_micro_patch4_32_ctx_product_shared_k"  # the digits model `irpe serve digits` serves
IMAGE = (Path(__file__).resolve().parents[2] / "docs" / "assets" / "digit-7.png").read_bytes()
RETRIES = 3
PAUSE_S = 0.02  # between one worker's requests: steady load that leaves the 2 cores to the servers


def _http_once(client: httpx.Client, url: str, key: str) -> str:
    """"ok", or what went wrong."""
    try:
        r = client.post(url + "/classify", content=IMAGE, headers={"authorization": f"Bearer {key}",
                                                                   "content-type": "image/png"})
    except httpx.HTTPError as e:
        return f"{type(e).__name__}: {e}"
    ok = r.status_code == 200 and r.json()["predictions"][0][0]["label"] == "7"
    return "ok" if ok else f"HTTP {r.status_code}: {r.text[:200]}"


def _grpc_once(client: Any, key: str) -> str:
    import tritonclient.grpc as g
    from tritonclient.utils import InferenceServerException

    x = g.InferInput("images", [1, 3, 32, 32], "FP32")
    x.set_data_from_numpy(np.zeros((1, 3, 32, 32), np.float32))
    try:
        out = client.infer(MODEL, [x], headers={"authorization": f"Bearer {key}"}, client_timeout=30)
    except InferenceServerException as e:
        return f"gRPC {e.status()}: {e.message()[:200]}"
    return "ok" if out.as_numpy("logits").shape == (1, 10) else "gRPC: wrong logits shape"


def _worker(send: Any, protocol: str, out: Any, lock: threading.Lock, stop: Path) -> None:
    while not stop.exists():
        started = time.monotonic()
        first = send()
        final, attempts = first, 1
        while final != "ok" and attempts <= RETRIES:
            time.sleep(0.1 * attempts)
            final, attempts = send(), attempts + 1
        line = json.dumps({"t": started, "protocol": protocol, "first": first, "final": final,
                           "attempts": attempts})
        with lock:
            out.write(line + "\n")
            out.flush()
        time.sleep(PAUSE_S)


def load(http: str, grpc: str, key: str, out_path: str, stop_path: str) -> None:
    import tritonclient.grpc as g

    stop, lock = Path(stop_path), threading.Lock()
    with open(out_path, "a") as out:
        clients = [httpx.Client(timeout=40) for _ in range(2)]
        grpc_client = g.InferenceServerClient(grpc)
        sends = [("http", lambda c=c: _http_once(c, f"http://{http}", key)) for c in clients]
        sends.append(("grpc", lambda: _grpc_once(grpc_client, key)))
        workers = [threading.Thread(target=_worker, args=(send, protocol, out, lock, stop)) for protocol, send in sends]
        for w in workers:
            w.start()
        for w in workers:
            w.join()


def check(http: str, grpc: str, key: str) -> dict[str, Any]:
    import tritonclient.grpc as g
    from tritonclient.utils import InferenceServerException

    url = f"http://{http}"
    seen: dict[str, Any] = {"ready": httpx.get(url + "/readyz", timeout=10).status_code}
    for name, headers in {"no_key": {}, "wrong_key": {"authorization": "Bearer wrong"},
                          "key": {"authorization": f"Bearer {key}"}}.items():
        r = httpx.post(url + "/classify", content=IMAGE, headers={**headers, "content-type": "image/png"}, timeout=30)
        seen[f"http_{name}"] = r.status_code
    big = {"authorization": f"Bearer {key}", "x-padding": "a" * 70_000}
    seen["http_oversized_head"] = httpx.get(url + "/readyz", headers=big, timeout=10).status_code
    client = g.InferenceServerClient(grpc)
    x = g.InferInput("images", [1, 3, 32, 32], "FP32")
    x.set_data_from_numpy(np.zeros((1, 3, 32, 32), np.float32))
    for name, headers in {"no_key": None, "key": {"authorization": f"Bearer {key}"}}.items():
        try:
            client.infer(MODEL, [x], headers=headers, client_timeout=30)
            seen[f"grpc_{name}"] = "OK"
        except InferenceServerException as e:
            seen[f"grpc_{name}"] = e.status()
    return seen


def main(argv: list[str]) -> int:
    mode, http, grpc, key = argv[:4]
    if mode == "load":
        load(http, grpc, key, argv[4], argv[5])
    else:
        print(json.dumps(check(http, grpc, key)))
    sys.stdout.flush()
    os._exit(0)  # grpc's threads do not hold the exit up


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
