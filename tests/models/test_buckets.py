import json

import numpy as np
import pytest

from irpe.models.buckets import PiecewiseCoefficients, bucket_ids, num_buckets, piecewise_index


def test_all_reference_tables_match_exactly(reference_dir):
    index = json.loads((reference_dir / "bucket_ids_index.json").read_text())
    tables = np.load(reference_dir / "bucket_ids.npz")
    assert len(index) == 165
    for e in index:
        got = bucket_ids(e["method"], e["ratio"], e["height"], e["width"], e["skip"])
        ref = tables[e["key"]]
        assert got.shape == ref.shape, e["key"]
        assert np.array_equal(got, ref), f"{e['key']}: {int((got != ref).sum())} entries differ"
        assert num_buckets(e["method"], e["ratio"], e["skip"]) == e["num_buckets"], e["key"]


def test_piecewise_is_exact_inside_alpha_and_clipped_at_beta():
    coef = PiecewiseCoefficients.from_ratio(1.9)
    x = np.array([-1, 0, 1, 2, 5, 100, -100], dtype=np.float32)
    out = piecewise_index(x, coef)
    assert out[:4].tolist() == [-1, 0, 1, 2]
    assert out[5] == int(coef.beta) and out[6] == -int(coef.beta)


def test_skip_tokens_get_the_extra_bucket_and_tables_are_read_only():
    t = bucket_ids("product", 1.9, 3, 5, skip=2)
    assert t.shape == (17, 17)
    extra = num_buckets("product", 1.9, 2) - 1
    assert (t[:2] == extra).all() and (t[:, :2] == extra).all() and (t[2:, 2:] < extra).all()
    with pytest.raises(ValueError):
        t[0, 0] = 1


def test_unknown_method_is_refused():
    with pytest.raises(ValueError, match="unknown bucket method"):
        bucket_ids("polar", 1.9, 4, 4)


def test_defaults_mean_no_skip_token():
    """Found by scripts/mutate.py: the skip=0 defaults were never exercised."""
    assert num_buckets("product", 1.9) == 49 and num_buckets("euc", 2.0) == 9
    assert bucket_ids("euc", 2.0, 3, 4).shape == (12, 12)


def test_cross_sums_a_rows_and_a_cols_table_and_others_one():
    """Found by scripts/mutate.py: which tables a method sums was only checked through whole models."""
    from irpe.models.buckets import table_methods

    assert table_methods("cross") == ("cross_rows", "cross_cols")
    assert [table_methods(m) for m in ("euc", "quant", "product")] == [("euc",), ("quant",), ("product",)]
    with pytest.raises(ValueError, match="unknown rpe_method 'cross_rows'"):
        table_methods("cross_rows")
