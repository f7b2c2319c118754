"""The irpe TensorRT plugins through NVIDIA's own ``tensorrt.plugin`` (10.9, newest 10.x, newest 11.x) on CPU.

The lifecycle is the one TensorRT's ONNX parser and builder drive (see :mod:`tests.plugins.trt_harness`);
the PTX each launch returns is checked against what the launch declares, and the Triton kernel is run
(interpreter) with exactly the declared grid and scalar arguments.
"""

import re

import numpy as np
import pytest

from irpe.plugins import kernels, ops, tensorrt_plugin
from irpe.plugins.ptx import compile_ptx
from tests.plugins import trt_harness
from tests.plugins.trt_harness import VERSIONS, build_and_launch, plugin_from_onnx_node, tensorrt_standin

N, H, L, K = 3, 4, 17, 50
ARCH = 80


@pytest.fixture(params=VERSIONS, ids=[f"trt{v}" for v in VERSIONS])
def trt(request, monkeypatch):
    monkeypatch.setattr(tensorrt_plugin, "_current_arch", lambda: ARCH)  # the GPU query: no GPU here
    try:
        trt_harness.plugin_package(request.param)
    except RuntimeError as e:
        pytest.skip(f"no TensorRT plugin package: {e}")
    with tensorrt_standin(request.param) as (trt, trtp):
        tensorrt_plugin.register()
        yield trt


def _entry_params(ptx: str, name: str) -> list[str]:
    m = re.search(r"\.entry\s+" + re.escape(name) + r"\s*\((.*?)\)", ptx, flags=re.S)
    assert m, f"PTX has no .entry {name}"
    return [p.split()[1] for p in m.group(1).split(",") if p.strip()]


def check_ptx_against_launch(launch, n_inputs: int, n_outputs: int) -> None:
    """Entry parameters = inputs + extra args + outputs (pointers, then u32 scalars); .reqntid = block."""
    params = _entry_params(launch.ptx, launch.kernel_name)
    n_extra = len(launch.extra_args)
    assert len(params) == n_inputs + n_extra + n_outputs, (params, launch.extra_args)
    assert params[:n_inputs] == [".u64"] * n_inputs and params[n_inputs + n_extra:] == [".u64"] * n_outputs
    assert params[n_inputs:n_inputs + n_extra] == [".u32"] * n_extra
    reqntid = re.search(r"\.reqntid\s+(\d+)(?:,\s*(\d+))?(?:,\s*(\d+))?", launch.ptx)
    assert reqntid, "PTX declares no .reqntid"
    threads = np.prod([int(g) for g in reqntid.groups() if g])
    assert np.prod(launch.block) == threads, (launch.block, reqntid.group(0))
    uses_dynamic_smem = ".extern .shared" in launch.ptx
    assert (launch.shared_mem > 0) == uses_dynamic_smem, (launch.shared_mem, uses_dynamic_smem)
    assert launch.shared_mem <= 48 * 1024, "above 48 KiB needs cudaFuncSetAttribute, which the AOT launcher lacks"


