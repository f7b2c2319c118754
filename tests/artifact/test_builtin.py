"""The shipped digits model: small, recorded, torch-free to serve, and it passes the per-family table.

The table check serves the packaged artifact with a real ``irpe serve digits`` and POSTs every held-out
rendering of every family (3,960 images, as ``irpe bench digits`` does), scored against the targets.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import irpe
from irpe.artifact import load_artifact
from irpe.artifact.builtin import BUILTINS, builtin_artifact, resolve_artifact_dir
from irpe.bench.digits import offline_labels, rendered_items, score, served_labels
from irpe.training.renderings import FAMILIES
from tests.reliability.procs import serving

PER_FAMILY = None  # every held-out digit (360) in each of the 11 families: the README table itself
# The accuracy targets: >= 98% per family, >= 99% overall, served == offline.
FAMILY_MIN, OVERALL_MIN = 0.98, 0.99


def test_shipped_artifact_is_small_valid_and_records_how_it_was_trained() -> None:
    path = builtin_artifact("digits")
    art = load_artifact(path)  # checks the ONNX sha256 too
    assert sum(f.stat().st_size for f in path.iterdir() if f.is_file()) < 1_000_000
    assert art.name == "deit_micro_patch4_32_ctx_product_shared_k" and art.labels == [str(i) for i in range(10)]
    assert art.preprocess.fit == "ink" and art.preprocess.crop == 32
    t = art.training
    assert t["command"] == "irpe quickstart --retrain" and t["seed"] == 0 and t["data"] == "digits"
    assert t["irpe_version"] == irpe.__version__ and t["val_acc"] >= 0.98 and 0 < t["train_seconds"]
    assert json.loads((path / "model.json").read_text())["training"] == t


def test_names_resolve_to_the_package_and_directories_stay_directories(tmp_path: Path) -> None:
    assert BUILTINS == ("digits",) and resolve_artifact_dir("digits") == builtin_artifact("digits")
    assert resolve_artifact_dir(tmp_path) == tmp_path
    with pytest.raises(ValueError, match="not a builtin artifact; choose one of digits"):
        builtin_artifact("cifar")


def assert_family_table(artifact: Path) -> None:
    """Serve ``artifact`` with ``irpe serve`` and check the sampled per-family table (and served == offline)."""
    items = rendered_items(PER_FAMILY)
    blobs = [b for _, _, b, _ in items]
    with serving(artifact) as server:
        served = served_labels(server.url, blobs, per_request=25)
        maps = Path(f"/proc/{server.pid}/maps").read_text()
    assert "libtorch" not in maps  # the server never loaded torch
    table = score(items, served, offline_labels(resolve_artifact_dir(artifact), blobs))
    assert list(table) == list(FAMILIES) and all(f.total == (PER_FAMILY or 360) for f in table.values())
    report = {name: f"{f.served}/{f.total}" for name, f in table.items()}
    assert all(not f.mismatches for f in table.values()), "served differs from offline"
    assert all(f.served_acc >= FAMILY_MIN for f in table.values()), report
    assert sum(f.served for f in table.values()) >= OVERALL_MIN * len(items), report


def test_served_accuracy_per_rendering_family() -> None:
    assert_family_table(Path("digits"))
