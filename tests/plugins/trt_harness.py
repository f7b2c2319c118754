"""NVIDIA's real ``tensorrt.plugin`` package over :mod:`trt_standin`, and the calls TensorRT makes into it.

:func:`plugin_package` downloads the tensorrt-cu12-bindings wheel of a version (``pip download --no-deps``,
cached in ``$IRPE_TRT_WHEELS`` or ``~/.cache/irpe/trt-wheels``), and lays out ``tensorrt/__init__.py`` (the
stand-in) with the wheel's ``tensorrt_bindings/plugin/`` unchanged beneath it. :func:`plugin_from_onnx_node`
does what onnx-tensorrt's FallbackPluginImporter does with an ONNX node; :func:`build_and_launch` walks the
builder's calls (output types and shapes, formats, configure, tactics, launch parameters, get_kernel).
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# oldest supported (first with AOT QDPs), newest 10.x, newest 11.x on PyPI (checked 2026-11-22)
VERSIONS = ("10.9.0.34", "10.16.1.11", "11.4.0.106")
CACHE = Path(os.environ.get("IRPE_TRT_WHEELS", Path.home() / ".cache" / "irpe" / "trt-wheels"))
STANDIN = Path(__file__).with_name("trt_standin.py")


def _wheel(version: str) -> Path:
    pattern = f"tensorrt_cu12_bindings-{version}-*.whl"
    found = sorted(CACHE.glob(pattern))
    if not found:
        CACHE.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-q", "-d",
               str(CACHE), f"tensorrt-cu12-bindings=={version}"]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        found = sorted(CACHE.glob(pattern))
        if res.returncode != 0 or not found:
            raise RuntimeError(f"could not download tensorrt-cu12-bindings=={version}: {res.stderr.strip()[-300:]}")
    return found[0]


def plugin_package(version: str) -> Path:
    """A directory holding ``tensorrt/`` = stand-in + the wheel's real ``plugin/`` package (cached)."""
    root = CACHE / f"standin-{version}"
    plugin_dir = root / "tensorrt" / "plugin"
    if not (plugin_dir / "_lib.py").is_file():
        with zipfile.ZipFile(_wheel(version)) as zf:
            members = [m for m in zf.namelist() if "/plugin/" in m and m.endswith(".py")
                       and m.split("/")[0] in ("tensorrt_bindings", "tensorrt")]
            if not members:
                raise RuntimeError(f"tensorrt-cu12-bindings {version} has no tensorrt/plugin package")
            plugin_dir.mkdir(parents=True, exist_ok=True)
            for m in members:
                (plugin_dir / Path(m).name).write_bytes(zf.read(m))
    text = STANDIN.read_text().replace('__version__ = "0.0.0"', f'__version__ = "{version}"', 1)
    (root / "tensorrt" / "__init__.py").write_text(text)
    return root


def _purge() -> None:
    for name in [m for m in sys.modules if m == "tensorrt" or m.startswith("tensorrt.")]:
        del sys.modules[name]


@contextmanager
def tensorrt_standin(version: str):
    """Import ``(tensorrt, tensorrt.plugin)`` of ``version``; irpe's plugins are unregistered before and after."""
    from irpe.plugins import tensorrt_plugin

    root = str(plugin_package(version))
    _purge()
    sys.path.insert(0, root)
    tensorrt_plugin.register.cache_clear()
    try:
        import tensorrt as trt
        import tensorrt.plugin as trtp

        assert Path(trtp.__file__).parent.parent == Path(root) / "tensorrt"
        yield trt, trtp
    finally:
        sys.path.remove(root)
        _purge()
        tensorrt_plugin.register.cache_clear()


def _attr_value(attr: Any) -> tuple[Any, str]:
    from onnx import AttributeProto

    return {AttributeProto.INT: (attr.i, "INT"), AttributeProto.FLOAT: (attr.f, "FLOAT"),
            AttributeProto.STRING: (attr.s, "STRING"), AttributeProto.INTS: (list(attr.ints), "INTS"),
            AttributeProto.FLOATS: (list(attr.floats), "FLOATS")}[attr.type]


def parser_fields(trt: Any, creator: Any, node: Any) -> list[Any]:
    """onnx-tensorrt ``loadFields``: for each field the creator declares, the node attribute of that name as
    INT -> kINT32 x1, FLOAT -> kFLOAT32 x1, STRING -> kCHAR x len, INTS -> kINT32 x n, FLOATS -> kFLOAT32 x n;
    fields the node lacks are skipped (with a warning in TensorRT)."""
    import numpy as np

    attrs = {a.name: a for a in node.attribute}
    fields = []
    for declared in creator.field_names:
        if declared.name not in attrs:
            continue
        value, kind = _attr_value(attrs[declared.name])
        if kind in ("INT", "INTS"):
            fields.append(trt.PluginField(declared.name, np.atleast_1d(np.array(value, np.int32)),
                                          trt.PluginFieldType.INT32))
        elif kind in ("FLOAT", "FLOATS"):
            fields.append(trt.PluginField(declared.name, np.atleast_1d(np.array(value, np.float32)),
                                          trt.PluginFieldType.FLOAT32))
        else:
            fields.append(trt.PluginField(declared.name, value, trt.PluginFieldType.CHAR))
    return fields


