"""A model version's lifecycle (server/hosting/version.py) on a real LocalHost: states as VersionState members
whose wire text is Triton's, an unload told apart from a failure by a field (never by the reason's text),
and an unload that waits for the request holding the version and no longer."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from irpe.server.config import Settings
from irpe.server.errors import APIError
from irpe.server.hosting.local import LocalHost
from irpe.server.hosting.version import UNLOADED, ModelVersion, VersionState
from tests.server.helpers import make_artifact


def test_states_are_members_whose_text_is_tritons() -> None:
    assert [state.value for state in VersionState] == ["LOADING", "READY", "UNAVAILABLE"]
    version = ModelVersion("m", 3, Path("."))
    assert version.state is VersionState.LOADING and not version.ready
    version.mark_ready()
    row = version.entry()
    assert row == {"name": "m", "version": "3", "state": "READY"} and type(row["state"]) is str
    assert json.dumps(row) == '{"name": "m", "version": "3", "state": "READY"}'


def test_an_unloaded_version_is_not_a_failure_and_a_failure_is_not_an_unload() -> None:
    version = ModelVersion("m", 1, Path("."))
    version.mark_unloaded()
    assert version.state is VersionState.UNAVAILABLE and version.unloaded
    assert version.reason == UNLOADED and version.failure == ""
    version.mark_unavailable("unloaded")  # a failure whose text happens to read "unloaded" is still a failure
    assert not version.unloaded and version.failure == "unloaded"


@pytest.fixture
def host(tmp_path: Path):
    make_artifact(tmp_path / "a" / "1")
    make_artifact(tmp_path / "b" / "1")
    settings = Settings(artifact_dir=str(tmp_path), inference_threads=1, model_control="explicit", timeout_s=10)
    local = LocalHost(settings)
    local.start()
    local.warm()
    yield local
    local.shutdown(5)


def test_an_unloaded_model_answers_404_and_its_index_row_says_unloaded(host: LocalHost) -> None:
    host.control("b", load=False)
    with pytest.raises(APIError) as e:
        host.lookup("b")
    assert e.value.status == 404 and "'b' is not loaded" in e.value.message
    assert {"name": "b", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"} in host.index()
    host.control("b", load=True)
    assert host.lookup("b").ready


def test_an_unload_waits_for_the_request_holding_the_version_and_no_longer(host: LocalHost) -> None:
    unloaded = threading.Event()
    with host.acquire("b") as held:
        worker = threading.Thread(target=lambda: (host.control("b", load=False), unloaded.set()))
        worker.start()
        assert not unloaded.wait(0.3)  # the request still holds it (the timeout is 10 s)
        assert held.state is VersionState.UNAVAILABLE and held.users == 1
        released = time.monotonic()
    assert unloaded.wait(5)
    assert time.monotonic() - released < 2  # woken when the last user left, not at the 10 s timeout
    worker.join(5)
    assert held.users == 0 and held.unloaded and held.engine is None