def test_registry_holds_both_creators_with_the_parser_lookup_keys(trt):
    registry = trt.get_plugin_registry()
    for op in (ops.RPE_INDEX_OP, ops.BUCKET_SUM_OP):
        creator = registry.get_creator(op, ops.PLUGIN_VERSION, ops.PLUGIN_NAMESPACE)
        assert creator is not None and creator.plugin_namespace == ops.PLUGIN_NAMESPACE
    fields = registry.get_creator(ops.BUCKET_SUM_OP, "1", "irpe").field_names
    assert [(f.name, f.type) for f in fields] == [("num_buckets", trt.PluginFieldType.INT32)]
    assert list(registry.get_creator(ops.RPE_INDEX_OP, "1", "irpe").field_names) == []


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_rpe_index_lifecycle_and_ptx(trt, dtype):
    t = trt.float32 if dtype == "fp32" else trt.float16
    node = ops.make_rpe_index_node("lut", "table", "out", "rpe_k")
    plugin = plugin_from_onnx_node(trt, node)
    assert type(plugin).__name__ == "_TemplateAOTPlugin", "aot=1 must select the AOT implementation"
    launch = build_and_launch(trt, plugin, [t, trt.int32], [(N, H, L, K), (L, L)], [True, False])
    assert launch.output_types == [t] and launch.output_shape == (N, H, L, L)
    assert set(launch.combinations) == {(trt.float32, trt.int32, trt.float32), (trt.float16, trt.int32, trt.float16)}
    ck = compile_ptx(ops.RPE_INDEX_OP, dtype, ARCH)
    assert launch.grid == (L, -(-N * H // ck.block_bh), 1) and launch.block == (ck.block_x, 1, 1)
    assert launch.extra_args == [N * H, L, L, K] and launch.kernel_name == ck.kernel_name
    assert launch.extra_dtypes == [trt.PluginArgDataType.INT32] * 4
    check_ptx_against_launch(launch, 2, 1)
    rng = np.random.default_rng(0)
    lut = rng.standard_normal((N, H, L, K)).astype(np.float32)
    index = rng.integers(0, K, (L, L)).astype(np.int32)
    out = _run_declared(kernels.rpe_index_kernel, launch, ck, lut, index, (N, H, L, L))
    np.testing.assert_array_equal(out, ops.rpe_index_ref(lut, index))


def test_bucket_sum_lifecycle_and_ptx(trt):
    node = ops.make_bucket_sum_node("attn", "table", "out", "rpe_v", num_buckets=K)
    plugin = plugin_from_onnx_node(trt, node)
    launch = build_and_launch(trt, plugin, [trt.float16, trt.int32], [(N, H, L, L), (L, L)], [True, False])
    assert launch.output_types == [trt.float16] and launch.output_shape == (N, H, L, K)
    ck = compile_ptx(ops.BUCKET_SUM_OP, "fp16", ARCH, num_buckets=K)
    assert launch.grid == (L, -(-N * H // ck.block_bh), 1) and launch.extra_args == [N * H, L, L, K]
    check_ptx_against_launch(launch, 2, 1)
    rng = np.random.default_rng(1)
    attn = rng.random((N, H, L, L)).astype(np.float32)
    index = rng.integers(0, K, (L, L)).astype(np.int32)
    out = _run_declared(kernels.bucket_sum_kernel, launch, ck, attn, index, (N, H, L, K))
    np.testing.assert_allclose(out, ops.bucket_sum_ref(attn, index, K), rtol=1e-5, atol=1e-5)


def _run_declared(kernel, launch, ck, x, index, out_shape):
    """The Triton kernel (interpreter) with the launch's grid and extra args: inputs, scalars, outputs."""
    import torch

    out = torch.full(out_shape, float("nan"))
    consts = {"BLOCK_BH": ck.block_bh, "BLOCK_J": ck.block_j}
    if ck.block_k:
        consts["BLOCK_K"] = ck.block_k
    kernel[launch.grid[:2]](torch.from_numpy(x), torch.from_numpy(index), *launch.extra_args, out, **consts)
    assert not torch.isnan(out).any(), "the declared grid leaves part of the output unwritten"
    return out.numpy()


def test_node_without_plugin_namespace_falls_back_to_the_domain(trt):
    node = ops.make_rpe_index_node("lut", "table", "out", "rpe_k")
    keep = [a for a in node.attribute if a.name != "plugin_namespace"]
    del node.attribute[:]
    node.attribute.extend(keep)
    assert plugin_from_onnx_node(trt, node) is not None  # domain "irpe" == namespace


def test_missing_num_buckets_attribute_fails(trt):
    node = ops.make_bucket_sum_node("attn", "table", "out", "rpe_v", num_buckets=K)
    keep = [a for a in node.attribute if a.name != "num_buckets"]
    del node.attribute[:]
    node.attribute.extend(keep)
    plugin = plugin_from_onnx_node(trt, node)
    with pytest.raises(TypeError, match="num_buckets"):
        build_and_launch(trt, plugin, [trt.float32, trt.int32], [(N, H, L, L), (L, L)], [True, False])


def test_a_dropped_launch_argument_is_caught(trt, monkeypatch):
    import tensorrt.plugin as trtp

    real = trtp.SymIntExprs.from_tuple
    monkeypatch.setattr(trtp.SymIntExprs, "from_tuple", classmethod(lambda cls, t: real(t[:-1])))
    plugin = plugin_from_onnx_node(trt, ops.make_rpe_index_node("lut", "table", "out", "rpe_k"))
    launch = build_and_launch(trt, plugin, [trt.float32, trt.int32], [(N, H, L, K), (L, L)], [True, False])
    with pytest.raises(AssertionError):
        check_ptx_against_launch(launch, 2, 1)


def test_an_int_annotation_breaks_on_tensorrt_10_with_this_numpy(trt):
    """Why num_buckets is an NDArray: TensorRT 10.x's creator does int(f.data) on the parser's 1-element field."""
    import tensorrt.plugin as trtp

    @trtp.register("irpetest::IntAttr")
    def int_attr_desc(x: trtp.TensorDesc, k: int) -> trtp.TensorDesc:
        return x.like()

    @trtp.aot_impl("irpetest::IntAttr")
    def int_attr_aot(x, k, outputs, tactic) -> tuple[str, bytes, trtp.KernelLaunchParams, trtp.SymIntExprs]:
        raise AssertionError("not reached")

    from onnx import helper

    node = helper.make_node("IntAttr", ["x"], ["y"], domain="irpetest", plugin_namespace="irpetest", k=5, aot=1)
    if tuple(int(p) for p in trt.__version__.split(".")[:2]) >= (11, 0):
        assert plugin_from_onnx_node(trt, node) is not None
    else:
        with pytest.raises(TypeError, match="0-dimensional|scalar"):
            plugin_from_onnx_node(trt, node)


@pytest.mark.parametrize(("version", "message"),
                         [("10.8.0.43", "too old"), ("12.0.1", "supports TensorRT 10.9 to 11.x")])
def test_tensorrt_outside_the_supported_range_is_refused(version, message, monkeypatch):
    import sys
    from types import SimpleNamespace

    monkeypatch.setitem(sys.modules, "tensorrt", SimpleNamespace(__version__=version))
    with pytest.raises(tensorrt_plugin.TensorRTUnavailable, match=message):
        tensorrt_plugin.import_tensorrt("building")


def test_aot_attribute_and_network_preference_select_the_implementation(trt):
    """aot=0 asks for the JIT plugin; without the attribute the network flag decides, and with both
    implementations defined and no preference TensorRT's creator refuses (why the nodes carry aot=1)."""
    node = ops.make_rpe_index_node("lut", "table", "out", "rpe_k", aot=False)
    assert type(plugin_from_onnx_node(trt, node)).__name__ == "_TemplateJITPlugin"
    keep = [a for a in node.attribute if a.name != "aot"]
    del node.attribute[:]
    node.attribute.extend(keep)
    assert type(plugin_from_onnx_node(trt, node, prefer_aot=True)).__name__ == "_TemplateAOTPlugin"
    with pytest.raises(ValueError, match="both AOT and JIT"):
        plugin_from_onnx_node(trt, node, prefer_aot=False)


def test_a_string_typed_num_buckets_is_caught(trt):
    """The attribute's ONNX type matters: as a STRING the parser passes kCHAR bytes and the shape is wrong."""
    from onnx import helper

    node = ops.make_bucket_sum_node("attn", "table", "out", "rpe_v", num_buckets=K)
    keep = [a for a in node.attribute if a.name != "num_buckets"]
    del node.attribute[:]
    node.attribute.extend([*keep, helper.make_attribute("num_buckets", str(K))])
    plugin = plugin_from_onnx_node(trt, node)
    try:
        launch = build_and_launch(trt, plugin, [trt.float32, trt.int32], [(N, H, L, L), (L, L)], [True, False])
    except (TypeError, ValueError):
        return
    assert launch.output_shape != (N, H, L, K)


def test_removing_the_aot_return_annotation_fails_registration(monkeypatch):
    import inspect

    monkeypatch.setattr(tensorrt_plugin, "_aot_return", lambda trtp: inspect.Signature.empty)
    with tensorrt_standin(VERSIONS[0]):
        with pytest.raises(ValueError, match="No return annotation found for aot_impl"):
            tensorrt_plugin.register()