def plugin_from_onnx_node(trt: Any, node: Any, *, prefer_aot: bool = True) -> Any:
    """FallbackPluginImporter + createPlugin: creator by (op_type, plugin_version, plugin_namespace or domain),
    fields as the parser builds them, the QuickPluginCreationRequest from the ``aot`` attribute or the flags."""
    attrs = {a.name: a for a in node.attribute}
    version = attrs["plugin_version"].s.decode() if "plugin_version" in attrs else "1"
    namespace = attrs["plugin_namespace"].s.decode() if "plugin_namespace" in attrs else ""
    registry = trt.get_plugin_registry()
    creator = registry.get_creator(node.op_type, version, namespace)
    if creator is None:
        namespace = node.domain
        creator = registry.get_creator(node.op_type, version, namespace)
    if creator is None:
        raise LookupError(f"Plugin not found: {node.op_type}, version {version}, namespace {namespace!r}")
    if "aot" in attrs:
        request = (trt.QuickPluginCreationRequest.STRICT_AOT if attrs["aot"].i
                   else trt.QuickPluginCreationRequest.STRICT_JIT)
    else:
        request = (trt.QuickPluginCreationRequest.PREFER_AOT if prefer_aot
                   else trt.QuickPluginCreationRequest.UNKNOWN)
    fc = trt.PluginFieldCollection(parser_fields(trt, creator, node))
    return creator.create_plugin(node.op_type, namespace, fc, trt.TensorRTPhase.BUILD, request)


@dataclass
class Launch:
    """What the builder learnt from the plugin, evaluated at concrete shapes."""

    output_types: list[Any]
    output_shape: tuple[int, ...]
    combinations: list[tuple[Any, ...]]
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_mem: int
    extra_args: list[int]
    kernel_name: str
    ptx: str
    extra_dtypes: list[Any] = field(default_factory=list)


def _dyn(trt: Any, dtype: Any, dims: tuple[int, ...]) -> Any:
    desc = trt.PluginTensorDesc()
    desc.type, desc.format, desc.dims = dtype, trt.TensorFormat.LINEAR, trt.Dims(dims)
    return trt.DynamicPluginTensorDesc(desc, dims, dims, dims)


def build_and_launch(trt: Any, plugin: Any, in_types: list[Any], in_shapes: list[tuple[int, ...]],
                     batch_axis0: list[bool]) -> Launch:
    """The builder's calls for inputs of ``in_shapes`` whose axis 0 is the dynamic batch where ``batch_axis0``."""
    builder = trt.IExprBuilder()
    out_types = plugin.get_output_data_types(in_types, [len(s) for s in in_shapes])
    exprs = []
    for shape, dyn in zip(in_shapes, batch_axis0, strict=True):
        e = trt.DimsExprs([builder.constant(d) for d in shape])
        if dyn:
            e[0] = trt.DimExpr(symbol="N")
        exprs.append(e)
    out_exprs = plugin.get_output_shapes(exprs, [], builder)
    bindings = {"N": in_shapes[0][0]}
    out_shape = tuple(e.evaluate(bindings) for e in out_exprs[0])
    ins = [_dyn(trt, t, s) for t, s in zip(in_types, in_shapes, strict=True)]
    outs = [_dyn(trt, out_types[0], out_shape)]
    flat = plugin.get_supported_format_combinations(ins + outs, len(ins))
    n = len(ins) + len(outs)
    combos = [tuple(d.type for d in flat[i:i + n]) for i in range(0, len(flat), n)]
    plugin.configure_plugin(ins, outs)
    tactics = plugin.get_valid_tactics()
    plugin.set_tactic(tactics[0] if tactics else 0)
    params, extra = trt.KernelLaunchParams(), trt.ISymExprs()
    plugin.get_launch_params(exprs, ins + outs, len(ins), params, extra, builder)
    name, ptx = plugin.get_kernel([d.desc for d in ins], [d.desc for d in outs])
    if not isinstance(name, (str, bytes)) or not isinstance(ptx, bytes):  # pybind11 cast to (std::string, bytes)
        raise TypeError(f"get_kernel must return (str, bytes), got ({type(name)}, {type(ptx)})")
    ev = [getattr(params, f).expr.evaluate(bindings) for f in trt.KernelLaunchParams._FIELDS]
    return Launch(output_types=out_types, output_shape=out_shape, combinations=combos, grid=tuple(ev[0:3]),
                  block=tuple(ev[3:6]), shared_mem=ev[6], extra_args=[a.expr.evaluate(bindings) for a in extra],
                  kernel_name=name.decode() if isinstance(name, bytes) else name, ptx=ptx.decode(),
                  extra_dtypes=[a.dtype for a in extra])
