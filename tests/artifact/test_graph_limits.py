"""The load-time rewrites' memory budget (artifact/graph_limits.py) against hostile model.onnx files built here:
a 66 KB graph whose separable value-sum pattern asks for a 256 MB (n, n) index (1 GB at 130 KB), and a 10 MB
``int32_data`` lookup index, packed and unpacked. Each is refused before the table is allocated, or decoded
within the time budget: the load's peak RSS growth is measured in a fresh process."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from irpe.artifact.graph_limits import MEMORY_MB, Budget, RewriteRefused
from irpe.artifact.openvino_graph import _grouped_weights
from irpe.artifact.ort_graph import library, rewrite
from tests.artifact.hostile_graphs import model_bytes, separable_bomb, typed_index_model

needs_ops = pytest.mark.skipif(library() is None, reason="the _ortops C extension is not built (no C compiler)")
BOMB_N = 8192  # two 32 KB one-hots: a 66 KB file; the (n, n) int32 index is 256 MB, 512 MB with the writer's copy
INDEX_VALUES = 3162**2  # 10.0 MB of one-byte packed varints (a square: the rewrite takes it as a lookup)
# Time budget margin: between two budget checks the rewrite decodes at most 4096 fields or 256 KB of varints
# (under 10 ms on an idle core); one second more covers a 2-core machine shared with other test processes.
# The unbudgeted decode this guards against ran a 2 s budget to 4-10 s.
MARGIN_S = 1.0
# What a load may add besides the rewrite's budget: ONNX Runtime's session for the file as exported (its
# constants, its arena) and allocator slack. Measured: 20-30 MB.
SESSION_MB = 64
LOAD = """
import json, logging, sys
import onnxruntime as ort
from irpe.artifact.ort_graph import prepare
records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append(record.getMessage())
logging.getLogger("irpe.artifact").addHandler(Keep())
def peak_kb():  # VmHWM: this process's own peak (ru_maxrss would carry the parent's across exec)
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM:")).split()[1])
base = peak_kb()
source, lib = prepare(sys.argv[1], budget_s=float(sys.argv[2]))
so = ort.SessionOptions()
if lib:
    so.register_custom_ops_library(lib)
ort.InferenceSession(source, so, providers=["CPUExecutionProvider"])
grown = (peak_kb() - base) / 1024
print(json.dumps({"grown_mb": grown, "rewritten": lib is not None, "warnings": records}))
"""


def _load(path: Path, budget_s: float = 20.0) -> dict:
    """prepare + an ONNX Runtime session for ``path`` in a fresh process: its peak RSS growth and warnings."""
    out = subprocess.run([sys.executable, "-c", LOAD, str(path), str(budget_s)], capture_output=True, text=True,
                         timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@needs_ops
def test_a_quadratic_table_is_refused_before_it_is_built() -> None:
    data = model_bytes(*separable_bomb(BOMB_N))
    assert len(data) < 70_000
    budget = Budget()
    with pytest.raises(RewriteRefused, match=r"\(8192, 8192\) bucket index would take 512 MB, over the graph "
                                             r"rewrite's 512 MB memory budget"):
        rewrite(data, budget)
    assert budget.held < 2**20  # the two one-hots decoded: nothing that grows with n * n
    assert rewrite(model_bytes(*separable_bomb(64))) is not None  # the same pattern, small: rewritten


@needs_ops
@pytest.mark.timeout(180)
@pytest.mark.parametrize("n", [BOMB_N, 2 * BOMB_N])
def test_loading_a_small_file_that_asks_for_a_huge_table_costs_little(n: int, tmp_path: Path) -> None:
    """66 KB (and 130 KB) files: the load falls back to the file as exported, one warning line, and its peak
    RSS grows by ONNX Runtime's session only (the unbudgeted rewrite grew it by 1,024 MB, and 16x that at
    twice n)."""
    path = tmp_path / "model.onnx"
    path.write_bytes(model_bytes(*separable_bomb(n)))
    got = _load(path)
    assert not got["rewritten"] and got["grown_mb"] < SESSION_MB, got
    assert len(got["warnings"]) == 1 and "memory budget" in got["warnings"][0], got
    assert "runs the file as exported" in got["warnings"][0]


@needs_ops
@pytest.mark.timeout(180)
def test_a_10_mb_packed_int32_index_is_decoded_within_the_budgets(tmp_path: Path) -> None:
    data = typed_index_model(INDEX_VALUES)
    assert 10_000_000 < len(data) < 10_300_000
    start = time.monotonic()
    try:
        rewrite(data, Budget(2.0))
    except RewriteRefused:
        pass
    assert time.monotonic() - start < 2.0 + MARGIN_S
    path = tmp_path / "model.onnx"
    path.write_bytes(data)
    got = _load(path, budget_s=2.0)
    # the file's bytes, the rewritten copy (the index as int32: 4x its packed size) and the budget at most
    assert got["grown_mb"] < 2 * len(data) / 2**20 + 4 * INDEX_VALUES / 2**20 + MEMORY_MB + SESSION_MB, got
    assert got["rewritten"] or len(got["warnings"]) == 1, got


@needs_ops
@pytest.mark.timeout(120)
def test_a_10_mb_unpacked_int32_index_keeps_the_time_budget() -> None:
    """Unpacked, each value is its own field: decoded in Python, with the budget checked every 4096 fields."""
    data = typed_index_model(2236**2, packed=False)
    assert len(data) > 10_000_000
    start = time.monotonic()
    with pytest.raises(RewriteRefused, match="0.5 s budget"):
        rewrite(data, Budget(0.5))
    assert time.monotonic() - start < 0.5 + MARGIN_S


def test_the_openvino_grouped_weights_are_reserved_before_they_are_built() -> None:
    """A (gh, gh * m, d) table from a (gh, gh) one-hot and a (1, d) weight: 2 GB from 130 KB of constants."""
    gh, d = 128, 16384
    row_hot = np.ones((gh, 1, 1, gh), np.float32)  # every query row: key row r in bucket 0
    col_hot, w = np.zeros((gh, 1, 1), np.float32), np.zeros((1, d), np.float32)
    budget = Budget()
    with pytest.raises(RewriteRefused, match="grouped value weights .* over the graph rewrite's 512 MB memory"):
        _grouped_weights(row_hot, col_hot, w, None, budget)
    found = _grouped_weights(row_hot, col_hot, w[:, :4], None, Budget())  # the same with d = 4: built
    assert found is not None and found[1].shape == (gh, gh, 4)
