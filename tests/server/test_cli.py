"""``irpe classify`` (local, no server) and the ``irpe serve`` parser."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from irpe.artifact import Preprocess
from irpe.artifact.preprocess import preprocess_image
from irpe.cli import build_parser, main
from tests.server.helpers import LABELS, encode, expected_logits, image


def test_classify_prints_a_table(tiny_artifact: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    paths = []
    for seed in (1, 2):
        p = tmp_path / f"img{seed}.jpg"
        p.write_bytes(encode(image(seed=seed), "PNG"))
        paths.append(str(p))
    assert main(["classify", *paths, "--model", str(tiny_artifact), "--top-k", "2"]) == 0
    out = capsys.readouterr().out
    assert "model: tiny-mean" in out
    for seed, p in zip((1, 2), paths, strict=True):
        best = int(np.argmax(expected_logits(preprocess_image(image(seed=seed), Preprocess(36, 32))[None])))
        row = next(line for line in out.splitlines() if line.startswith(p))
        assert row.split()[-1] == LABELS[best]


def test_classify_bad_image_is_a_one_line_error(tiny_artifact: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture) -> None:
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"nope")
    assert main(["classify", str(bad), "--model", str(tiny_artifact)]) == 2
    err = capsys.readouterr().err
    assert "bad.jpg" in err and "not a recognised image" in err


def test_serve_parser_has_every_option() -> None:
    args = build_parser().parse_args(["serve", "/m", "--host", "0.0.0.0", "--port", "9", "--backend", "tensorrt",
                                      "--device", "cuda", "--max-batch", "4", "--max-wait-ms", "3",
                                      "--max-queue", "7", "--workers", "2", "--max-body-mb", "5",
                                      "--max-pixels", "40e6", "--timeout-s", "9"])
    assert (args.max_pixels, args.workers, args.backend, args.timeout_s) == (40_000_000, 2, "tensorrt", 9.0)
    bench = build_parser().parse_args(["bench", "serve", "--requests", "10", "--concurrency", "1,2"])
    assert bench.concurrency == "1,2" and bench.requests == 10
