"""A small ONNX graph builder: named initializers, nodes with unique names, cached shape constants."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


class GraphBuilder:
    """Collects nodes and initializers; :meth:`build` returns the ModelProto.

    ``dtype`` is the compute dtype of float initializers (float32, or float16 for --fp16 graphs).
    """

    def __init__(self, dtype: type = np.float32) -> None:
        self.dtype = np.dtype(dtype)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._used: Counter[str] = Counter()
        self._ints: dict[tuple[str, tuple[int, ...]], str] = {}
        self.domains: dict[str, int] = {}
        self._shared: dict[tuple[str, str, tuple[int, ...], bytes], str] = {}
        self.onnx_dtype = helper.np_dtype_to_tensor_dtype(self.dtype)

    def unique(self, prefix: str) -> str:
        """A fresh value/node name starting with ``prefix``."""
        self._used[prefix] += 1
        count = self._used[prefix]
        return prefix if count == 1 else f"{prefix}_{count - 1}"

    def weight(self, array: np.ndarray, name: str) -> str:
        """A float initializer in the graph's compute dtype."""
        return self.initializer(np.asarray(array, dtype=self.dtype), name)

    def initializer(self, array: np.ndarray, name: str) -> str:
        """An initializer holding ``array`` as is (any dtype)."""
        name = self.unique(name)
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def shared_initializer(self, array: np.ndarray, name: str) -> str:
        """An initializer reused by every caller passing equal contents (e.g. bucket tables per layer)."""
        array = np.ascontiguousarray(array)
        key = (name, array.dtype.str, array.shape, hashlib.sha1(array.tobytes()).digest())
        if key not in self._shared:
            self._shared[key] = self.initializer(array, name)
        return self._shared[key]

    def ints(self, values: Sequence[int], dtype: str = "int64") -> str:
        """A cached 1-D integer constant (shapes, axes, indices)."""
        key = (dtype, tuple(int(v) for v in values))
        if key not in self._ints:
            label = "_".join(str(v).replace("-", "m") for v in key[1])[:40]
            self._ints[key] = self.initializer(np.asarray(key[1], dtype=dtype), f"const_{dtype}_{label}")
        return self._ints[key]

    def op(self, op_type: str, inputs: Sequence[str], name: str | None = None, *, domain: str = "",
           outputs: int = 1, **attrs: Any) -> Any:
        """Append a node; returns its output name (or the list of names when ``outputs`` > 1)."""
        base = self.unique(name or op_type.lower())
        outs = [base] if outputs == 1 else [f"{base}:{i}" for i in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=base, domain=domain, **attrs))
        return outs[0] if outputs == 1 else outs

    def add_node(self, node: onnx.NodeProto, domain_version: tuple[str, int] | None = None) -> None:
        """Append a prebuilt node (e.g. a plugin node) and record its domain."""
        self.nodes.append(node)
        if domain_version is not None:
            self.domains[domain_version[0]] = domain_version[1]

    def build(self, inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto], *,
              graph_name: str, opset: int) -> onnx.ModelProto:
        """The ModelProto (IR version chosen for the opset, as onnx's helper does)."""
        graph = helper.make_graph(self.nodes, graph_name, inputs, outputs, self.initializers)
        imports = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in self.domains.items()]
        ir = helper.find_min_ir_version_for(imports, ignore_unknown=True)
        return helper.make_model(graph, opset_imports=imports, producer_name="irpe-deploy", ir_version=ir)


def tensor_input(name: str, shape: Sequence[int | str]) -> onnx.ValueInfoProto:
    """A float32 graph input/output with symbolic dims given as strings."""
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))
