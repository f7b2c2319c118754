"""``irpe bench export`` on tiny inputs: every graph is timed, ratios are relative to plain DeiT-S."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from irpe.cli import main
from irpe.export.bench import BENCH_MODELS, format_table, random_model, reference_onnx, run_export_bench


def test_run_export_bench_times_every_graph_per_batch():
    results = run_export_bench(["plain", "k"], [1, 2], repeats=2, warmup=0, img_size=16, log=lambda s: None)
    keys = {(r.model, r.kind, r.batch) for r in results}
    assert keys == {(m, k, b) for m in ("plain", "k") for k in ("irpe", "reference") for b in (1, 2)}
    assert all(r.median_ms > 0 and r.kernel_ms > 0 and r.runs == 2 for r in results)
    table = format_table(results)
    plain_rows = [ln for ln in table.splitlines() if ln.startswith("plain    irpe")]
    assert len(plain_rows) == 2 and all(ln.count("1.000x") == 2 for ln in plain_rows)  # the baseline
    assert "reference" in table


def test_unknown_bench_model_is_refused():
    with pytest.raises(ValueError, match="unknown bench model"):
        run_export_bench(["plain", "qkvv"], [1], repeats=1, img_size=32)
    assert set(BENCH_MODELS) == {"plain", "k", "qk", "qkv"}


def test_reference_export_bakes_in_the_traced_batch(tmp_path):
    """Why the reference is traced per batch size: torch.onnx.export of the port fixes B."""
    model = random_model(BENCH_MODELS["k"], img_size=32)
    sess = ort.InferenceSession(str(reference_onnx(model, tmp_path / "ref.onnx", batch=2)),
                                providers=["CPUExecutionProvider"])
    x = np.zeros((2, 3, 32, 32), np.float32)
    assert sess.run(None, {"images": x})[0].shape == (2, 1000)
    with pytest.raises(Exception):  # noqa: B017 - ONNX Runtime raises its own error types
        sess.run(None, {"images": np.zeros((3, 3, 32, 32), np.float32)})


def test_cli_bench_export_prints_the_table(capsys):
    argv = ["bench", "export", "--img-size", "16", "--batch", "1", "--repeats", "1", "--warmup", "0",
            "--models", "plain,qkv", "--no-reference"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "plain" in out and "qkv" in out and "1.000x" in out and "reference" not in out
    assert main(["bench", "export", "--batch", "0"]) == 2
