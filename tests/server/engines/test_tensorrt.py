"""TensorRTEngine's concurrency and load checks, over stand-ins for tensorrt and cuda-python (no GPU here).

The stand-in "device" memory is host memory, copies are real memmoves and the fake execution context reads
its input buffer, sleeps (so threads interleave) and writes logits computed from that input: if two threads
shared a context, stream or buffers, one would receive the other's logits.
"""

from __future__ import annotations

import ctypes
import sys
import threading
import time
import types
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import numpy as np
import pytest

from irpe.server.engines import EngineError
from irpe.server.engines.tensorrt import TensorRTEngine, check_build_environment

S, CLASSES, MAX_BATCH = 4, 3, 8


class FakeCudart(types.ModuleType):
    def __init__(self):
        super().__init__("cuda.bindings.runtime")
        self.cudaMemcpyKind = SimpleNamespace(cudaMemcpyHostToDevice=1, cudaMemcpyDeviceToHost=2)
        self.cudaDeviceAttr = SimpleNamespace(cudaDevAttrComputeCapabilityMajor="major",
                                              cudaDevAttrComputeCapabilityMinor="minor")
        self.buffers, self.streams = [], 0

    def cudaMalloc(self, nbytes):  # noqa: N802 - cuda-python's names
        buf = np.zeros(nbytes, np.uint8)
        self.buffers.append(buf)
        return 0, buf.ctypes.data

    def cudaStreamCreate(self):  # noqa: N802
        self.streams += 1
        return 0, self.streams

    def cudaMemcpyAsync(self, dst, src, nbytes, kind, stream):  # noqa: N802
        time.sleep(0.0005)
        ctypes.memmove(dst, src, nbytes)
        return (0,)

    def cudaStreamSynchronize(self, stream):  # noqa: N802
        return (0,)

    def cudaGetDevice(self):  # noqa: N802
        return 0, 0

    def cudaDeviceGetAttribute(self, attr, dev):  # noqa: N802
        return 0, {"major": 9, "minor": 0}[attr]


class FakeContext:
    def __init__(self, engine):
        self.engine, self.shape, self.addr, self.users = engine, None, {}, 0

    def set_optimization_profile_async(self, profile, stream):
        self.profile = profile

    def set_input_shape(self, name, shape):
        self.shape = shape

    def set_tensor_address(self, name, addr):
        self.addr[name] = addr

    def execute_async_v3(self, stream):
        with self.engine.lock:
            self.users += 1
            self.engine.max_users = max(self.engine.max_users, self.users)
            self.engine.active += 1
            self.engine.max_active = max(self.engine.max_active, self.engine.active)
        n = self.shape[0]
        x = np.ctypeslib.as_array((ctypes.c_float * (n * 3 * S * S)).from_address(self.addr["images"]))
        time.sleep(0.002)
        logits = x.reshape(n, -1).mean(1, keepdims=True) + np.arange(CLASSES, dtype=np.float32)
        out = np.ctypeslib.as_array((ctypes.c_float * (n * CLASSES)).from_address(self.addr["logits"]))
        out[:] = logits.ravel()
        with self.engine.lock:
            self.users -= 1
            self.engine.active -= 1
        return True


class FakeEngine:
    def __init__(self, profiles):
        self.num_optimization_profiles = profiles
        self.lock, self.max_users, self.active, self.max_active = threading.Lock(), 0, 0, 0

    def get_tensor_dtype(self, name):
        return "f32"

    def get_tensor_profile_shape(self, name, profile):
        return [(1, 3, S, S), (MAX_BATCH, 3, S, S), (MAX_BATCH, 3, S, S)]

    def create_execution_context(self):
        return FakeContext(self)


@pytest.fixture
def fakes(monkeypatch, request):
    profiles = getattr(request, "param", 1)
    engine, cudart = FakeEngine(profiles), FakeCudart()
    trt = types.ModuleType("tensorrt")
    trt.__version__ = "10.16.1.11"
    trt.Logger = type("Logger", (), {"WARNING": 2, "__init__": lambda self, severity: None})
    trt.nptype = lambda t: np.float32
    trt.Runtime = lambda logger: SimpleNamespace(deserialize_cuda_engine=lambda data: engine)
    cuda, bindings = types.ModuleType("cuda"), types.ModuleType("cuda.bindings")
    bindings.runtime, cuda.bindings = cudart, bindings
    for name, mod in {"tensorrt": trt, "cuda": cuda, "cuda.bindings": bindings,
                      "cuda.bindings.runtime": cudart}.items():
        monkeypatch.setitem(sys.modules, name, mod)
    return engine


def _artifact(**entry):
    return SimpleNamespace(input_name="images", output_name="logits", num_classes=CLASSES,
                           preprocess=SimpleNamespace(crop=S), engines={"tensorrt": entry})


def _plan(tmp_path):
    plan = tmp_path / "model.plan"
    plan.write_bytes(b"plan")
    return plan


@pytest.mark.parametrize("fakes", [1, 2], indirect=True, ids=["one-profile", "two-profiles"])
def test_concurrent_runs_never_share_a_context_and_each_gets_its_own_logits(fakes, tmp_path):
    eng = TensorRTEngine(_plan(tmp_path), _artifact(tensorrt_version="10.16.1", compute_capability="9.0"),
                         max_batch=MAX_BATCH)
    assert eng.info.max_batch == MAX_BATCH

    def one(i):
        x = np.full((1 + i % MAX_BATCH, 3, S, S), float(i), np.float32)
        return i, eng.run(x)

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(64)))
    for i, logits in results:
        assert logits.shape == (1 + i % MAX_BATCH, CLASSES)
        np.testing.assert_allclose(logits, np.broadcast_to(i + np.arange(CLASSES), logits.shape))
    assert fakes.max_users == 1, "an execution context ran two batches at once"
    assert fakes.max_active == fakes.num_optimization_profiles, "one batch in flight per optimization profile"


def test_plan_from_another_tensorrt_or_gpu_is_refused(fakes, tmp_path):
    with pytest.raises(EngineError, match=r"TensorRT 10\.9\.0\.34, this host has 10\.16\.1\.11.*rebuild"):
        TensorRTEngine(_plan(tmp_path), _artifact(tensorrt_version="10.9.0.34"), max_batch=4)
    with pytest.raises(EngineError, match="compute capability 8.0, this GPU is 9.0"):
        TensorRTEngine(_plan(tmp_path), _artifact(compute_capability="8.0"), max_batch=4)


def test_build_environment_check_ignores_the_build_number():
    check_build_environment({"tensorrt_version": "10.16.1.11", "compute_capability": "9.0"}, "10.16.1.99", "9.0",
                            "m.plan")
    check_build_environment({}, "11.4.0.106", "12.0", "m.plan")  # older model.json without the fields
