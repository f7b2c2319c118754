"""Engine construction: batch sizes, providers, TensorRT without the package, plugin graphs."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from irpe.artifact import load_artifact, save_artifact
from irpe.server.engines import EngineError, batch_sizes, load_engine, warm_up
from tests.server.helpers import expected_logits


def test_batch_sizes() -> None:
    assert batch_sizes(1) == [1]
    assert batch_sizes(16) == [1, 2, 4, 8, 16]
    assert batch_sizes(12) == [1, 2, 4, 8, 12]


def test_ort_engine_runs_and_reports_providers(tiny_artifact: Path) -> None:
    art = load_artifact(tiny_artifact)
    engine = load_engine(tiny_artifact, art, max_batch=4, threads=1)
    assert engine.info.backend == "onnxruntime" and engine.info.providers == ["CPUExecutionProvider"]
    assert engine.info.batch_sizes == [1, 2, 4]
    x = np.random.default_rng(0).standard_normal((3, 3, 32, 32), dtype=np.float32)
    assert np.allclose(engine.run(x), expected_logits(x), atol=1e-5)
    assert warm_up(engine, art) >= 0


def test_tensorrt_backend_without_package_is_a_clear_error(tiny_artifact: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # `import tensorrt` fails even where it is installed
    own = tmp_path / "a"  # a copy: the session-wide artifact stays untouched
    shutil.copytree(tiny_artifact, own)
    art = load_artifact(own)
    (own / "model.plan").write_bytes(b"plan")
    with pytest.raises(EngineError, match="pip install tensorrt"):
        load_engine(own, art, backend="tensorrt", device="cuda")
    with pytest.raises(EngineError, match="--device cuda"):
        load_engine(own, art, backend="tensorrt", device="cpu")


def test_plugin_graph_is_refused_with_the_fix(tiny_artifact: Path, tmp_path: Path) -> None:
    shutil.copytree(tiny_artifact, tmp_path / "a")
    art = load_artifact(tmp_path / "a")
    art.rpe_plugin = True
    save_artifact(art, tmp_path / "a")
    with pytest.raises(EngineError, match="without --rpe-plugin"):
        load_engine(tmp_path / "a", load_artifact(tmp_path / "a"))


def test_cuda_without_a_driver_is_one_line_naming_the_fix() -> None:
    """--device cuda on a host (or container started without --gpus) that has no NVIDIA driver."""
    import ctypes

    from irpe.server.engines.onnxruntime import _require_cuda_driver

    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        with pytest.raises(EngineError, match=r"libcuda\.so\.1 not found.*--gpus all") as e:
            _require_cuda_driver()
        assert "\n" not in str(e.value)
    else:  # a driver is installed: nothing to refuse
        _require_cuda_driver()


def test_solo_session_gives_the_same_logits_and_stays_only_when_faster(tiny_artifact: Path) -> None:
    """run_solo answers as run does; keep_solo drops the all-core session unless it takes at most ``gain`` of
    the shared session's time (gain 0: never kept; a huge gain: always kept)."""
    art = load_artifact(tiny_artifact)
    x = np.random.default_rng(0).random((1, 3, 32, 32), dtype=np.float32)
    keep = load_engine(tiny_artifact, art, threads=1, max_batch=4, solo_threads=2)
    assert keep.solo_session is not None and keep.keep_solo(x, rounds=2, gain=1e9)
    spin = "session.intra_op.allow_spinning"  # the solo session spins (2 threads sleeping took 1 thread's time)
    assert keep.solo_session.get_session_options().get_session_config_entry(spin) == "1"
    assert keep.session.get_session_options().get_session_config_entry(spin) == "0"  # shared: beside decoding
    stop = "session.force_spinning_stop"  # ... inside a run only: after it the event loop needs the cores
    assert keep.solo_session.get_session_options().get_session_config_entry(stop) == "1"
    np.testing.assert_array_equal(keep.run_solo(x), keep.run(x))
    drop = load_engine(tiny_artifact, art, threads=1, max_batch=4, solo_threads=2)
    assert not drop.keep_solo(x, rounds=2, gain=0.0) and drop.solo_session is None
    np.testing.assert_array_equal(drop.run_solo(x), drop.run(x))
    assert load_engine(tiny_artifact, art, threads=2, max_batch=4, solo_threads=2).solo_session is None


def test_keep_solo_stops_after_the_round_that_spends_its_budget(tiny_artifact: Path) -> None:
    """A model whose runs take seconds would spend minutes in keep_solo's rounds: one round that spends
    ``budget_s`` is the last (each round runs both sessions once), and the full count runs within it."""
    art = load_artifact(tiny_artifact)
    x = np.zeros((1, 3, 32, 32), np.float32)
    counted = {}
    for budget in (0.0, 1e9):
        engine = load_engine(tiny_artifact, art, threads=1, max_batch=4, solo_threads=2)
        runs: list[object] = []
        real = engine._run
        engine._run = lambda session, images, real=real, runs=runs: runs.append(session) or real(session, images)
        engine.keep_solo(x, rounds=5, gain=1e9, budget_s=budget)
        counted[budget] = len(runs)
    assert counted == {0.0: 2, 1e9: 10}


def test_a_rewritten_graph_that_does_not_load_falls_back_to_the_file(
        tiny_artifact: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The irpe.ort rewrite is a speed-up: if its graph does not load, the engine says so and serves the file."""
    from irpe.artifact.ort_graph import library
    from irpe.server.engines import onnxruntime as ort_engine

    if library() is None:
        pytest.skip("the _ortops C extension is not built")
    monkeypatch.setattr(ort_engine, "prepare", lambda path: (b"\x0a\x05not a model", library()))
    art = load_artifact(tiny_artifact)
    with caplog.at_level("WARNING", logger="irpe.server"):
        engine = load_engine(tiny_artifact, art, max_batch=2, threads=1)
    assert engine.info.custom_ops == [] and "the iRPE custom ops do not load here" in caplog.text
    x = np.random.default_rng(0).standard_normal((2, 3, 32, 32), dtype=np.float32)
    assert np.allclose(engine.run(x), expected_logits(x), atol=1e-5)
