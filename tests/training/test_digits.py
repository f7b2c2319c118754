import io
from dataclasses import replace

import numpy as np
import pytest
import torch
from PIL import Image

from irpe.artifact.preprocess import preprocess_image
from irpe.artifact.schema import Preprocess
from irpe.models import load_checkpoint_with_info
from irpe.training.datasets import load_data
from irpe.training.digits import VARIANTS, digit_image, random_affine, split_digits
from irpe.training.renderings import decoded, training_rendering


@pytest.fixture(scope="module")
def bundle():
    return load_data("digits", 32)


def _png(img: Image.Image) -> Image.Image:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    buf.seek(0)
    return Image.open(buf)


def test_fixed_stratified_split():
    x_tr, x_va, y_tr, y_va = split_digits()
    assert x_tr.shape == (1437, 8, 8) and x_va.shape == (360, 8, 8)
    assert np.array_equal(np.bincount(y_va), np.bincount(split_digits()[3]))
    assert max(abs(np.bincount(y_va) / 360 - np.bincount(y_tr) / 1437)) < 0.01


def test_preprocess_contract_stored_for_model_json(bundle):
    pp = bundle.preprocess
    assert isinstance(pp, Preprocess) and pp.grayscale and pp.fit == "ink" and pp.invert == "never"
    assert pp.resize == pp.crop == 32 and pp.interpolation == "bilinear"
    assert len(set(pp.mean)) == 1 and 0.05 < pp.mean[0] < 0.5 and 0.2 < pp.std[0] < 0.6


def test_validation_tensors_equal_preprocess_image_of_the_png_in_both_styles(bundle):
    _, x_va, _, _ = split_digits()
    for i in range(0, 360, 7):
        want = bundle.val[i][0].numpy()
        light = preprocess_image(_png(digit_image(x_va[i])).convert("RGB"), bundle.preprocess)
        dark = preprocess_image(_png(digit_image(x_va[i], dark_on_light=True)), bundle.preprocess)
        assert np.array_equal(light, want) and np.array_equal(dark, want), i


def test_training_variants_are_decoded_renderings_through_the_serving_transform(bundle):
    variants = bundle.train.variants
    assert variants.shape == (VARIANTS, 1437, 1, 32, 32) and 0 <= float(variants.min()) <= float(variants.max()) <= 1
    rng = np.random.default_rng([0, 8])
    x_tr = split_digits()[0]
    raw = replace(bundle.preprocess, mean=(0.0,) * 3, std=(1.0,) * 3)
    for n in range(3):  # the first draws of the seeded stream are the first digits' first variants
        want = preprocess_image(decoded(x_tr[n], training_rendering(rng)), raw)[0]
        assert np.array_equal(variants[0, n, 0].numpy(), want)
    plain = bundle.train.pixels[:, 0]
    assert float((variants[0, :, 0] - plain).abs().mean()) > 0.02  # the renderings differ from the plain digit


def test_training_augmentation_is_a_small_ink_preserving_affine(bundle):
    torch.manual_seed(0)
    x = bundle.train.pixels[5]
    y = random_affine(x)
    assert y.shape == x.shape and not torch.equal(x, y)
    assert abs(float(y.sum() / x.sum()) - 1) < 0.3
    assert float(torch.corrcoef(torch.stack([x.flatten(), y.flatten()]))[0, 1]) > 0.3
    a, _ = bundle.train[5]
    b, _ = bundle.train[5]
    assert not torch.equal(a, b) and a.shape == (3, 32, 32)
    assert torch.equal(a[0], a[1]) and torch.equal(a[0], a[2])  # grey, replicated


def test_augmentation_slants_like_handwriting_and_is_the_identity_when_zeroed():
    bar = torch.zeros(1, 32, 32)
    bar[:, 4:28, 15:17] = 1.0  # a vertical stroke
    still = random_affine(bar, degrees=0.0, shift=0.0, scale=(1.0, 1.0), shear=0.0)
    assert torch.allclose(still, bar, atol=1e-5)
    torch.manual_seed(0)
    leans = [random_affine(bar, degrees=0.0, shift=0.0, scale=(1.0, 1.0), shear=0.3) for _ in range(8)]
    cols = torch.arange(32, dtype=torch.float32)

    def centre(img: torch.Tensor) -> float:
        return float((img.sum(0) * cols).sum() / img.sum())

    tilt = [centre(y[0, 4:12]) - centre(y[0, 20:28]) for y in leans]  # top minus bottom column centre
    assert max(abs(t) for t in tilt) > 1.5 and min(tilt) < 0 < max(tilt)  # slanted, both ways
    assert all(abs(float(y.sum() / bar.sum()) - 1) < 0.05 for y in leans)  # shear keeps the ink


def test_png_of_held_out_digits_gets_the_same_label_as_the_training_pipeline(digits_run, bundle):
    model, _ = load_checkpoint_with_info(digits_run.checkpoint)
    _, x_va, _, _ = split_digits()
    idx = list(range(0, 360, 9))
    with torch.no_grad():
        ref = model(torch.stack([bundle.val[i][0] for i in idx])).argmax(1)
        for style in (False, True):
            xs = [preprocess_image(_png(digit_image(x_va[i], style)), bundle.preprocess) for i in idx]
            got = model(torch.from_numpy(np.stack(xs))).argmax(1)
            assert (got == ref).float().mean() >= 0.95, style
