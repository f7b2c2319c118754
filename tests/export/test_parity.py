"""Parity checking: passes on a faithful export, fails (saying by how much) on a diverging one."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from irpe.artifact import Preprocess
from irpe.export import ParityError, check_parity, onnx_from_model
from irpe.export.bench import random_model
from irpe.export.parity import FP16_TOLERANCE, FP32_TOLERANCE, format_report, sample_images

MICRO = "deit_micro_patch4_32_ctx_product_shared_k"


@pytest.fixture(scope="module")
def micro(tmp_path_factory):
    model = random_model(MICRO, img_size=32, rpe_std=0.5, rpe_on="qkv")
    path = onnx_from_model(model, tmp_path_factory.mktemp("parity") / "m.onnx")
    return model, path


def test_sample_photographs_are_preprocessed_real_images():
    pp = Preprocess.for_imagenet(64)
    x = sample_images(pp)
    assert x.shape == (3, 3, 64, 64) and x.dtype == np.float32
    assert 0.3 < float(x.std()) < 3.0 and not np.allclose(x[0], x[1])  # normalised, distinct photos


def test_faithful_export_passes_with_a_full_report(micro):
    model, path = micro
    report = check_parity(model, path, Preprocess.for_imagenet(32))
    assert report["passed"] and report["max_abs_diff"] <= FP32_TOLERANCE
    assert report["tolerance"] == FP32_TOLERANCE and report["precision"] == "fp32"
    assert report["random"]["batches"] == [1, 3] and report["images"]["names"] == ["astronaut", "chelsea", "coffee"]
    assert report["images"]["top1_equal"] and report["random"]["top1_equal"]
    line = format_report(report)
    assert "parity" in line and f"{report['max_abs_diff']:.2e}" in line


def test_diverging_graph_fails_and_says_by_how_much(micro, tmp_path):
    model, _ = micro
    other = random_model(MICRO, img_size=32, rpe_std=0.5, rpe_on="qkv")
    with torch.no_grad():
        for key, p in other.named_parameters():
            if "lookup_table" in key:
                p.mul_(1.5)  # the graph on disk no longer matches this model's RPE tables
    path = onnx_from_model(other, tmp_path / "other.onnx")
    with pytest.raises(ParityError, match=r"max abs logit diff .* exceeds the fp32 tolerance 0.0001 by"):
        check_parity(model, path, Preprocess.for_imagenet(32))


def test_fp16_tolerance_applies_to_fp16_graphs(micro, tmp_path):
    model, _ = micro
    path = onnx_from_model(model, tmp_path / "m16.onnx", fp16=True)
    report = check_parity(model, path, Preprocess.for_imagenet(32), fp16=True)
    assert report["precision"] == "fp16" and report["tolerance"] == FP16_TOLERANCE
    assert FP32_TOLERANCE < report["max_abs_diff"] <= FP16_TOLERANCE  # really ran in half precision
    with pytest.raises(ParityError, match="fp32 tolerance"):
        check_parity(model, path, Preprocess.for_imagenet(32), fp16=False)
