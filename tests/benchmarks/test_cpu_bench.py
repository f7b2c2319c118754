"""``irpe bench cpu``: option checks and the ratio table (timing itself is a benchmark, not a test)."""

from __future__ import annotations

import pytest

from irpe.bench.cpu import Row, format_plain_ratios, format_table, run_cpu_bench
from irpe.cli import main


def test_table_ratios_to_onnxruntime_fp32_to_the_nncf_anchor_and_to_plain() -> None:
    rows = [Row("k", "ort-fp32", 8, 100.0, 5, 80.0), Row("k", "ov-int8", 8, 30.0, 5, 20.0),
            Row("k", "nncf-int8", 8, 40.0, 5, 25.0), Row("k", "ov-bf16", 1, 10.0, 5, 9.0),
            Row("plain", "ov-int8", 8, 25.0, 5, 16.0), Row("plain", "ort-fp32", 8, 90.0, 5, 80.0)]
    lines = format_table(rows).splitlines()
    int8 = next(line for line in lines if line.startswith("k") and "ov-int8" in line).split()
    assert int8[4:7] == ["0.30x", "0.75x", "1.20x"] and int8[-3:] == ["0.25x", "0.80x", "1.25x"]
    assert next(line for line in lines if "ov-bf16" in line).split()[-3:] == ["n/a", "n/a", "n/a"]
    summary = format_plain_ratios(rows).splitlines()
    assert summary[0].split()[-3:] == ["k", "/", "plain"]
    assert summary[1].split() == ["8", "ort-fp32", "90.0", "1.11x"]
    assert summary[2].split() == ["8", "ov-int8", "25.0", "1.20x"] and len(summary) == 3
    assert format_plain_ratios(rows[:4]) == ""  # no plain model: no summary


def test_unknown_models_and_paths_and_bad_batches_are_refused(capsys) -> None:
    with pytest.raises(ValueError, match="unknown bench model/path"):
        run_cpu_bench(["huge"], [1])
    with pytest.raises(ValueError, match="paths: ort-fp32"):
        run_cpu_bench(["k"], [1], paths=["ort-fp16"])
    assert main(["bench", "cpu", "--batch", "8,x"]) == 2
    assert "--batch must be a comma list" in capsys.readouterr().err


def test_rounds_run_every_path_once_in_varying_order() -> None:
    """No path always follows the same one (a runtime's busy threads would slow whichever comes next)."""
    import numpy as np

    from irpe.bench.cpu import time_interleaved

    order: list[str] = []
    def runner(name: str):
        return lambda x: order.append(name)

    runs = {p: runner(p) for p in ("a", "b", "c", "d")}
    times = time_interleaved(runs, np.zeros(1), repeats=6, warmup=1)
    assert {k: len(v) for k, v in times.items()} == {p: 6 for p in runs}
    rounds = [tuple(order[i:i + 4]) for i in range(4, len(order), 4)]
    assert all(sorted(r) == list(runs) for r in rounds) and len(set(rounds)) > 1
