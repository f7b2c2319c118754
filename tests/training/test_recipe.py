import torch

from irpe.models import create_model
from irpe.training.recipe import WarmupCosine, build_optimizer, param_groups, scaled_lr

from .conftest import MICRO


def test_no_weight_decay_on_rpe_tables_norms_biases_tokens_and_pos_embed():
    model = create_model(MICRO, rpe_on="qkv")
    decay, plain = param_groups(model, 0.05)
    names = {id(p): n for n, p in model.named_parameters()}
    plain_names = {names[id(p)] for p in plain["params"]}
    decay_names = {names[id(p)] for p in decay["params"]}
    assert decay["weight_decay"] == 0.05 and plain["weight_decay"] == 0.0
    assert {"cls_token", "pos_embed", "blocks.0.attn.rpe_v.lookup_table_weight",
            "blocks.0.attn.rpe_k.lookup_table_weight", "blocks.0.norm1.weight", "head.bias"} <= plain_names
    assert {"blocks.0.attn.qkv.weight", "head.weight", "patch_embed.proj.weight"} <= decay_names
    assert not any("lookup_table" in n or n.endswith(".bias") for n in decay_names)
    assert len(plain_names) + len(decay_names) == len(list(model.parameters()))


def test_linear_lr_scaling_from_1e3_at_batch_1024():
    assert scaled_lr(1e-3, 1024) == 1e-3
    assert abs(scaled_lr(1e-3, 128, world_size=4) - 5e-4) < 1e-12


def test_warmup_then_cosine_to_min_lr_and_state_round_trip():
    model = torch.nn.Linear(2, 2)
    opt = build_optimizer(model, 1e-3)
    sched = WarmupCosine(opt, 1e-3, total_steps=100, warmup_steps=10, min_lr=1e-5, warmup_lr=1e-6)
    lrs = [sched.get_last_lr()[0]]
    for _ in range(100):
        sched.step()
        lrs.append(sched.get_last_lr()[0])
    assert lrs[0] == 1e-6 and abs(lrs[10] - 1e-3) < 1e-12 and abs(lrs[100] - 1e-5) < 1e-12
    assert all(a <= b for a, b in zip(lrs[:10], lrs[1:11], strict=True))
    assert all(a >= b for a, b in zip(lrs[10:-1], lrs[11:], strict=True))
    other = WarmupCosine(build_optimizer(model, 1e-3), 1e-3, 100, 10)
    state = sched.state_dict()
    assert all(isinstance(v, (int, float)) for v in state.values())
    other.load_state_dict(state)
    assert other.get_last_lr() == sched.get_last_lr()
