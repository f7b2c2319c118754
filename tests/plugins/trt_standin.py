"""A minimal pure-Python stand-in for the compiled ``tensorrt`` module (libnvinfer + pybind11 bindings).

NVIDIA's real ``tensorrt/plugin/`` package (from the tensorrt-cu12-bindings wheel) is placed under it as
``tensorrt.plugin``, unchanged. Only what that package and the irpe plugins touch is here, modelled on
NVIDIA's bindings (github NVIDIA/TensorRT python/src/infer/pyPlugin.cpp): ``PluginField.data`` returns a
1-D array of ``length`` elements of the field's type (pyPlugin.cpp, the "data" property), get_kernel's
result must cast to ``(str, bytes)``, launch parameters and extra arguments are ISymExpr over IDimensionExpr.

Dimension expressions are symbolic trees (:class:`DimExpr`) that :meth:`DimExpr.evaluate` resolves for
concrete shapes, so a harness can check the grid and scalar arguments a plugin declares.
"""

from __future__ import annotations

import builtins
import enum
import math
from typing import Any

import numpy as np

__version__ = "0.0.0"  # the harness overwrites it with the wheel's version


class Logger:
    INTERNAL_ERROR, ERROR, WARNING, INFO, VERBOSE = range(5)
    Severity = int

    def __init__(self, min_severity: int = 2) -> None:
        self.min_severity = min_severity
        self.messages: list[tuple[int, str]] = []

    def log(self, severity: int, msg: str) -> None:
        self.messages.append((severity, msg))


class DataType(enum.IntEnum):
    FLOAT = 0
    HALF = 1
    INT8 = 2
    INT32 = 3
    BOOL = 4
    UINT8 = 5
    FP8 = 6
    BF16 = 7
    INT64 = 8
    INT4 = 9
    FP4 = 10


float32, float16, int8, int32, bool, uint8, bfloat16, int64 = (  # noqa: A001 - the real module's names
    DataType.FLOAT, DataType.HALF, DataType.INT8, DataType.INT32, DataType.BOOL, DataType.UINT8, DataType.BF16,
    DataType.INT64)
_NP = {DataType.FLOAT: np.float32, DataType.HALF: np.float16, DataType.INT8: np.int8, DataType.INT32: np.int32,
       DataType.BOOL: np.bool_, DataType.UINT8: np.uint8, DataType.INT64: np.int64}


def nptype(dtype: DataType) -> type:
    return _NP[dtype]


class TensorFormat(enum.IntEnum):
    LINEAR = 0
    CHW2 = 1
    HWC8 = 2
    CHW4 = 3
    CHW16 = 4
    CHW32 = 5
    DHWC8 = 6
    CDHW32 = 7
    HWC = 8
    DLA_LINEAR = 9
    DLA_HWC4 = 10
    HWC16 = 11
    DHWC = 12


class TensorRTPhase(enum.IntEnum):
    BUILD = 0
    RUNTIME = 1


class QuickPluginCreationRequest(enum.IntEnum):
    UNKNOWN = 0
    PREFER_JIT = 1
    PREFER_AOT = 2
    STRICT_JIT = 3
    STRICT_AOT = 4


class NetworkDefinitionCreationFlag(enum.IntEnum):
    STRONGLY_TYPED = 1
    PREFER_JIT_PYTHON_PLUGINS = 2
    PREFER_AOT_PYTHON_PLUGINS = 3


class PluginFieldType(enum.IntEnum):
    FLOAT16 = 0
    FLOAT32 = 1
    FLOAT64 = 2
    INT8 = 3
    INT16 = 4
    INT32 = 5
    CHAR = 6
    DIMS = 7
    UNKNOWN = 8
    BF16 = 9
    INT64 = 10
    FP8 = 11
    INT4 = 12
    FP4 = 13


_FIELD_NP = {PluginFieldType.INT32: np.int32, PluginFieldType.UNKNOWN: np.int8, PluginFieldType.INT8: np.int8,
             PluginFieldType.INT16: np.int16, PluginFieldType.FLOAT32: np.float32,
             PluginFieldType.FLOAT64: np.float64, PluginFieldType.INT64: np.int64, PluginFieldType.CHAR: np.int8}


