"""The OpenVINO engine and --precision: fp32, bf16 and int8 artifacts served with fp32's top-1, on each backend."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import numpy as np
import pytest

from irpe.artifact import load_artifact, save_artifact
from irpe.export import ExportOptions, export_artifact
from irpe.server.engines import EngineError, load_engine
from irpe.server.engines.openvino import cpu_has_bf16, import_openvino
from tests.export.int8_helpers import digits_arrays, digits_checkpoint, export_int8
from tests.server.helpers import encode, running_server

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(fp32 artifact without fidelity reports, int8 artifact with them) of the same checkpoint."""
    tmp = tmp_path_factory.mktemp("ov")
    ckpt = digits_checkpoint(tmp / "digits.pth")
    return export_artifact(ckpt, tmp / "fp32", ExportOptions(progress=False)), export_int8(ckpt, tmp / "int8")


@pytest.fixture(scope="module")
def samples(artifacts: tuple[Path, Path]) -> tuple[np.ndarray, np.ndarray]:
    """Held-out digit images whose fp32 top-1 wins by more than 2.5x the largest |d logit| the fidelity reports
    measured on them (so no measured deviation can flip it: a random-weight model has many near ties)."""
    fp32_dir, int8_dir = artifacts
    x, _ = digits_arrays(360, "val")
    ref = load_engine(fp32_dir, load_artifact(fp32_dir), backend="onnxruntime", threads=1).run(x)
    top2 = np.sort(ref, axis=1)[:, -2:]
    noise = max(r["max_abs_logit_diff"] for r in load_artifact(int8_dir).fidelity.values())
    keep = (top2[:, 1] - top2[:, 0]) > 2.5 * noise
    assert keep.sum() >= 8, f"only {keep.sum()} clear sample images"
    return x[keep], ref[keep].argmax(1)


BF16 = "bf16" if cpu_has_bf16(import_openvino().Core()) else "fp32"
CASES = [("fp32", "onnxruntime", "auto", "fp32"), ("fp32", "openvino", "fp32", "fp32"),
         ("fp32", "openvino", "bf16", BF16), ("int8", "onnxruntime", "auto", "int8+fp32"),
         ("int8", "openvino", "fp32", "int8+fp32"), ("int8", "openvino", "bf16", f"int8+{BF16}")]


@pytest.mark.parametrize(("kind", "backend", "precision", "running"), CASES)
def test_each_backend_and_precision_keeps_fp32_top1(artifacts, samples, kind, backend, precision, running) -> None:
    directory = artifacts[kind == "int8"]
    engine = load_engine(directory, load_artifact(directory), backend=backend, precision=precision, threads=1,
                         max_batch=8)
    assert (engine.info.backend, engine.info.precision) == (backend, running)
    x, top1 = samples
    assert np.array_equal(np.concatenate([engine.run(x[i:i + 8]) for i in range(0, len(x), 8)]).argmax(1), top1)


