"""server/grpc/codec.py: an answer of logits built as bytes (answer_bytes) is byte for byte what protobuf serializes
for encode_infer's message, whatever the id, batch, classes and names; ModelInfer's serializer sends those bytes as
they are and serializes a message.

The check runs in its own process (``python -c``), as in test_handlers.py: tritonclient.grpc's messages and
kserve's share the protobuf package ``inference``, and the test process imports kserve."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np

REPO = Path(__file__).resolve().parents[3]


def test_answer_bytes_in_its_own_process() -> None:
    code = "from tests.server.grpc.test_codec import _check_answer_bytes as c; c(); print('passed')"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip().endswith("passed"), out.stderr[-3000:]


def _check_answer_bytes() -> None:
    from tritonclient.grpc import service_pb2 as pb

    from irpe.server.grpc import codec

    rng = np.random.default_rng(0)
    ids = ["", "a", "7f" * 16, "x" * 127, "y" * 128, "z" * 1024, "é√🙂" * 40]
    cases = 0
    for name, version, output in (("m", "1", "logits"), ("deit_micro_patch4_32", "12", "o" * 200), ("n", "", "")):
        for shape in ((1, 10), (3, 10), (1, 1000), (2, 130)):
            logits = rng.standard_normal(shape).astype(np.float32)
            logits[0, 0] = -0.0
            for request_id in ids:
                art = SimpleNamespace(output_name=output)
                want = codec.encode_infer(pb.ModelInferRequest(), logits, 0, art, name, version,  # type: ignore[arg-type]
                                          request_id).SerializeToString()
                got = codec.answer_bytes(name, version, request_id, output, logits)
                assert got == want, (name, version, output, shape, request_id, got[:80], want[:80])
                assert codec.serialized(got) is got
                assert codec.serialized(pb.ModelInferResponse.FromString(want)) == want
                cases += 1
    assert cases == 3 * 4 * len(ids)
    wide = rng.standard_normal((2, 10)).astype(np.float64)  # any float logits are sent as FP32, as encode_infer does
    assert codec.answer_bytes("m", "1", "i", "o", wide) == codec.encode_infer(
        pb.ModelInferRequest(), wide, 0, SimpleNamespace(output_name="o"), "m", "1", "i").SerializeToString()  # type: ignore[arg-type]