class PluginArgType(enum.IntEnum):
    INT = 0


class PluginArgDataType(enum.IntEnum):
    INT8 = 0
    INT16 = 1
    INT32 = 2


class PluginField:
    """Name, a buffer and its element type; ``length`` counts elements (pyPlugin.cpp plugin_field_constructor)."""

    def __init__(self, name: str, data: Any = b"", type: PluginFieldType = PluginFieldType.UNKNOWN) -> None:  # noqa: A002
        self.name = name
        self.type = PluginFieldType(type)
        view = memoryview(data)
        self._bytes = view.tobytes()
        self.length = view.nbytes // view.itemsize if view.itemsize else 0

    @property
    def data(self) -> np.ndarray:
        if self.type not in _FIELD_NP:
            raise TypeError(f"PluginField.data: no NumPy view for {self.type!r}")
        arr = np.frombuffer(self._bytes, dtype=_FIELD_NP[self.type])
        if arr.size != self.length:
            raise ValueError(f"field {self.name}: {len(self._bytes)} bytes do not hold {self.length} x {self.type!r}")
        return arr.copy()


class PluginFieldCollection(list):
    def __init__(self, fields: Any = ()) -> None:
        super().__init__(fields)
        for f in self:
            if not isinstance(f, PluginField):
                raise TypeError(f"PluginFieldCollection holds PluginField, got {type(f)}")

    @property
    def nbFields(self) -> int:  # noqa: N802 - NVIDIA's name
        return len(self)


class Dims(list):
    MAX_DIMS = 8

    def __init__(self, shape: Any = ()) -> None:
        super().__init__([0] * shape if isinstance(shape, int) else [int(d) for d in shape])


class DimensionOperation(enum.IntEnum):
    SUM = 0
    PROD = 1
    MAX = 2
    MIN = 3
    SUB = 4
    EQUAL = 5
    LESS = 6
    FLOOR_DIV = 7
    CEIL_DIV = 8


