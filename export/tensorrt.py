"""ONNX -> TensorRT engine (.plan) with the irpe AOT plugins, and a parity check against ONNX Runtime.

Everything TensorRT-related is imported lazily: on a machine without TensorRT (or without a GPU) the
functions raise :class:`TensorRTUnavailable` whose message says what was asked and how to get TensorRT.
Engines built with ``use_plugin=True`` embed the plugins' PTX (``aot`` ONNX attribute +
``PREFER_AOT_PYTHON_PLUGINS``), so running them needs neither Python nor Triton.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from irpe.plugins.tensorrt_plugin import TensorRTUnavailable, import_tensorrt

__all__ = ["TensorRTUnavailable", "compare_engine_with_onnxruntime", "engine_from_onnx", "tensorrt_status"]

INPUT_NAME = "images"


def tensorrt_status() -> str:
    """One line for ``irpe doctor``-style CLIs: TensorRT version and GPU, or why it is unavailable."""
    try:
        trt, _ = import_tensorrt("building TensorRT engines")
    except TensorRTUnavailable as e:
        return f"TensorRT: not available. {e}"
    try:
        from triton.runtime import driver

        gpu = f"GPU sm_{driver.active.get_current_target().arch}"
    except Exception as e:  # noqa: BLE001 - any driver failure means "no usable GPU"
        gpu = f"no usable CUDA GPU ({type(e).__name__}: {e})"
    return f"TensorRT {trt.__version__}; {gpu}; irpe plugins need TensorRT >= 10.9"


def _builder(trt: Any, logger: Any) -> Any:
    try:
        builder = trt.Builder(logger)
    except Exception as e:  # TypeError/RuntimeError when CUDA cannot initialise
        builder, err = None, e
    else:
        err = None
    if not builder:
        raise TensorRTUnavailable(f"building a TensorRT engine needs a CUDA GPU; TensorRT could not create a "
                                  f"builder ({err or 'no CUDA device'}). Run on an NVIDIA GPU host.")
    return builder


def network_flags(trt: Any, use_plugin: bool) -> int:
    """STRONGLY_TYPED (TensorRT 10; always on and deprecated in 11, NvInfer.h) so both versions take precision
    from the ONNX graph, plus PREFER_AOT_PYTHON_PLUGINS; flags by name, as their values differ across versions."""
    flag = trt.NetworkDefinitionCreationFlag
    flags = 0
    if hasattr(flag, "STRONGLY_TYPED") and int(trt.__version__.split(".")[0]) < 11:
        flags |= 1 << int(flag.STRONGLY_TYPED)
    if use_plugin and hasattr(flag, "PREFER_AOT_PYTHON_PLUGINS"):
        flags |= 1 << int(flag.PREFER_AOT_PYTHON_PLUGINS)
    return flags


def build_environment(trt: Any) -> dict[str, str]:
    """TensorRT version and GPU compute capability, recorded in model.json next to the plan."""
    import torch

    major, minor = torch.cuda.get_device_capability()
    return {"tensorrt_version": trt.__version__, "compute_capability": f"{major}.{minor}"}


def tensorrt_incompatibilities(proto: Any) -> list[str]:
    """Nodes TensorRT's ONNX parser rejects: ScatterND with a ``reduction`` attribute (onnx-tensorrt
    onnxOpImporters.cpp ScatterND importer: "Attribute reduction is not supported"; docs/operators.md)."""
    found = []
    for node in proto.graph.node:
        if node.op_type == "ScatterND" and any(a.name == "reduction" for a in node.attribute):
            found.append(f"{node.name or node.output[0]}: ScatterND(reduction)")
    return found


def _preflight(onnx_path: Path, fp16: bool) -> None:
    import onnx

    proto = onnx.load(str(onnx_path), load_external_data=False)
    bad = tensorrt_incompatibilities(proto)
    if bad:
        raise ValueError(f"{onnx_path}: {len(bad)} node(s) TensorRT's ONNX parser rejects ({bad[0]}, ...); this "
                         "is the ONNX Runtime graph: build engines from the TensorRT variant (irpe export "
                         "--format tensorrt writes model.tensorrt.onnx) or from an --rpe-plugin export")
    is_fp16 = any(t.data_type == onnx.TensorProto.FLOAT16 for t in proto.graph.initializer)
    if fp16 != is_fp16:
        raise ValueError(f"{onnx_path}: fp16={fp16} but the graph is {'fp16' if is_fp16 else 'fp32'}; TensorRT "
                         "networks are strongly typed, so precision comes from the ONNX graph: export it with "
                         "the same --fp16 setting")


def _parse(trt: Any, builder: Any, logger: Any, onnx_path: Path, use_plugin: bool) -> Any:
    flags = network_flags(trt, use_plugin)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "\n".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        hint = "" if use_plugin else " (graph has irpe plugin nodes? build with use_plugin=True)"
        raise RuntimeError(f"{onnx_path}: TensorRT could not parse the ONNX model{hint}:\n{errors}")
    return network, parser


def _config(trt: Any, builder: Any, max_batch: int, img_size: int, fp16: bool,
            timing_cache: Path | None) -> Any:
    config = builder.create_builder_config()
    profile = builder.create_optimization_profile()
    opt = max(1, min(max_batch, 8))
    shape = (3, img_size, img_size)
    profile.set_shape(INPUT_NAME, (1, *shape), (opt, *shape), (max_batch, *shape))
    config.add_optimization_profile(profile)  # no BuilderFlag.FP16: strongly typed (TensorRT 11 removed it)
    blob = timing_cache.read_bytes() if timing_cache is not None and timing_cache.is_file() else b""
    config.set_timing_cache(config.create_timing_cache(blob), ignore_mismatch=False)
    return config


def engine_from_onnx(onnx_path: str | Path, plan_path: str | Path, *, max_batch: int, img_size: int,
                     fp16: bool = False, timing_cache: str | Path | None = None,
                     use_plugin: bool = True) -> Path:
    """Build ``plan_path`` from ``onnx_path`` (input ``images`` [N,3,S,S], N in 1..max_batch); returns it."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    trt, _ = import_tensorrt(f"building a TensorRT engine from {onnx_path}")
    _preflight(Path(onnx_path), fp16)
    if use_plugin:
        from irpe.plugins.tensorrt_plugin import register

        register()
    logger = trt.Logger(trt.Logger.WARNING)
    builder = _builder(trt, logger)
    network, _parser = _parse(trt, builder, logger, Path(onnx_path), use_plugin)
    cache_path = Path(timing_cache) if timing_cache is not None else None
    config = _config(trt, builder, max_batch, img_size, fp16, cache_path)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise RuntimeError(f"TensorRT failed to build an engine from {onnx_path}; see the log above")
    plan_path = Path(plan_path)
    plan_path.parent.mkdir(parents=True, exist_ok=True)
    plan_path.write_bytes(bytes(serialized))
    if cache_path is not None:
        cache_path.write_bytes(bytes(config.get_timing_cache().serialize()))
    return plan_path


