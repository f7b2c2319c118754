"""Hostile input to the Open Inference Protocol parser (repeated outputs, odd header lengths, and fuzzing):
every request is a 4xx with ``{"error": "message"}``, answered in bounded time and memory, and the server keeps
serving.

The server tests send each request to a real ``irpe serve`` (default limits: 20 MB bodies, 256 images) and
measure the server's RSS; the codec tests fuzz the parser in-process with Hypothesis (only ProtocolError
may come out of it, never a TypeError, OverflowError or ValueError that would be a 500)."""

from __future__ import annotations

import gzip
import json
import random
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from irpe.artifact import load_artifact
from irpe.server.http import kserve_codec as codec
from irpe.server.http.kserve import _decode
from tests.reliability.procs import ServerProcess, serving

MODEL = "tiny-mean"
INFER = f"/v2/models/{MODEL}/infer"
LIMIT = 20 * 1024 * 1024


def _valid(n: int = 1, **extra: object) -> dict[str, object]:
    return {"inputs": [{"name": "images", "shape": [n, 3, 32, 32], "datatype": "FP32", "data": [0.0] * 3072 * n}],
            **extra}


def _binary(header: dict[str, object], n: int = 1) -> tuple[bytes, dict[str, str]]:
    head = json.dumps(header).encode()
    return head + np.zeros(n * 3072, np.float32).tobytes(), {"inference-header-content-length": str(len(head))}


def _bin_header(**params: object) -> dict[str, object]:
    return {"inputs": [{"name": "images", "shape": [1, 3, 32, 32], "datatype": "FP32", "parameters": params}]}


HUGE = "1" + "0" * 5000  # over Python's 4,300-digit int() limit


def hostile() -> list[tuple[str, bytes, dict[str, str | bytes], int]]:
    """(name, body, headers, expected status)."""
    rep_class = json.dumps(_valid(outputs=[{"name": "logits", "parameters": {"classification": 1000}}] * 10_000))
    rep_plain = json.dumps(_valid(outputs=[{"name": "logits"}] * 10_000))
    body, hdr = _binary(_bin_header(binary_data_size=12288))
    cases = [
        ("H1: 10,000 repeated classification outputs", rep_class.encode(), {}, 400),
        ("H1: 10,000 repeated plain outputs", rep_plain.encode(), {}, 400),
        ("M1: header length '²'", body, {"inference-header-content-length": "²".encode("latin-1")}, 400),
        ("M1: header length Arabic-Indic digits", body, {"inference-header-content-length": "١٢٣".encode()}, 400),
        ("M1: header length -1", body, {"inference-header-content-length": "-1"}, 400),
        ("M1: header length 1e3", body, {"inference-header-content-length": "1e3"}, 400),
        ("M1: header length of 30 digits", body, {"inference-header-content-length": "9" * 30}, 400),
        ("M1: header length beyond the body", body, {"inference-header-content-length": str(len(body) + 1)}, 400),
        ("valid binary request", body, hdr, 200),
    ]
    for name, text in [
        ("M1: binary_data_size Infinity", json.dumps(_bin_header()).replace("{}", '{"binary_data_size": Infinity}')),
        ("M1: binary_data_size 1e999", json.dumps(_bin_header()).replace("{}", '{"binary_data_size": 1e999}')),
        ("M1: binary_data_size 5000 digits",
         json.dumps(_bin_header()).replace("{}", f'{{"binary_data_size": {HUGE}}}')),
        ("M1: binary_data_size -12288", json.dumps(_bin_header(binary_data_size=-12288))),
        ("M1: binary_data_size true", json.dumps(_bin_header(binary_data_size=True))),
        ("M1: classification Infinity", json.dumps(_valid(outputs=[{"name": "logits", "parameters": {
            "classification": 1}}])).replace('"classification": 1', '"classification": Infinity')),
        ("M1: classification 10^5000", json.dumps(_valid(outputs=[{"name": "logits", "parameters": {
            "classification": 1}}])).replace('"classification": 1', f'"classification": {HUGE}')),
        ("M1: classification 2.5", json.dumps(_valid(outputs=[{"name": "logits", "parameters": {
            "classification": 2.5}}]))),
        ("M1: id NaN", json.dumps(_valid()).replace('{"inputs"', '{"id": NaN, "inputs"')),
        ("M1: id 5", json.dumps(_valid(id=5))),
        ("M1: batch of 5000 digits", json.dumps(_valid()).replace('"shape": [1,', f'"shape": [{HUGE},')),
        ("M1: batch 10^19", json.dumps(_valid()).replace('"shape": [1,', '"shape": [10000000000000000000,')),
        ("M1: data value -Infinity", json.dumps(_valid()).replace("[0.0,", "[-Infinity,", 1)),
        ("M1: data value 1e999", json.dumps(_valid()).replace("[0.0,", "[1e999,", 1)),
        ("data of booleans", json.dumps(_valid()).replace("0.0", "true")),
        ("data of 25-digit integers", json.dumps(_valid()).replace("0.0", "1" * 25)),
        ("nested 100,000 deep", "[" * 100_000),
        ("binary_data_output 'yes'", json.dumps(_valid(parameters={"binary_data_output": "yes"}))),
    ]:
        raw = text.encode()
        if "binary_data_size" in name:
            raw, hdr2 = raw + np.zeros(3072, np.float32).tobytes(), {"inference-header-content-length": str(len(raw))}
        else:
            hdr2 = {}
        cases.append((name, raw, hdr2, 400))
    cases.append(("gzip bomb: 128 MB of zeros", gzip.compress(b"\0" * (128 << 20), 9), {"content-encoding": "gzip"},
                  413))
    cases.append(("deflate, not deflate data", b"plain text", {"content-encoding": "deflate"}, 400))
    cases.append(("Content-Encoding br", b"{}", {"content-encoding": "br"}, 415))
    return cases


