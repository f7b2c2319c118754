"""The efficient contextual path (Eq. 27-28) equals a naive O(n^2 d) evaluation of Eq. (15)-(17)."""

import torch

from irpe.models.rpe import RelativePosition


def _random(module: RelativePosition) -> RelativePosition:
    for p in module.parameters():
        torch.nn.init.normal_(p)
    return module


def test_contextual_key_side_matches_naive():
    torch.manual_seed(0)
    m = _random(RelativePosition("product", "ctx", 1.9, heads=3, head_dim=8, grid=(4, 5), skip=1,
                                 transposed=True))
    q = torch.randn(2, 3, 21, 8)
    got = m(q)
    table = m.bucket
    naive = torch.empty(2, 3, 21, 21)
    for i in range(21):
        for j in range(21):
            r = m.lookup_table_weight[:, :, table[i, j]]  # (heads, d): r_ij
            naive[:, :, i, j] = (q[:, :, i, :] * r).sum(-1)
    torch.testing.assert_close(got, naive, atol=1e-5, rtol=1e-5)


def test_contextual_value_side_matches_naive():
    torch.manual_seed(1)
    m = _random(RelativePosition("euc", "ctx", 1.9, heads=1, head_dim=6, grid=(3, 3), skip=2,
                                 transposed=False))
    attn = torch.rand(2, 4, 11, 11).softmax(-1)
    got = m(attn)
    table = m.bucket
    naive = torch.zeros(2, 4, 11, 6)
    for i in range(11):
        for j in range(11):
            naive[:, :, i] += attn[:, :, i, j, None] * m.lookup_table_weight[0, table[i, j]]
    torch.testing.assert_close(got, naive, atol=1e-5, rtol=1e-5)


def test_bias_mode_broadcasts_per_head_scalar():
    m = _random(RelativePosition("quant", "bias", 1.9, heads=2, head_dim=4, grid=(2, 2), skip=1,
                                 transposed=True))
    out = m(torch.randn(3, 2, 5, 4))
    assert out.shape == (1, 2, 5, 5)
    assert out[0, 1, 2, 3] == m.lookup_table_bias[1, m.bucket[2, 3]]
