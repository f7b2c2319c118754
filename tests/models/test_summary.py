from irpe.models import create_model, get_config
from irpe.models.summary import count_macs, count_params

PAPER = {  # name: (params M, MACs M) from the paper
    "deit_tiny_patch16_224_ctx_product_50_shared_k": (5.76, 1284),
    "deit_small_patch16_224_ctx_product_50_shared_k": (22.09, 4659),
    "deit_small_patch16_224_ctx_product_50_shared_qkv": (22.17, 4885),
    "deit_base_patch16_224_ctx_product_50_shared_k": (86.61, 17684),
}


def test_param_count_formula_equals_the_built_module():
    for name in ["deit_small_patch16_224_ctx_cross_56_shared_k", "deit_tiny_distilled_patch16_224",
                 "deit_micro_patch4_32_ctx_product_shared_k"]:
        model = create_model(name)
        assert count_params(get_config(name)) == sum(p.numel() for p in model.parameters()), name


def test_params_match_paper_and_rpe_macs_overhead_matches_paper():
    plain = count_macs(get_config("deit_small_patch16_224"))
    for name, (params, macs) in PAPER.items():
        cfg = get_config(name)
        assert round(count_params(cfg) / 1e6, 2) == params, name
        assert abs(count_macs(cfg) / 1e6 - macs) / macs < 0.02, name
    k = count_macs(get_config("deit_small_patch16_224_ctx_product_50_shared_k")) - plain
    qkv = count_macs(get_config("deit_small_patch16_224_ctx_product_50_shared_qkv")) - plain
    assert abs(k / 1e6 - 46) < 2 and abs(qkv / 1e6 - 272) < 5  # paper: +46M (K), +272M (QKV) over 4613M
