"""A binary infer request whose JSON header was seen before takes the first one's parse: only when that parse holds
for it (the same header bytes, body size and artifact), with its own tensor read and checked, and its batch held
to the limit, each time; and over real HTTP, tritonclient's repeated requests get each its own answer."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as triton

from irpe.artifact import ModelArtifact, load_artifact
from irpe.server.http import known_headers
from irpe.server.http.kserve import _decode
from irpe.server.pipeline.oip import ProtocolError
from tests.reliability.procs import serving

LIMIT = 20 * 1024 * 1024
BINARY = {"inputs": [{"name": "images", "shape": [2, 3, 32, 32], "datatype": "FP32",
                      "parameters": {"binary_data_size": 2 * 3072 * 4}}],
          "outputs": [{"name": "logits", "parameters": {"binary_data": True}}]}


@pytest.fixture(autouse=True)
def _forget() -> None:
    known_headers._KNOWN.clear()


def _request(x: np.ndarray, header: dict[str, object] | None = None, tail: bytes = b"") -> tuple[bytes, str]:
    head = json.dumps(header or BINARY).encode()
    return head + x.astype("<f4").tobytes() + tail, str(len(head))


def _decode_new(x: np.ndarray, header: dict[str, object], art: ModelArtifact) -> None:
    body, length = _request(x, header)
    _decode(body, "", length, art, LIMIT, 32)


def _images(seed: int, n: int = 2) -> np.ndarray:
    return np.random.default_rng(seed).random((n, 3, 32, 32), dtype=np.float32)


def test_a_repeated_header_takes_the_first_parse_and_reads_its_own_tensor(tiny_artifact: Path) -> None:
    art = load_artifact(tiny_artifact)
    body, length = _request(_images(1))
    first = _decode(body, "", length, art, LIMIT, 32)
    body2, _ = _request(_images(2))
    second = _decode(body2, "", length, art, LIMIT, 32)
    assert second.req is first.req and second.outputs is first.outputs, "the header was parsed again"
    np.testing.assert_array_equal(second.images, _images(2))
    np.testing.assert_array_equal(first.images, _images(1))
    assert (second.input_ref, second.output_refs) == (None, [])


def test_a_non_finite_tensor_under_a_known_header_is_refused(tiny_artifact: Path) -> None:
    art = load_artifact(tiny_artifact)
    body, length = _request(_images(1))
    _decode(body, "", length, art, LIMIT, 32)
    bad = _images(2)
    bad[1, 2, 3, 4] = np.inf
    with pytest.raises(ProtocolError, match="1 non-finite value"):
        _decode(_request(bad)[0], "", length, art, LIMIT, 32)


def test_a_body_of_another_size_or_another_artifact_is_parsed_again(tiny_artifact: Path) -> None:
    art = load_artifact(tiny_artifact)
    body, length = _request(_images(1))
    cases = {"longer": _request(_images(2), tail=b"\0" * 8)[0], "shorter": body[:-4], "another artifact": body}
    for case, other in cases.items():
        known_headers._KNOWN.clear()
        first = _decode(body, "", length, art, LIMIT, 32)
        try:
            again = _decode(other, "", length, load_artifact(tiny_artifact) if case == "another artifact" else art,
                            LIMIT, 32)
        except ProtocolError as e:
            assert case == "shorter" and "binary_data_size 24576 must equal 24576 (shape [2, 3, 32, 32], FP32) " \
                "and fit the 24572 bytes after the header" in e.message, e.message
            continue
        assert again.req is not first.req, f"{case}: took the remembered parse"
        assert case != "shorter", "a truncated tensor was not refused"
        np.testing.assert_array_equal(again.images, _images(2 if case == "longer" else 1))


def test_a_known_header_over_a_lower_batch_limit_is_refused(tiny_artifact: Path) -> None:
    art = load_artifact(tiny_artifact)
    body, length = _request(_images(1))
    _decode(body, "", length, art, LIMIT, 32)
    with pytest.raises(ProtocolError, match="batch-size must be <= 1, got 2"):
        _decode(body, "", length, art, LIMIT, 1)


def test_headers_with_an_id_compressed_or_json_data_are_not_remembered(tiny_artifact: Path) -> None:
    art = load_artifact(tiny_artifact)
    with_id = {**BINARY, "id": "r1"}
    as_json = {"inputs": [{"name": "images", "shape": [1, 3, 32, 32], "datatype": "FP32",
                           "data": [0.5] * 3072}]}
    for _ in range(2):
        _decode_new(_images(1), with_id, art)
        body, length = _request(_images(1))
        _decode(gzip.compress(body), "gzip", length, art, LIMIT, 32)
        _decode(json.dumps(as_json).encode(), "", None, art, LIMIT, 32)
    assert known_headers._KNOWN == {}


def test_a_header_with_the_empty_id_perf_analyzer_sends_is_remembered(tiny_artifact: Path) -> None:
    art = load_artifact(tiny_artifact)
    header = {"id": "", **BINARY}
    body, length = _request(_images(1), header)
    first = _decode(body, "", length, art, LIMIT, 32)
    assert len(known_headers._KNOWN) == 1
    body, length = _request(_images(2), header)
    again = _decode(body, "", length, art, LIMIT, 32)
    assert len(known_headers._KNOWN) == 1
    assert again.req is first.req and again.req["id"] == ""
    np.testing.assert_array_equal(again.images, _images(2))


def test_at_most_the_set_number_of_headers_of_bounded_size_are_kept(tiny_artifact: Path) -> None:
    art = load_artifact(tiny_artifact)
    for i in range(known_headers.KNOWN_HEADERS + 5):
        header = {**BINARY, "parameters": {"n": i}}
        _decode_new(_images(1), header, art)
        assert 1 <= len(known_headers._KNOWN) <= known_headers.KNOWN_HEADERS
    known_headers._KNOWN.clear()
    long = {**BINARY, "parameters": {"pad": "x" * known_headers.KNOWN_HEADER_BYTES}}
    _decode_new(_images(1), long, art)
    assert known_headers._KNOWN == {}


def test_tritonclients_repeated_requests_get_their_own_answers(tiny_artifact: Path) -> None:
    """The same layout three times over real HTTP (x, y, x): the first and third answers are equal, the second
    differs, and a NaN tensor in the same layout is refused."""
    with serving(tiny_artifact) as server:
        client = triton.InferenceServerClient(server.url.removeprefix("http://"))
        try:
            answers = []
            for x in (_images(1), _images(2), _images(1)):
                inp = triton.InferInput("images", list(x.shape), "FP32")
                inp.set_data_from_numpy(x, binary_data=True)
                out = triton.InferRequestedOutput("logits", binary_data=True)
                answers.append(client.infer("tiny-mean", [inp], outputs=[out]).as_numpy("logits"))
            np.testing.assert_array_equal(answers[0], answers[2])
            assert not np.array_equal(answers[0], answers[1])
            bad = _images(3)
            bad[0, 0, 0, 0] = np.nan
            inp = triton.InferInput("images", list(bad.shape), "FP32")
            inp.set_data_from_numpy(bad, binary_data=True)
            with pytest.raises(triton.InferenceServerException, match="non-finite"):
                client.infer("tiny-mean", [inp], outputs=[triton.InferRequestedOutput("logits", binary_data=True)])
        finally:
            client.close()