CASES = hostile()


@pytest.fixture(scope="module")
def server(tiny_artifact: Path) -> Iterator[ServerProcess]:
    with serving(tiny_artifact, "--max-wait-ms", "2") as proc:
        yield proc


@pytest.mark.parametrize(("name", "body", "headers", "status"), CASES, ids=[c[0] for c in CASES])
def test_hostile_request_is_a_bounded_4xx(server: ServerProcess, name: str, body: bytes,
                                          headers: dict[str, str | bytes], status: int) -> None:
    rss = server.rss_mb()
    start = time.monotonic()
    r = httpx.post(server.url + INFER, content=body, headers=headers, timeout=30)
    took = time.monotonic() - start
    grown = server.rss_mb() - rss
    print(f"{name}: {r.status_code} in {took * 1e3:.0f} ms, RSS {grown:+.1f} MB: {r.text[:160]}")
    assert r.status_code == status, r.text[:500]
    if status >= 400:
        assert set(r.json()) == {"error"} and isinstance(r.json()["error"], str) and r.json()["error"]
    assert took < 3.0 and grown < 60  # before the fix, H1 took 15-20 s and 0.3-2 GB
    assert httpx.get(server.url + "/v2/health/ready").status_code == 200


def test_mutation_fuzz_never_500(server: ServerProcess) -> None:
    """400 random byte mutations of valid JSON and binary requests (seeded): never a 5xx, no traceback."""
    rng = random.Random(17)
    seeds = [json.dumps(_valid(2, id="x", outputs=[{"name": "logits", "parameters": {"classification": 3}}])).encode(),
             _binary(_bin_header(binary_data_size=12288))]
    statuses: dict[int, int] = {}
    with httpx.Client(base_url=server.url, timeout=30) as client:
        for i in range(400):
            seed = seeds[i % 2]
            body, headers = (seed, {}) if isinstance(seed, bytes) else seed
            data = bytearray(body)
            for _ in range(rng.randint(1, 8)):
                pos = rng.randrange(min(len(data), 400))  # the JSON header, where the parser works
                data[pos] = rng.choice(b'0123456789-+.eE[]{}":,NaInfity \\\x00\xff')
            r = client.post(INFER, content=bytes(data), headers=headers)
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            assert r.status_code < 500, (bytes(data[:400]), r.text)
    print(f"mutation fuzz statuses: {statuses}")
    assert "Traceback" not in server.output() and "unhandled error" not in server.output()


@pytest.fixture(scope="module")
def art(tiny_artifact: Path) -> object:
    return load_artifact(tiny_artifact)


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(header=st.one_of(st.none(), st.text(max_size=8)), raw=st.binary(max_size=300),
       encoding=st.sampled_from(["", "gzip", "deflate", "identity", "zstd"]))
def test_codec_raises_only_protocol_errors(art: object, header: str | None, raw: bytes, encoding: str) -> None:
    try:
        _decode(raw, encoding, header, art, LIMIT, 256)  # type: ignore[arg-type]
    except codec.ProtocolError as e:
        assert e.status in (400, 413, 415) and e.message


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                       max_size=4), max_leaves=12)


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(spec=st.dictionaries(st.sampled_from(["name", "shape", "datatype", "data", "parameters"]), json_values),
       top=st.dictionaries(st.sampled_from(["id", "outputs", "parameters"]), json_values))
