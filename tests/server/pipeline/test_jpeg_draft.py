"""Opt-in JPEG draft decoding (--jpeg-draft / IRPE_JPEG_DRAFT): off by default and bit-exact; on, libjpeg
decodes at a reduced DCT scale no smaller than the resize size, close to the exact path."""

from __future__ import annotations

import io
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image

from irpe.artifact import Preprocess
from irpe.artifact.preprocess import preprocess_image
from irpe.cli import build_parser
from irpe.server.config import Settings
from irpe.server.pipeline.decode import decode_image, prepare
from tests.server.helpers import encode, image, running_server

LIMIT = 40_000_000
PP = Preprocess()  # resize 256, crop 224: the DeiT evaluation transform


def _jpeg(size: tuple[int, int], seed: int = 0) -> bytes:
    return encode(image(size, seed=seed), "JPEG", quality=92)


def _exact(data: bytes, pp: Preprocess = PP) -> np.ndarray:
    """The reference: full-size decode, then the evaluation transform."""
    return preprocess_image(Image.open(io.BytesIO(data)).convert("RGB"), pp)


@pytest.mark.parametrize("size", [(1024, 1024), (640, 480), (300, 700)])
def test_default_is_bit_exact_with_the_reference(size: tuple[int, int]) -> None:
    data = _jpeg(size, seed=size[0])
    assert np.array_equal(prepare(data, PP, LIMIT), _exact(data))
    assert Settings.from_env(env={}).jpeg_draft is False


@pytest.mark.parametrize(("size", "decoded"), [((1024, 1024), (256, 256)), ((1000, 700), (500, 350)),
                                               ((2100, 600), (1050, 300)), ((300, 700), (300, 700))])
def test_draft_decodes_smaller_but_never_below_the_resize(size: tuple[int, int], decoded: tuple[int, int]) -> None:
    img = decode_image(_jpeg(size), LIMIT, draft_size=PP.resize)
    assert img.size == decoded and min(img.size) >= PP.resize and img.mode == "RGB"


def test_draft_leaves_other_formats_alone() -> None:
    assert decode_image(encode(image((1024, 1024)), "PNG"), LIMIT, draft_size=PP.resize).size == (1024, 1024)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_draft_output_is_close_to_the_exact_path(seed: int) -> None:
    data = _jpeg((1024, 1024), seed=seed)
    fast = prepare(data, PP, LIMIT, jpeg_draft=True)
    exact = _exact(data)
    assert fast.shape == (3, 224, 224) and fast.dtype == np.float32
    assert not np.array_equal(fast, exact)  # the draft path really ran
    assert np.abs(fast - exact).max() < 0.5


def test_setting_from_env_and_flag() -> None:
    assert Settings.from_env({"IRPE_JPEG_DRAFT": "1"}).jpeg_draft is True
    assert Settings.from_env({"IRPE_JPEG_DRAFT": "off"}).jpeg_draft is False
    assert Settings.from_env(Settings(jpeg_draft=True).to_env()).jpeg_draft is True
    with pytest.raises(ValueError, match="IRPE_JPEG_DRAFT"):
        Settings.from_env({"IRPE_JPEG_DRAFT": "maybe"})
    assert build_parser().parse_args(["serve", "/m", "--jpeg-draft"]).jpeg_draft is True
    assert build_parser().parse_args(["serve", "/m"]).jpeg_draft is None  # so IRPE_JPEG_DRAFT still applies


def _top1(url: str, data: bytes) -> int:
    r = httpx.post(url + "/classify?top_k=1", content=data, headers={"content-type": "image/jpeg"})
    assert r.status_code == 200, r.text
    return r.json()["predictions"][0][0]["index"]


def test_served_draft_reports_itself_and_keeps_top1(tiny_artifact: Path, server_url: str) -> None:
    jpegs = [_jpeg((1024, 768), seed=s) for s in range(4)]
    assert httpx.get(server_url + "/v1/models").json()["models"][0]["jpeg_draft"] is False
    exact = [_top1(server_url, d) for d in jpegs]
    with running_server(tiny_artifact, jpeg_draft=True, max_wait_ms=2) as url:
        assert httpx.get(url + "/v1/models").json()["models"][0]["jpeg_draft"] is True
        assert [_top1(url, d) for d in jpegs] == exact
