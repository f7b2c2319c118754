"""Build the ONNX graph of an iRPE DeiT from its weights (no tracing) and check it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto
from torch import nn

from . import layers, rpe_graph
from .emit import Emit
from .graph import GraphBuilder, tensor_input

INPUT_NAME = "images"
OUTPUT_NAME = "logits"
MIN_OPSET = 17


def build_onnx(model: nn.Module, *, opset: int = 17, rpe_plugin: bool = False, fp16: bool = False) -> onnx.ModelProto:
    """The ModelProto of ``model`` (a :class:`irpe.models.VisionTransformer`), not yet checked. The standard
    graph suits TensorRT's ONNX parser as it is (no node it rejects: see rpe_graph)."""
    if opset < MIN_OPSET:
        raise ValueError(f"--opset {opset} is too old: LayerNormalization needs opset >= {MIN_OPSET}")
    cfg = model.cfg
    weights = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    g = GraphBuilder(np.float16 if fp16 else np.float32)
    emit = Emit(builder=g, weights=weights, cfg=cfg, opset=opset, plugin=rpe_plugin,
             tables=rpe_graph.collect_tables(model))
    x = INPUT_NAME
    if fp16:
        x = g.op("Cast", [x], "images_fp16", to=TensorProto.FLOAT16)
    x = layers.embed(emit, x)
    for i in range(cfg.depth):
        x = layers.block(emit, x, i)
    logits = layers.classify(emit, x)
    if fp16:
        g.nodes.append(onnx.helper.make_node("Cast", [logits], [OUTPUT_NAME], name="logits_fp32", to=TensorProto.FLOAT))
    else:
        g.nodes.append(onnx.helper.make_node("Identity", [logits], [OUTPUT_NAME], name="logits"))
    size = cfg.img_size
    inputs = [tensor_input(INPUT_NAME, ["batch", cfg.in_chans, size, size])]
    outputs = [tensor_input(OUTPUT_NAME, ["batch", cfg.num_classes])]
    return g.build(inputs, outputs, graph_name="irpe_deit", opset=opset)


def check_onnx(proto: onnx.ModelProto, path: Path | None = None) -> None:
    """onnx.checker (full check) and strict shape inference; plugin graphs get the non-strict pass."""
    custom = any(o.domain not in ("", "ai.onnx") for o in proto.opset_import)
    target = str(path) if path is not None and proto.ByteSize() > 2**31 - 2**20 else proto
    onnx.checker.check_model(target, full_check=not custom)
    if not custom:
        onnx.shape_inference.infer_shapes(proto, check_type=True, strict_mode=True, data_prop=True)


def onnx_from_model(model: nn.Module, path: str | Path, *, opset: int = 17, rpe_plugin: bool = False,
                    fp16: bool = False) -> Path:
    """Write ``model`` (eval mode, any batch) to ``path`` as ONNX: input ``images``, output ``logits``."""
    path = Path(path)
    proto = build_onnx(model, opset=opset, rpe_plugin=rpe_plugin, fp16=fp16)
    check_onnx(proto, path)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(proto, str(path))
    return path