def test_structured_fuzz_raises_only_protocol_errors(art: object, spec: dict[str, object],
                                                      top: dict[str, object]) -> None:
    """Requests shaped like the protocol with arbitrary JSON values in every field (NaN/Infinity included)."""
    text = json.dumps({"inputs": [{"name": "images", **spec}], **top}).encode()
    try:
        _decode(text, "", None, art, LIMIT, 256)  # type: ignore[arg-type]
    except codec.ProtocolError as e:
        assert e.status in (400, 413)


def _render_with_json(req: dict[str, object], logits: np.ndarray, art: object, name: str) -> tuple[bytes, int | None]:
    """The answer as json.dumps writes it (the reference the quick rendering must equal byte for byte)."""
    binary = (req.get("parameters") or {}).get("binary_data_output", False)  # type: ignore[union-attr]
    out: dict[str, object] = {"name": "logits", "datatype": "FP32", "shape": list(logits.shape)}
    flat = np.ascontiguousarray(logits, dtype="<f4")
    if binary:
        out["parameters"] = {"binary_data_size": flat.nbytes}
    else:
        out["data"] = flat.reshape(-1).tolist()
    text = json.dumps({"model_name": name, "model_version": "3", "id": req.get("id") or "rid", "outputs": [out]},
                      allow_nan=False).encode()
    return (text + flat.tobytes(), len(text)) if binary else (text, None)


def test_rendered_logits_are_what_json_dumps_writes(art: object) -> None:
    """Every float32 magnitude (below 1e-4 as json writes it, -0.0, the FP32 extremes, 200,000 random bit
    patterns), odd ids and names, binary and JSON outputs: the same bytes as json.dumps."""
    rng = np.random.default_rng(7)
    special = np.array([0.0, -0.0, 1e-4, 9.9999e-5, 1e-5, -1e-7, 1e16, 1e15, 3.4028235e38, 1e-45, 10.00001, 0.1,
                        123456.0, -2.5], np.float32)
    patterns = rng.integers(0, 2**32, size=200_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    values = np.concatenate([special, patterns[np.isfinite(patterns)]])
    values = values[:len(values) // 2 * 2]
    normal = rng.standard_normal(1000).astype(np.float32)
    normal[np.abs(normal) < 1e-3] = 0.5
    assert codec._floats_json(normal.tolist()) is not None  # orjson's text here; json's below 1e-4
    assert codec._floats_json(values[:14].tolist()) is None
    for chunk, req, name in [(values[:14], {"id": "é☃\"\\\n"}, "m"), (values[14:], {}, "naïve"),
                             (normal, {"id": ""}, "tiny-mean"),
                             (values[:14], {"parameters": {"binary_data_output": True}}, "m")]:
        logits = chunk.reshape(-1, 2)
        want = _render_with_json(req, logits, art, name)
        assert codec.render(req, "rid", logits, art, name, "3") == want  # type: ignore[arg-type]


@pytest.mark.parametrize("text", ['{"a": [1, 2.5, "x"], "b": {"c": null}}', '{"a": 1, "a": 2}', "[1e400]",
                                  '"\\ud800"', '{"x": "é"}', "  {}  "])
@pytest.mark.parametrize("encoding", ["utf-8", "utf-8-sig", "utf-16", "utf-16-le", "utf-32", "utf-32-be"])
def test_loads_reads_what_json_loads_reads(text: str, encoding: str) -> None:
    assert codec.loads(text.encode(encoding)) == json.loads(text.encode(encoding))


@pytest.mark.parametrize("encoding", ["utf-8", "utf-8-sig", "utf-16", "utf-32-le"])
def test_loads_refuses_an_integer_over_20_digits_in_any_encoding(encoding: str) -> None:
    assert codec.loads('{"a": [12345678901234567890, "123456789012345678901"]}'.encode(encoding))["a"][0] == \
        12345678901234567890
    long_text = '{"pad": "' + "x" * codec.PLAIN_BYTES + '", "a": 1' + "0" * 20 + "}"
    for text in ('{"a": -123456789012345678901}', long_text):
        with pytest.raises(codec.ProtocolError, match="at most 20 allowed"):
            codec.loads(text.encode(encoding))
