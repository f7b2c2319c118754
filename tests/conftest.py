"""Shared fixtures: the reference data beside the checkout and small checkpoints made on the fly."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
REFERENCE = Path(os.environ.get("IRPE_REFERENCE_DIR", REPO.parent / "shared" / "reference"))


@pytest.fixture(scope="session")
def reference_dir() -> Path:
    if not (REFERENCE / "bucket_ids.npz").is_file():
        pytest.skip(f"reference data not found at {REFERENCE} (set IRPE_REFERENCE_DIR)")
    return REFERENCE
