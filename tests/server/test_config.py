"""Settings: defaults < IRPE_* variables < CLI flags; bad values name the setting."""

from __future__ import annotations

import pytest

from irpe.server.config import Settings


def test_env_then_overrides() -> None:
    env = {"IRPE_MAX_BATCH": "8", "IRPE_MAX_WAIT_MS": "2.5", "IRPE_API_KEY": "k", "IRPE_MAX_PIXELS": "1e6"}
    s = Settings.from_env(env, max_batch=4, port=None)
    assert (s.max_batch, s.max_wait_ms, s.api_key, s.max_pixels, s.port) == (4, 2.5, "k", 1_000_000, 8000)
    assert s.public()["api_key"] == "***"
    assert Settings.from_env(s.to_env()) == s


@pytest.mark.parametrize(("env", "match"), [({"IRPE_MAX_BATCH": "x"}, "IRPE_MAX_BATCH"),
                                            ({"IRPE_DEVICE": "tpu"}, "device"),
                                            ({"IRPE_MAX_QUEUE": "0"}, "max_queue")])
def test_bad_values(env: dict[str, str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Settings.from_env(env)


def test_frontends_auto_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """Default 'auto': one process on a CPU; on a GPU one front end per usable core but one (the engine's)."""
    from irpe.server import config

    monkeypatch.setattr(config, "usable_cpus", lambda: 16)
    assert Settings().frontends == -1 and Settings().resolved_frontends() == 0
    assert Settings(device="cuda").resolved_frontends() == 15
    assert Settings(device="cuda", frontends=3).resolved_frontends() == 3
    assert Settings(device="cuda", frontends=0).resolved_frontends() == 0  # explicit: one process
    monkeypatch.setattr(config, "usable_cpus", lambda: 1)
    assert Settings(device="cuda").resolved_frontends() == 1
    assert Settings.from_env(env={"IRPE_FRONTENDS": "auto"}).frontends == -1
    assert Settings.from_env(env={"IRPE_FRONTENDS": "2"}).frontends == 2
