"""The request limits, in-process: CPU quota, exposure check, Host allowlist, JPEG scan counting, integer
16-bit conversion, pixel budget, admission, dead inference workers, the HTTP protocol's picklability."""

from __future__ import annotations

import io
import pickle
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from irpe.server.batching import Batcher
from irpe.server.config import Settings, cgroup_cpu_quota, is_loopback
from irpe.server.errors import APIError
from irpe.server.hosting.version import ModelVersion, VersionState
from irpe.server.http.protocol import protocol_factory
from irpe.server.pipeline.decode import PixelBudget, _sixteen_to_l, jpeg_scans
from irpe.server.pipeline.service import Readiness, Service, local_service
from tests.reliability.hostile import scan_bomb
from tests.server.helpers import encode, image


def test_cgroup_v2_quota(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert cgroup_cpu_quota(str(tmp_path)) == 1.5
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_quota(str(tmp_path)) is None


def test_cgroup_v1_quota(tmp_path: Path) -> None:
    v1 = tmp_path / "cpu,cpuacct"
    v1.mkdir()
    (v1 / "cpu.cfs_quota_us").write_text("300000\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_cpu_quota(str(tmp_path)) == 3.0
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")
    assert cgroup_cpu_quota(str(tmp_path)) is None


def test_pools_follow_the_affinity_mask() -> None:
    code = ("import os; os.sched_setaffinity(0, {0}); from irpe.server.config import Settings; "
            "s = Settings(device='cuda'); print(s.resolved_decode_threads(), Settings().resolved_inference_threads())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["1", "1"]


@pytest.mark.parametrize(("host", "loop"), [("127.0.0.1", True), ("127.3.2.1", True), ("::1", True),
                                            ("localhost", True), ("0.0.0.0", False), ("::", False),
                                            ("10.0.0.5", False), ("example.com", False)])
def test_is_loopback(host: str, loop: bool) -> None:
    assert is_loopback(host) is loop


def test_non_loopback_without_key_refuses_unless_insecure() -> None:
    with pytest.raises(ValueError, match="IRPE_API_KEY.*--insecure"):
        Settings(host="0.0.0.0").check_exposure()
    Settings(host="0.0.0.0", api_key="k").check_exposure()
    Settings.from_env({"IRPE_INSECURE": "1"}, host="0.0.0.0").check_exposure()
    Settings(host="127.0.0.1").check_exposure()


def test_serve_refuses_to_start_exposed_without_key(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin"}
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "irpe", "serve", str(tmp_path), "--host", "0.0.0.0", "--port", "1"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode != 0 and time.perf_counter() - start < 30
    lines = [ln for ln in out.stderr.strip().splitlines() if ln]
    assert len(lines) == 1 and "IRPE_API_KEY" in lines[0] and "--insecure" in lines[0], out.stderr


def test_host_allowlist() -> None:
    assert Settings().host_allowlist() >= {"localhost", "127.0.0.1", "[::1]"}
    assert Settings(api_key="k").host_allowlist() == frozenset()
    assert Settings(host="0.0.0.0", insecure=True).host_allowlist() == frozenset()
    assert Settings(allowed_hosts="A.example, b.example").host_allowlist() == {"a.example", "b.example"}
    assert Settings(allowed_hosts="*").host_allowlist() == frozenset()


def test_jpeg_scan_count() -> None:
    assert jpeg_scans(encode(image((64, 48)), "JPEG"), 100) == 1
    progressive = jpeg_scans(encode(image((64, 48)), "JPEG", progressive=True), 100)
    assert 6 <= progressive <= 12
    assert jpeg_scans(scan_bomb(64, 5000), 100) == 101  # stops counting past the limit
    thumb = io.BytesIO()  # an EXIF thumbnail holds its own SOS inside APP1: not counted
    exif = Image.Exif()
    exif[0x010F] = "x" * 10 + "\xff\xda"
    image((64, 48)).save(thumb, "JPEG", exif=exif)
    assert jpeg_scans(thumb.getvalue(), 100) == 1


@pytest.mark.parametrize("mode", ["I;16", "I", "F", "Fbig"])
def test_sixteen_bit_conversion_matches_the_float64_formula(mode: str) -> None:
    rng = np.random.default_rng(0)
    arr = {"I;16": rng.integers(0, 65536, (300, 500)).astype(np.uint16),
           "I": rng.integers(-100_000, 100_000, (300, 500)).astype(np.int32),
           "F": rng.random((300, 500), dtype=np.float32),
           "Fbig": rng.random((300, 500), dtype=np.float32) * 300}[mode]
    img = Image.fromarray(arr)
    if img.mode == "F":
        a = arr * 255.0 if float(np.nanmax(arr)) <= 1.0 else arr
        want = np.clip(np.nan_to_num(a), 0, 255).round().astype(np.uint8)
    else:
        want = (np.clip(arr.astype(np.float64), 0, 65535) / 257.0).round().astype(np.uint8)
    assert np.array_equal(np.asarray(_sixteen_to_l(img)), want)


def test_pixel_budget_waits_then_times_out() -> None:
    budget = PixelBudget(100)
    order: list[str] = []
    with budget.hold(80):
        def second() -> None:
            with budget.hold(50):
                order.append("second")
        t = threading.Thread(target=second)
        t.start()
        time.sleep(0.2)
        order.append("first done")
    t.join(5)
    assert order == ["first done", "second"] and budget.free == 100
    with budget.hold(100), pytest.raises(APIError) as e, budget.hold(1, deadline=time.perf_counter() + 0.1):
        pass
    assert e.value.status == 504 and budget.free == 100


class _Ready:
    info = None


def _ready_state(batcher: Batcher | None = None, **settings: object) -> Service:
    """A ready service whose default model (one version) queues on ``batcher``."""
    state = local_service(Settings(**settings))  # type: ignore[arg-type]
    batcher = batcher or Batcher(lambda x: x, sizes=[1], max_wait_ms=1, max_queue=8)
    state.host.records["m"] = {1: ModelVersion("m", 1, Path("."), batcher=batcher, state=VersionState.READY)}
    state.host.started = True
    state.readiness = Readiness.READY
    return state


def test_admission_counts_images_before_decoding() -> None:
    state = _ready_state(max_queue=8)
    state.admit(6)
    with pytest.raises(APIError) as busy:
        state.admit(3)
    assert busy.value.status == 503 and busy.value.headers["Retry-After"]
    with pytest.raises(APIError) as big:
        state.admit(9)
    assert big.value.status == 413
    state.release(6)
    state.admit(8)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_dead_inference_worker_turns_unready() -> None:
    def bad(x: np.ndarray) -> np.ndarray:
        return np.zeros((0, 10), np.float32)  # fewer rows than images: IndexError outside the engine call

    batcher = Batcher(bad, sizes=[1], max_wait_ms=1, max_queue=8)
    state = _ready_state(batcher)
    batcher.start()
    import asyncio

    async def submit() -> None:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(batcher.submit([np.zeros(3, np.float32)]), 1.0)

    asyncio.run(submit())
    batcher._threads[0].join(5)
    with pytest.raises(APIError) as e:
        state.require_ready()
    assert e.value.status == 503 and "worker" in e.value.message and not state.ready


def test_protocol_factory_pickles_for_worker_processes() -> None:
    factory = pickle.loads(pickle.dumps(protocol_factory(Settings(max_header_kb=7))))
    assert factory.keywords["limits"].max_header_bytes == 7 * 1024


def test_limit_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="max_decode_pixels"):
        Settings.from_env({}, max_pixels=100, max_decode_pixels=50)
    with pytest.raises(ValueError, match="max_images"):
        Settings.from_env({"IRPE_MAX_IMAGES": "0"})


def test_health_shows_failure_text_only_with_the_key() -> None:
    from starlette.requests import Request

    from irpe.server.http.routes import _failure

    state = local_service(Settings(api_key="k"))
    state.readiness = Readiness.FAILED
    state.reason = "warm-up failed: /secret/path/model.onnx"

    def req(*headers: tuple[bytes, bytes]) -> Request:
        return Request({"type": "http", "method": "GET", "path": "/healthz", "headers": list(headers)})

    assert "/secret" not in _failure(req(), state)
    assert "/secret" not in _failure(req((b"authorization", b"Bearer nope")), state)
    assert _failure(req((b"authorization", b"Bearer k")), state) == state.failure
    open_state = local_service(Settings())
    open_state.readiness = Readiness.FAILED
    open_state.reason = state.failure
    assert _failure(req(), open_state) == state.failure  # no key set: nothing to hide it behind
