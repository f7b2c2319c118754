"""Record what `irpe serve digits` answers to a fixed set of requests, over HTTP and gRPC, in both process layouts.

A refactoring that should change nothing is checked by recording before and after and comparing the two files
byte for byte:

    .venv/bin/python scripts/record_answers.py /tmp/before.json   # on the code before
    .venv/bin/python scripts/record_answers.py /tmp/after.json    # on the code after
    cmp /tmp/before.json /tmp/after.json

Each answer is kept whole (status and body), except the fields that differ on every run by design (request ids,
timings, the batch a request shared). Run from the repository root; needs the grpc and dev extras (tritonclient).
"""

from __future__ import annotations

import io
import json
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
from PIL import Image, ImageDraw

MODEL = "deit_micro_patch4_32_ctx_product_shared_k"  # the shipped digits model
LAYOUTS = {"one-process": [], "frontends-2": ["--frontends", "2"]}
VOLATILE = re.compile(rb'"(request_id|id|trace_id|timing_ms|batch_size)":\s*("[^"]*"|[0-9.e+-]+|\{[^}]*\})')


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def digit_png(digit: int, size: int = 64) -> bytes:
    """A drawn digit, the same bytes on every run."""
    image = Image.new("L", (size, size), 0)
    ImageDraw.Draw(image).text((size // 3, size // 4), str(digit), fill=255, font_size=size // 2)
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def stable(body: bytes) -> str:
    return VOLATILE.sub(rb'"\1": "*"', body).decode("utf-8", "replace")


def http_answers(url: str) -> dict[str, str]:
    """Status and body of each HTTP request of the set."""
    pngs = [digit_png(d) for d in (1, 4, 7)]
    calls = {
        "GET /healthz": ("GET", "/healthz", {}),
        "GET /readyz": ("GET", "/readyz", {}),
        "GET /v1/models": ("GET", "/v1/models", {}),
        "GET /v2": ("GET", "/v2", {}),
        "GET /v2/models/MODEL": ("GET", f"/v2/models/{MODEL}", {}),
        "GET /v2/models/MODEL/config": ("GET", f"/v2/models/{MODEL}/config", {}),
        "GET /v2/models/nope": ("GET", "/v2/models/nope", {}),
        "POST /classify 3 images": ("POST", "/classify?top_k=3",
                                    {"files": [("file", (f"{i}.png", p, "image/png")) for i, p in enumerate(pngs)]}),
        "POST /classify garbage": ("POST", "/classify", {"files": [("file", ("x.png", b"not an image", "image/png"))]}),
        "POST /classify no file": ("POST", "/classify", {"data": {"x": "1"}}),
        "POST /classify top_k=0": ("POST", "/classify?top_k=0",
                                   {"files": [("file", ("a.png", pngs[0], "image/png"))]}),
    }
    meta = httpx.get(f"{url}/v2/models/{MODEL}", timeout=10).json()
    shape = [1, *[int(d) for d in meta["inputs"][0]["shape"][1:]]]
    tensor = np.linspace(-1, 1, int(np.prod(shape)), dtype=np.float32)
    infer = {"inputs": [{"name": meta["inputs"][0]["name"], "shape": shape, "datatype": "FP32",
                         "data": [round(float(v), 6) for v in tensor]}]}
    calls["POST /v2 infer"] = ("POST", f"/v2/models/{MODEL}/infer", {"json": infer})
    bad = {"inputs": [{**infer["inputs"][0], "datatype": "INT8"}]}
    calls["POST /v2 infer bad datatype"] = ("POST", f"/v2/models/{MODEL}/infer", {"json": bad})
    answers = {}
    with httpx.Client(base_url=url, timeout=30) as client:
        for name, (method, path, kwargs) in calls.items():
            response = client.request(method, path, **kwargs)
            answers[name] = f"{response.status_code} {stable(response.content)}"
        answers.update(binary_answers(client, meta, shape))
    return answers


def binary_answers(client: httpx.Client, meta: dict, shape: list[int]) -> dict[str, str]:
    """Binary tensor extension infers as perf_analyzer sends them (``"id":""``), each twice (the second takes the
    remembered parse of its header), with a real id and with none: status, the answer's JSON header, its tensor's
    bytes in hex."""
    answers = {}
    tensor = np.linspace(-1, 1, int(np.prod(shape)), dtype=np.float32)
    for name, extra in (("perf_analyzer's empty id", {"id": ""}), ("an id", {"id": "r7"}), ("no id", {})):
        header = json.dumps({**extra, "inputs": [{"name": meta["inputs"][0]["name"], "datatype": "FP32",
                                                  "shape": shape, "parameters": {"binary_data_size": tensor.nbytes}}],
                             "outputs": [{"name": meta["outputs"][0]["name"],
                                          "parameters": {"binary_data": True}}]}).encode()
        for turn, values in (("first", tensor), ("again", tensor[::-1].copy())):
            response = client.post(f"/v2/models/{MODEL}/infer", content=header + values.tobytes(), headers={
                "Inference-Header-Content-Length": str(len(header)), "Content-Type": "application/octet-stream"})
            split = int(response.headers.get("inference-header-content-length", len(response.content)))
            answers[f"POST /v2 infer binary, {name}, {turn}"] = (
                f"{response.status_code} {stable(response.content[:split])} {response.content[split:].hex()}")
    return answers


def grpc_answers(address: str) -> dict[str, str]:
    """What tritonclient.grpc returns (or raises) for each gRPC call of the set."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(address)
    meta = client.get_model_metadata(MODEL, as_json=True)
    shape = [1, *[int(d) for d in meta["inputs"][0]["shape"][1:]]]
    tensor = np.linspace(-1, 1, int(np.prod(shape)), dtype=np.float32).reshape(shape)

    def infer(data: np.ndarray, model: str = MODEL) -> str:
        item = grpcclient.InferInput(meta["inputs"][0]["name"], list(data.shape), "FP32")
        item.set_data_from_numpy(data)
        result = client.infer(model, [item])
        return result.as_numpy(meta["outputs"][0]["name"]).tobytes().hex()

    calls = {
        "ServerLive": lambda: client.is_server_live(),
        "ServerReady": lambda: client.is_server_ready(),
        "ModelMetadata": lambda: json.dumps(meta, sort_keys=True),
        "ModelConfig": lambda: json.dumps(client.get_model_config(MODEL, as_json=True), sort_keys=True),
        "ModelInfer": lambda: infer(tensor),
        "ModelInfer wrong shape": lambda: infer(tensor[..., :-1]),
        "ModelInfer unknown model": lambda: infer(tensor, model="nope"),
    }
    answers = {}
    for name, call in calls.items():
        try:
            answers[name] = f"ok {call()}"
        except InferenceServerException as error:
            answers[name] = f"error {error.status()} {error.message()}"
    client.close()
    return answers


def record_layout(flags: list[str]) -> dict[str, dict[str, str]]:
    """Start `irpe serve digits` with ``flags``, record every answer, stop it."""
    port, grpc_port = free_port(), free_port()
    command = [sys.executable, "-m", "irpe", "serve", "digits", "--host", "127.0.0.1", "--port", str(port),
               "--grpc-port", str(grpc_port), "--log-level", "warning", *flags]
    with tempfile.TemporaryFile() as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                try:
                    if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if server.poll() is not None:
                    log.seek(0)
                    raise RuntimeError(f"irpe serve exited {server.returncode}: {log.read().decode()}")
                time.sleep(0.2)
            return {"http": http_answers(url), "grpc": grpc_answers(f"127.0.0.1:{grpc_port}")}
        finally:
            server.terminate()
            server.wait(30)


def main() -> None:
    out = Path(sys.argv[1])
    record = {layout: record_layout(flags) for layout, flags in LAYOUTS.items()}
    out.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    print(f"recorded {sum(len(v) for r in record.values() for v in r.values())} answers to {out}")


if __name__ == "__main__":
    main()
