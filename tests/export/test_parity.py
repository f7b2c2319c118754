"""Parity checking: passes on a faithful export, fails (saying by how much) on a diverging one."""

from __future__ import annotations

import json

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
    tol = FP32_TOLERANCE.atol + FP32_TOLERANCE.rtol * report["logit_scale"]
    assert report["passed"] and report["max_abs_diff"] <= report["tolerance"] == pytest.approx(tol)
    assert report["precision"] == "fp32" and report["reference"] == "pytorch-float64"
    assert report["max_abs_diff"] < tol / 10  # float32 rounding only, far from the bound
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
    with pytest.raises(ParityError, match=r"max abs logit diff .* exceeds the fp32 tolerance .* \(= 1e-05 \+ "
                       r"0.0001 x max\|logit\| .*\) by"):
        check_parity(model, path, Preprocess.for_imagenet(32))


def test_fp16_tolerance_applies_to_fp16_graphs(micro, tmp_path):
    model, _ = micro
    path = onnx_from_model(model, tmp_path / "m16.onnx", fp16=True)
    report = check_parity(model, path, Preprocess.for_imagenet(32), fp16=True)
    scale = report["logit_scale"]
    assert report["precision"] == "fp16" and report["tolerance"] == pytest.approx(FP16_TOLERANCE.bound(scale))
    assert FP32_TOLERANCE.bound(scale) < report["max_abs_diff"] <= FP16_TOLERANCE.bound(scale)  # really fp16
    with pytest.raises(ParityError, match="fp32 tolerance"):
        check_parity(model, path, Preprocess.for_imagenet(32), fp16=False)


def test_parity_is_deterministic_and_leaves_the_model_in_float32(micro):
    model, path = micro
    reports = [check_parity(model, path, Preprocess.for_imagenet(32)) for _ in range(3)]
    assert len({r["max_abs_diff"] for r in reports}) == 1 and len({r["logit_scale"] for r in reports}) == 1
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_the_bound_scales_with_the_logits():
    assert FP32_TOLERANCE.bound(0.0) == FP32_TOLERANCE.atol
    assert FP32_TOLERANCE.bound(20.0) == pytest.approx(1e-5 + 20 * 1e-4)
    assert FP16_TOLERANCE.bound(10.0) == pytest.approx(1e-3 + 0.1)


@pytest.mark.slow
@pytest.mark.timeout(7200)  # 50 DeiT-S exports at 224 px: ~25 min on 2 idle cores, > 1 h on a busy one
def test_fifty_consecutive_exports_of_one_qkv_checkpoint_all_pass(tmp_path):
    """The gate that once failed 1 export in 10 of one DeiT-S iRPE-QKV checkpoint: same verdict, same diff."""
    from irpe.export import ExportOptions, export_artifact

    model = random_model("deit_small_patch16_224_ctx_product_50_shared_qkv", rpe_std=0.5)
    ckpt = tmp_path / "qkv.pth"
    torch.save({"model": model.state_dict()}, ckpt)
    diffs = set()
    for i in range(50):
        out = export_artifact(ckpt, tmp_path / f"a{i % 2}", ExportOptions(progress=False))
        report = json.loads((out / "model.json").read_text())["parity"]
        assert report["passed"], report
        diffs.add(report["max_abs_diff"])
        print(f"export {i + 1}/50: max |logit diff| {report['max_abs_diff']:.3e} <= {report['tolerance']:.3e}",
              flush=True)
    assert len(diffs) == 1, diffs
