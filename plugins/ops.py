"""The two iRPE custom ops, torch-free: names, NumPy references and ONNX node builders.

``RPEIndex(lut[B,H,Lq,K], index:int32[Lq,Lk]) -> out[B,H,Lq,Lk]``,
``out[b,h,i,j] = lut[b,h,i,index[i,j]]`` (contextual iRPE on q or k, Eq. 27).

``RPEBucketSum(attn[B,H,Lq,Lk], index:int32[Lq,Lk]; num_buckets=K) -> out[B,H,Lq,K]``,
``out[b,h,i,k] = sum_j [index[i,j] == k] * attn[b,h,i,j]`` (contextual iRPE on v).

How TensorRT binds these nodes (NVIDIA TensorRT OSS, samples/python/quickly_deployable_plugins/README.md,
sections "ONNX model with a plugin" and "ONNX model with an AOT plugin"): the node's ``op_type`` must equal
the plugin name, the node must carry a string attribute ``plugin_namespace`` naming the plugin's namespace,
and, to select the ahead-of-time implementation, a bool attribute ``aot`` set to True (on top of the other
two). The onnx-tensorrt fallback plugin importer also reads a string ``plugin_version`` (default "1") and,
when ``plugin_namespace`` is absent, falls back to the node's domain; QDP creators always register
version "1" (tensorrt/plugin/_lib.py: ``self.plugin_version = "1"``). We set all three explicitly.
"""

from __future__ import annotations

from typing import Any

import numpy as np

DOMAIN = "irpe"
PLUGIN_NAMESPACE = "irpe"
PLUGIN_VERSION = "1"
RPE_INDEX_OP = "RPEIndex"
BUCKET_SUM_OP = "RPEBucketSum"
OPSET_VERSION = 1


def plugin_id(op: str) -> str:
    """The ``namespace::name`` id that ``tensorrt.plugin.register`` uses for ``op``."""
    return f"{PLUGIN_NAMESPACE}::{op}"


def _check_index(index: np.ndarray, lq: int, lk: int | None = None) -> None:
    if index.ndim != 2 or index.shape[0] != lq or (lk is not None and index.shape[1] != lk):
        raise ValueError(f"index must be [Lq={lq}, Lk{'' if lk is None else '=' + str(lk)}], "
                         f"got shape {tuple(index.shape)}")


def rpe_index_ref(lut: np.ndarray, index: np.ndarray) -> np.ndarray:
    """Reference RPEIndex: ``out[b,h,i,j] = lut[b,h,i,index[i,j]]`` (same dtype as ``lut``)."""
    lut = np.asarray(lut)
    index = np.asarray(index)
    if lut.ndim != 4:
        raise ValueError(f"lut must be [B, H, Lq, K], got shape {tuple(lut.shape)}")
    _check_index(index, lut.shape[2])
    rows = np.arange(index.shape[0])[:, None]
    return lut[:, :, rows, index.astype(np.int64)]


def bucket_sum_ref(attn: np.ndarray, index: np.ndarray, num_buckets: int) -> np.ndarray:
    """Reference RPEBucketSum; accumulates in float64 and returns ``attn``'s dtype."""
    attn = np.asarray(attn)
    index = np.asarray(index).astype(np.int64)
    if attn.ndim != 4:
        raise ValueError(f"attn must be [B, H, Lq, Lk], got shape {tuple(attn.shape)}")
    _check_index(index, attn.shape[2], attn.shape[3])
    b, h, lq, lk = attn.shape
    rows = np.arange(b * h * lq, dtype=np.int64).reshape(b * h, lq, 1) * num_buckets
    ids = (rows + index[None]).ravel()  # flat output slot of every attention weight
    sums = np.bincount(ids, weights=attn.astype(np.float64).ravel(), minlength=b * h * lq * num_buckets)
    out = sums.reshape(b, h, lq, num_buckets)
    return out.astype(attn.dtype)


def _plugin_attrs(aot: bool) -> dict[str, Any]:
    return {"plugin_namespace": PLUGIN_NAMESPACE, "plugin_version": PLUGIN_VERSION, "aot": bool(aot)}


def make_rpe_index_node(lut_name: str, index_name: str, out_name: str, node_name: str, *,
                        aot: bool = True) -> Any:
    """An ``irpe::RPEIndex`` NodeProto with the attributes TensorRT's ONNX parser needs (see module doc)."""
    from onnx import helper

    return helper.make_node(RPE_INDEX_OP, [lut_name, index_name], [out_name], name=node_name,
                            domain=DOMAIN, **_plugin_attrs(aot))


def make_bucket_sum_node(attn_name: str, index_name: str, out_name: str, node_name: str, *,
                         num_buckets: int, aot: bool = True) -> Any:
    """An ``irpe::RPEBucketSum`` NodeProto (int attribute ``num_buckets`` plus the plugin attributes)."""
    from onnx import helper

    if num_buckets <= 0:
        raise ValueError(f"num_buckets must be positive, got {num_buckets}")
    return helper.make_node(BUCKET_SUM_OP, [attn_name, index_name], [out_name], name=node_name,
                            domain=DOMAIN, num_buckets=int(num_buckets), **_plugin_attrs(aot))


def plugin_opset_import() -> Any:
    """The ``OperatorSetIdProto`` to add to a model that uses these nodes (domain ``irpe``, version 1)."""
    from onnx import helper

    return helper.make_opsetid(DOMAIN, OPSET_VERSION)
