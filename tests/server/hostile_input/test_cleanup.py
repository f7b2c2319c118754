"""What a server leaves behind, against a real ``irpe serve``: a SIGKILLed front end's shared-memory slot blocks
go with it (not when the whole server exits); repository index reasons carry no absolute paths."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx

from irpe.bench.frontend import tree_pids
from tests.reliability.procs import serving
from tests.server.helpers import encode, image
from tests.server.hosting.test_local import constant_artifact


def _frontend_blocks(pid: int) -> set[str]:
    """The /dev/shm blocks process ``pid`` maps."""
    maps = Path(f"/proc/{pid}/maps").read_text()
    return {line.split()[-1].removesuffix(" (deleted)") for line in maps.splitlines() if "/dev/shm/psm_" in line}


def _frontend(pid: int) -> int:
    for child in tree_pids(pid)[1:]:
        try:
            if Path(f"/proc/{child}/comm").read_text().strip() == "irpe-frontend0":
                return child
        except OSError:
            continue
    raise AssertionError("no irpe-frontend0 process")


def test_a_killed_front_ends_slot_blocks_are_removed(tiny_artifact: Path) -> None:
    with serving(tiny_artifact, "--frontends", "1", "--max-wait-ms", "1") as server:
        r = httpx.post(server.url + "/classify", content=encode(image()), headers={"content-type": "image/png"},
                       timeout=30)
        assert r.status_code == 200
        victim = _frontend(server.pid)
        blocks = _frontend_blocks(victim)
        assert blocks and all(os.path.exists(b) for b in blocks)
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(os.path.exists(b) for b in blocks):
            time.sleep(0.05)
        assert not [b for b in blocks if os.path.exists(b)]  # before: until the whole server exited


def test_index_reasons_carry_no_absolute_paths(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    constant_artifact(root / "alpha" / "1", 1, "alpha")
    constant_artifact(root / "broken" / "1", 2, "broken")
    (root / "broken" / "1" / "model.onnx").write_bytes(b"tampered")
    (root / "odd").mkdir()
    (root / "odd" / "config.json").write_text("{not json")
    with serving(root, "--model-control", "explicit", "--default-model", "alpha") as server:
        rows = httpx.post(server.url + "/v2/repository/index", json={}, timeout=10).json()
        reasons = {r["name"]: r.get("reason", "") for r in rows}  # a READY row has none, as in Triton
        assert reasons["broken"] and reasons["odd"], rows
        assert not [r for r in rows if str(tmp_path) in r.get("reason", "")], rows
        load = httpx.post(server.url + "/v2/repository/models/broken/load", json={}, timeout=30)
        assert load.status_code == 400 and str(tmp_path) not in load.text and "broken/1" in load.text, load.text