_OPS = {DimensionOperation.SUM: lambda a, b: a + b, DimensionOperation.PROD: lambda a, b: a * b,
        DimensionOperation.MAX: max, DimensionOperation.MIN: min, DimensionOperation.SUB: lambda a, b: a - b,
        DimensionOperation.EQUAL: lambda a, b: int(a == b), DimensionOperation.LESS: lambda a, b: int(a < b),
        DimensionOperation.FLOOR_DIV: lambda a, b: a // b, DimensionOperation.CEIL_DIV: lambda a, b: -(-a // b)}


class IDimensionExpr:
    """Base class, as in the bindings; :class:`DimExpr` is the concrete symbolic form."""


class DimExpr(IDimensionExpr):
    """A constant, a named symbol (an input dimension) or ``op(a, b)``."""

    def __init__(self, value: int | None = None, symbol: str | None = None, op: DimensionOperation | None = None,
                 args: tuple[DimExpr, DimExpr] | None = None) -> None:
        self.value, self.symbol, self.op, self.args = value, symbol, op, args

    def is_constant(self) -> bool:
        return self.value is not None

    def get_constant_value(self) -> int:
        if self.value is None:
            raise ValueError(f"{self} is not a build-time constant")
        return self.value

    def evaluate(self, bindings: dict[str, int]) -> int:
        if self.value is not None:
            return self.value
        if self.symbol is not None:
            return bindings[self.symbol]
        a, b = self.args
        return _OPS[self.op](a.evaluate(bindings), b.evaluate(bindings))

    def __repr__(self) -> str:
        if self.value is not None:
            return str(self.value)
        if self.symbol is not None:
            return self.symbol
        return f"{self.op.name}({self.args[0]!r}, {self.args[1]!r})"


class IExprBuilder:
    def constant(self, value: int) -> DimExpr:
        if not isinstance(value, (int, np.integer)) or isinstance(value, (builtins.bool, np.bool_)):
            raise TypeError(f"IExprBuilder.constant takes an int, got {type(value)}")
        return DimExpr(value=int(value))

    def operation(self, op: DimensionOperation, first: Any, second: Any) -> DimExpr:
        for e in (first, second):
            if not isinstance(e, IDimensionExpr):
                raise TypeError(f"IExprBuilder.operation({op!r}): operand {e!r} is not an IDimensionExpr")
        op = DimensionOperation(op)
        if first.is_constant() and second.is_constant():
            return DimExpr(value=_OPS[op](first.value, second.value))
        return DimExpr(op=op, args=(first, second))

    def declare_size_tensor(self, output_index: int, opt: Any, upper: Any) -> DimExpr:
        return DimExpr(symbol=f"size_tensor{output_index}")


class DimsExprs(list):
    def __init__(self, n: int | list = 0) -> None:
        super().__init__([None] * n if isinstance(n, int) else n)


class PluginTensorDesc:
    def __init__(self) -> None:
        self.dims = Dims()
        self.type = DataType.FLOAT
        self.format = TensorFormat.LINEAR
        self.scale = 1.0


class DynamicPluginTensorDesc:
    def __init__(self, desc: PluginTensorDesc | None = None, min: Any = (), max: Any = (), opt: Any = ()) -> None:  # noqa: A002
        self.desc = desc or PluginTensorDesc()
        self.min, self.max, self.opt = Dims(min), Dims(max), Dims(opt)


class ITensor:
    pass


class ISymExpr:
    def __init__(self) -> None:
        self.type = None
        self.dtype = None
        self.expr = None


class ISymExprs(list):
    """The extra-argument slots TensorRT hands to get_launch_params (set nbSymExprs, then each slot)."""

    @property
    def nbSymExprs(self) -> int:  # noqa: N802
        return len(self)

    @nbSymExprs.setter
    def nbSymExprs(self, n: int) -> None:  # noqa: N802
        self[:] = [None] * n

    def __setitem__(self, i: Any, value: Any) -> None:
        if isinstance(i, int) and not isinstance(value, ISymExpr):
            raise TypeError(f"extra argument {i} must be an ISymExpr, got {type(value)}")
        super().__setitem__(i, value)


class KernelLaunchParams:
    """IKernelLaunchParams: every field is an ISymExpr (include/impl/NvInferPythonPlugin.h: setGridX(ISymExpr*))."""

    _FIELDS = ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "shared_mem")

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in self._FIELDS:
            raise AttributeError(name)
        if not isinstance(value, ISymExpr) or not isinstance(value.expr, IDimensionExpr):
            raise TypeError(f"KernelLaunchParams.{name} takes an ISymExpr over an IDimensionExpr, got {value!r}")
        object.__setattr__(self, name, value)


class _Interface:
    def __init__(self) -> None:
        pass


class IPluginCreatorV3Quick(_Interface):
    pass


class IPluginV3(_Interface):
    pass


class IPluginV3QuickCore(_Interface):
    pass


class IPluginV3QuickBuild(_Interface):
    pass


class IPluginV3QuickRuntime(_Interface):
    pass


class IPluginV3QuickAOTBuild(_Interface):
    pass


class _Registry:
    """getPluginRegistry(): creators keyed by (name, version, namespace)."""

    def __init__(self) -> None:
        self.creators: dict[tuple[str, str, str], Any] = {}

    def register_creator(self, creator: Any, namespace: str = "") -> bool:
        key = (creator.name, creator.plugin_version, namespace)
        if key in self.creators:
            return False
        self.creators[key] = creator
        return True

    def get_creator(self, name: str, version: str, namespace: str = "") -> Any:
        return self.creators.get((name, version, namespace))

    @property
    def all_creators(self) -> list[Any]:
        return list(self.creators.values())


_REGISTRY = _Registry()


def get_plugin_registry() -> _Registry:
    return _REGISTRY


def volume(shape: Any) -> int:
    return math.prod(shape)