def _run_engine(trt: Any, engine: Any, images: np.ndarray) -> np.ndarray:
    """Run one batch through a deserialised engine (CUDA memory via torch)."""
    import torch

    context = engine.create_execution_context()
    context.set_input_shape(INPUT_NAME, images.shape)
    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    out_name = next(n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT)
    x = torch.from_numpy(np.ascontiguousarray(images, np.float32)).cuda()
    out_dtype = torch.float16 if engine.get_tensor_dtype(out_name) == trt.float16 else torch.float32
    y = torch.empty(tuple(context.get_tensor_shape(out_name)), dtype=out_dtype, device="cuda")
    context.set_tensor_address(INPUT_NAME, x.data_ptr())
    context.set_tensor_address(out_name, y.data_ptr())
    stream = torch.cuda.current_stream()
    if not context.execute_async_v3(stream.cuda_stream):
        raise RuntimeError("TensorRT execution failed")
    stream.synchronize()
    return y.float().cpu().numpy()


def compare_engine_with_onnxruntime(plan_path: str | Path, onnx_path: str | Path, *, img_size: int,
                                    batch_sizes: tuple[int, ...] = (1, 4), seed: int = 0,
                                    atol: float = 1e-3) -> dict[str, Any]:
    """Max |engine - ONNX Runtime| and top-1 agreement on random images; ``ok`` when within ``atol``."""
    trt, _ = import_tensorrt(f"comparing {plan_path} with ONNX Runtime")
    from irpe.plugins.ort_op import session_for_plugin_graph
    from irpe.plugins.tensorrt_plugin import register

    register()  # a JIT-plugin engine needs the definitions; harmless for AOT engines
    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    engine = runtime.deserialize_cuda_engine(Path(plan_path).read_bytes())
    if engine is None:
        raise RuntimeError(f"{plan_path}: TensorRT could not deserialise the engine (other TensorRT version/GPU?)")
    session = session_for_plugin_graph(onnx_path)
    rng = np.random.default_rng(seed)
    result: dict[str, Any] = {"max_abs_diff": 0.0, "top1_agreement": 1.0, "batches": {}}
    for n in batch_sizes:
        images = rng.standard_normal((n, 3, img_size, img_size)).astype(np.float32)
        got, want = _run_engine(trt, engine, images), session.run(None, {INPUT_NAME: images})[0]
        diff = float(np.max(np.abs(got - want)))
        agree = float(np.mean(got.argmax(-1) == want.argmax(-1)))
        result["batches"][n] = {"max_abs_diff": diff, "top1_agreement": agree}
        result["max_abs_diff"] = max(result["max_abs_diff"], diff)
        result["top1_agreement"] = min(result["top1_agreement"], agree)
    result["ok"] = result["max_abs_diff"] <= atol
    return result


def require_tensorrt(what: str) -> None:
    """Raise :class:`TensorRTUnavailable` (clear message) unless TensorRT >= 10.9 imports."""
    import_tensorrt(what)

