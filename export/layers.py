"""DeiT layers emitted as ONNX nodes straight from a state dict (q scale folded into the weights)."""

from __future__ import annotations

import numpy as np

from . import rpe_graph, rpe_value
from .emit import Emit


def linear(emit: Emit, x: str, key: str, scale: np.ndarray | float = 1.0, input_shift: np.ndarray | None = None) -> str:
    """(x + input_shift) @ W.T + b for the nn.Linear ``key``, output columns scaled by ``scale`` (the shift and
    the scale folded into W and b).

    On the 2-D token matrix ONNX Runtime fuses MatMul + Add into one Gemm.
    """
    w = emit.weights[f"{key}.weight"]
    y = emit.builder.op("MatMul", [x, emit.builder.weight(w.T * scale, f"{key}.weight")], f"{key}/matmul")
    bias = emit.weights.get(f"{key}.bias")
    if input_shift is not None:
        bias = (0.0 if bias is None else bias) + w.astype(np.float64) @ input_shift
    if bias is None:
        return y
    return emit.builder.op("Add", [y, emit.builder.weight(bias * scale, f"{key}.bias")], f"{key}/bias")


def layer_norm(emit: Emit, x: str, key: str) -> str:
    """LayerNormalization (opset 17) over the last axis."""
    scale = emit.builder.weight(emit.weights[f"{key}.weight"], f"{key}.weight")
    shift = emit.builder.weight(emit.weights[f"{key}.bias"], f"{key}.bias")
    epsilon = float(emit.cfg.layer_norm_eps)
    return emit.builder.op("LayerNormalization", [x, scale, shift], key, axis=-1, epsilon=epsilon)


def gelu(emit: Emit, x: str, name: str) -> str:
    """Exact (erf) GELU: the Gelu op from opset 20, else x * 0.5 * (1 + erf(x / sqrt 2)) in the exact
    node pattern ONNX Runtime fuses with the preceding bias Add into one BiasGelu (Mul by 1/sqrt 2 is
    not matched; measured 45 -> 12 ms per DeiT-S batch-8 run)."""
    if emit.opset >= 20:
        return emit.builder.op("Gelu", [x], name)
    g = emit.builder
    half, one, sqrt2 = (g.shared_initializer(np.array(v, dtype=g.dtype), n)
                        for v, n in ((0.5, "half"), (1.0, "one"), (2 ** 0.5, "sqrt2")))
    erf = g.op("Erf", [g.op("Div", [x, sqrt2], f"{name}/div")], f"{name}/erf")
    return g.op("Mul", [g.op("Mul", [x, g.op("Add", [erf, one], f"{name}/add")], f"{name}/mul"), half], name)


def embed(emit: Emit, images: str) -> str:
    """Patch embedding, prefix tokens (expanded to the dynamic batch) and position embedding."""
    g, dim = emit.builder, emit.cfg.embed_dim
    conv = g.op("Conv", [images, g.weight(emit.weights["patch_embed.proj.weight"], "patch_embed.proj.weight"),
                         g.weight(emit.weights["patch_embed.proj.bias"], "patch_embed.proj.bias")],
                "patch_embed", kernel_shape=[emit.cfg.patch_size] * 2, strides=[emit.cfg.patch_size] * 2)
    patches = g.op("Transpose", [g.op("Reshape", [conv, g.ints([0, dim, -1])], "patch_embed/flatten")],
                   "patch_embed/tokens", perm=[0, 2, 1])
    prefix = [emit.weights["cls_token"]] + ([emit.weights["dist_token"]] if emit.cfg.distilled else [])
    emit.batch = g.op("Shape", [images], "batch", start=0, end=1)
    shape = g.op("Concat", [emit.batch, g.ints([len(prefix), dim])], "prefix_shape", axis=0)
    tokens = g.op("Expand", [g.weight(np.concatenate(prefix, axis=1), "prefix_tokens"), shape], "prefix")
    x = g.op("Concat", [tokens, patches], "tokens", axis=1)
    x = g.op("Add", [x, g.weight(emit.weights["pos_embed"], "pos_embed")], "embed")
    return g.op("Reshape", [x, g.ints([-1, dim])], "tokens_2d")  # (N * n, D): bias Adds fuse into Gemm


def qkv_heads(emit: Emit, x: str, key: str) -> tuple[str, str, str, str]:
    """q (N, H, n, d) pre-scaled, k^T (N, H, d, n) and v (N, H, n, d) from one fused qkv Gemm, and k still in
    token layout (N, n, H, d)."""
    dim, heads, g = emit.cfg.embed_dim, emit.cfg.num_heads, emit.builder
    scale = np.ones(3 * dim, dtype=np.float32)
    scale[:dim] = (dim // heads) ** -0.5
    y = linear(emit, x, key, scale)
    parts = g.op("Split", [y, g.ints([dim] * 3)], f"{key}/split", axis=1, outputs=3)
    out, tokens = [], []
    for part, perm in zip(parts, ([0, 2, 1, 3], [0, 2, 3, 1], [0, 2, 1, 3]), strict=True):
        tokens.append(g.op("Reshape", [part, g.ints([-1, emit.tokens, heads, dim // heads])], f"{key}/heads"))
        out.append(g.op("Transpose", [tokens[-1]], f"{key}/perm", perm=perm))
    return out[0], out[1], out[2], tokens[1]


def attention(emit: Emit, x: str, i: int) -> str:
    """Multi-head self-attention with the layer's iRPE terms (q scale folded into the qkv weights)."""
    key, g = f"blocks.{i}.attn", emit.builder
    tables = emit.tables.get(i, {})
    q, kt, v, k_tokens = qkv_heads(emit, x, f"{key}.qkv")
    attn = g.op("MatMul", [q, kt], f"{key}/scores")
    attn = rpe_graph.add_score_terms(emit, attn, q, k_tokens, tables, key)
    attn = g.op("Softmax", [attn], f"{key}/softmax", axis=-1)
    out = g.op("MatMul", [attn, v], f"{key}/context")
    out, shift = rpe_value.merged_context(emit, out, attn, tables.get("v", []), key)
    return linear(emit, out, f"{key}.proj", input_shift=shift)


def block(emit: Emit, x: str, i: int) -> str:
    """Pre-norm transformer block."""
    key = f"blocks.{i}"
    x = emit.builder.op("Add", [x, attention(emit, layer_norm(emit, x, f"{key}.norm1"), i)], f"{key}/res1")
    h = gelu(emit, linear(emit, layer_norm(emit, x, f"{key}.norm2"), f"{key}.mlp.fc1"), f"{key}.mlp.gelu")
    return emit.builder.op("Add", [x, linear(emit, h, f"{key}.mlp.fc2")], f"{key}/res2")


def classify(emit: Emit, x: str) -> str:
    """Final norm on the prefix token(s) and the classifier head(s); distilled: mean of both heads."""
    g = emit.builder
    x = g.op("Reshape", [x, g.ints([-1, emit.tokens, emit.cfg.embed_dim])], "tokens_3d")
    cls = layer_norm(emit, g.op("Gather", [x, g.ints([0])], "cls", axis=1), "norm")
    logits = linear(emit, cls, "head")
    if emit.cfg.distilled:
        dist = layer_norm(emit, g.op("Gather", [x, g.ints([1])], "dist", axis=1), "norm")
        both = g.op("Add", [logits, linear(emit, dist, "head_dist")], "heads_sum")
        logits = g.op("Mul", [both, g.weight(np.array(0.5), "half")], "heads_mean")
    return g.op("Reshape", [logits, g.ints([0, emit.cfg.num_classes])], "logits_2d")