def test_openvino_fp32_matches_onnxruntime_and_is_thread_safe(artifacts, samples) -> None:
    fp32_dir = artifacts[0]
    art = load_artifact(fp32_dir)
    x = samples[0][:4]
    want = load_engine(fp32_dir, art, backend="onnxruntime", threads=1).run(x)
    engine = load_engine(fp32_dir, art, backend="openvino", precision="fp32", threads=1, streams=2)
    assert np.allclose(engine.run(x), want, atol=1e-4)
    got: dict[int, list[np.ndarray]] = {0: [], 1: []}

    def worker(k: int) -> None:
        for _ in range(10):
            got[k].append(engine.run(x))

    threads = [threading.Thread(target=worker, args=(k,)) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(len(v) == 10 and all(np.allclose(o, want, atol=1e-4) for o in v) for v in got.values())


def test_auto_backend_and_precision_choice(artifacts) -> None:
    fp32_dir, int8_dir = artifacts
    art = load_artifact(fp32_dir)
    assert load_engine(fp32_dir, art).info.backend == "onnxruntime"  # fp32, no bf16 report: same speed
    assert load_engine(fp32_dir, art, backend="openvino").info.precision == "fp32"  # never lowered unchecked
    int8 = load_engine(int8_dir, load_artifact(int8_dir))
    # export writes a bf16 report only where the CPU runs bf16 natively; without one, bf16 is never chosen
    passed = load_artifact(int8_dir).fidelity.get("bf16", {}).get("passed", False)
    assert (int8.info.backend, int8.info.precision) == ("openvino", f"int8+{BF16 if passed else 'fp32'}")
    with pytest.raises(EngineError, match="--precision bf16 needs --backend openvino"):
        load_engine(fp32_dir, art, backend="onnxruntime", precision="bf16")
    art.fidelity = {"bf16": {"passed": True}}
    save_artifact(art, fp32_dir)
    try:
        engine = load_engine(fp32_dir, load_artifact(fp32_dir))
        assert (engine.info.backend, engine.info.precision) == (("openvino", "bf16") if BF16 == "bf16"
                                                                else ("onnxruntime", "fp32"))
    finally:
        art.fidelity = {}
        save_artifact(art, fp32_dir)


def test_int8_artifact_served_unchanged_reports_backend_and_precision(artifacts) -> None:
    from irpe.artifact.preprocess import preprocess_image
    from irpe.training.digits import digit_image, split_digits

    fp32_dir, int8_dir = artifacts
    art = load_artifact(int8_dir)
    noise = max(r["max_abs_logit_diff"] for r in art.fidelity.values())
    ref = load_engine(fp32_dir, load_artifact(fp32_dir), backend="onnxruntime", threads=1)
    images = [digit_image(p) for p in split_digits()[1]]
    logits = ref.run(np.stack([preprocess_image(img, art.preprocess) for img in images]))
    top2 = np.sort(logits, axis=1)[:, -2:]
    clear = np.flatnonzero(top2[:, 1] - top2[:, 0] > 2.5 * noise)[:8]
    assert len(clear) >= 4
    with running_server(int8_dir, backend="openvino", max_batch=4) as url:
        model = httpx.get(url + "/v1/models").json()["models"][0]
        assert (model["backend"], model["precision"]) == ("openvino", f"int8+{BF16}")
        assert model["quantization"]["precision"] == "int8" and model["fidelity"]["int8"]["passed"]
        meta = httpx.get(f"{url}/v2/models/{model['name']}").json()
        assert meta["platform"] == "openvino" and meta["parameters"] == {"backend": "openvino",
                                                                         "precision": f"int8+{BF16}"}
        for i in clear:  # PNG over HTTP -> decode -> int8 graph on OpenVINO: fp32's label
            r = httpx.post(url + "/classify", content=encode(images[i]), headers={"content-type": "image/png"})
            assert r.status_code == 200 and r.json()["predictions"][0][0]["label"] == str(int(logits[i].argmax()))


def test_precision_rules_and_setting(artifacts) -> None:
    from irpe.server.config import Settings
    from irpe.server.engines.openvino import resolve_precision

    art = load_artifact(artifacts[0])
    assert resolve_precision("bf16", art, has_bf16=False) == "fp32"  # no native bf16: fp32 (and a log line)
    assert resolve_precision("bf16", art, has_bf16=True) == "bf16"
    assert resolve_precision("auto", art, has_bf16=True) == "fp32"  # no passing bf16 report: not lowered
    art.fidelity = {"bf16": {"passed": True}}
    assert resolve_precision("auto", art, has_bf16=True) == "bf16"
    assert resolve_precision("fp32", art, has_bf16=True) == "fp32"
    assert Settings.from_env(env={"IRPE_PRECISION": "bf16"}).precision == "bf16"
    with pytest.raises(ValueError, match="precision 'int4': choose one of auto, fp32, bf16"):
        Settings.from_env(env={}, precision="int4")


def test_backend_openvino_without_openvino_is_one_line_naming_the_extra(artifacts, tmp_path: Path) -> None:
    shadow = tmp_path / "no-openvino" / "openvino"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'openvino'\", name='openvino')\n")
    env = {**os.environ, "PYTHONPATH": f"{shadow.parent}{os.pathsep}{REPO}"}
    proc = subprocess.run([sys.executable, "-m", "irpe", "serve", str(artifacts[1]), "--backend", "openvino",
                           "--port", "0"], env=env, capture_output=True, text=True, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0 and len(lines) == 1, proc.stderr
    assert "pip install '.[cpu]' from the irpe-deploy checkout's root" in lines[0]
    assert "--backend onnxruntime" in lines[0]


def test_int8_on_onnxruntime_says_in_one_line_that_openvino_is_its_fast_path(artifacts, caplog) -> None:
    from irpe.server.engines.onnxruntime import INT8_ON_CPU

    fp32_dir, int8_dir = artifacts
    with caplog.at_level("WARNING", logger="irpe.server"):
        load_engine(fp32_dir, load_artifact(fp32_dir), backend="onnxruntime")
        assert INT8_ON_CPU not in caplog.messages
        engine = load_engine(int8_dir, load_artifact(int8_dir), backend="onnxruntime")
    assert engine.info.precision == "int8+fp32" and caplog.messages.count(INT8_ON_CPU) == 1
    assert "\n" not in INT8_ON_CPU and "OpenVINO" in INT8_ON_CPU
