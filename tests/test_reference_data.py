"""The reference data lives in the repository (tests/data/reference) and is what PROVENANCE.md says it is."""

from __future__ import annotations

import hashlib

from tests.conftest import REFERENCE


def _listed() -> dict[str, str]:
    lines = (REFERENCE / "SHA256SUMS").read_text().splitlines()
    return {name: digest for digest, name in (line.split("  ", 1) for line in lines if line.strip())}


def test_every_reference_file_matches_its_recorded_sha256():
    listed = _listed()
    assert len(listed) == 10
    for name, digest in listed.items():
        assert hashlib.sha256((REFERENCE / name).read_bytes()).hexdigest() == digest, name


def test_no_unlisted_files_and_provenance_names_each_one():
    on_disk = {p.relative_to(REFERENCE).as_posix() for p in REFERENCE.rglob("*") if p.is_file()}
    assert on_disk - set(_listed()) == {"SHA256SUMS", "PROVENANCE.md"}
    provenance = (REFERENCE / "PROVENANCE.md").read_text()
    for name in ("bucket_ids.npz", "bucket_ids_index.json", "checkpoint_layout.json", "model_vectors"):
        assert name in provenance
