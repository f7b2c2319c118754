"""Model control against a real ``irpe serve``: it refuses what a web page can make a browser send, load parameters it
does not support, and the inference key where an admin key is set; off loopback it needs the admin key.
tritonclient's own load/unload keep working."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from tests.reliability.procs import ServerProcess, server_env, serving, start_server
from tests.server.helpers import running_server
from tests.server.hosting.test_local import constant_artifact


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("f3")
    constant_artifact(root / "alpha" / "1", 1, "alpha")
    constant_artifact(root / "beta" / "1", 8, "beta")
    return root


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[ServerProcess]:
    with serving(repo, "--model-control", "explicit", "--default-model", "alpha", "--max-wait-ms", "1") as s:
        yield s


def _ready(url: str, model: str) -> bool:
    return httpx.get(f"{url}/v2/models/{model}/ready", timeout=10).status_code == 200


# What a page on another site can make a browser send without a preflight (no JSON content type).
CROSS_SITE = [
    {"content-type": "text/plain;charset=UTF-8", "origin": "http://evil.example", "sec-fetch-site": "cross-site"},
    {"origin": "http://evil.example", "sec-fetch-site": "cross-site"},  # fetch() of a typeless Blob
    {"content-type": "application/x-www-form-urlencoded", "origin": "null"},  # a sandboxed frame's form
    {"content-type": "text/plain", "sec-fetch-site": "same-site"},  # another port or subdomain of this host
    {"content-type": "text/plain", "origin": "http://localhost:1"},
]


@pytest.mark.parametrize("headers", CROSS_SITE)
def test_a_cross_site_unload_is_refused(server: ServerProcess, headers: dict[str, str]) -> None:
    """A cross-site unload is refused, and the model (beta, or the default model behind /readyz) stays."""
    for model in ("beta", "alpha"):
        r = httpx.post(f"{server.url}/v2/repository/models/{model}/unload", content=b"{}", headers=headers,
                       timeout=30)
        assert r.status_code == 403, (headers, r.status_code, r.text)
        assert _ready(server.url, model)
    assert httpx.get(server.url + "/readyz", timeout=10).status_code == 200


def test_a_non_json_body_is_refused_and_same_origin_json_works(server: ServerProcess) -> None:
    r = httpx.post(f"{server.url}/v2/repository/models/beta/unload", content=b"{}",
                   headers={"content-type": "text/plain"}, timeout=30)
    assert r.status_code == 415 and "application/json" in r.json()["error"] and _ready(server.url, "beta")
    own = {"origin": server.url, "sec-fetch-site": "same-origin"}
    assert httpx.post(f"{server.url}/v2/repository/models/beta/unload", json={}, headers=own,
                      timeout=30).status_code == 200
    assert not _ready(server.url, "beta")
    assert httpx.post(f"{server.url}/v2/repository/models/beta/load", json={}, headers=own,
                      timeout=30).status_code == 200
    assert _ready(server.url, "beta")


@pytest.mark.parametrize("parameters", [{"config": '{"backend": "python"}'}, {"file:1/model.onnx": "AAAA"},
                                        {"unknown": 1}])
def test_unsupported_load_parameters_are_a_400(server: ServerProcess, parameters: dict) -> None:
    """Load parameters the server does not support are a 400, not ignored."""
    r = httpx.post(f"{server.url}/v2/repository/models/beta/load", json={"parameters": parameters}, timeout=30)
    assert r.status_code == 400 and "not supported" in r.json()["error"], r.text
    for bad in (b"[]", b'{"parameters": 3}', b'{"other": {}}', b"{"):
        r = httpx.post(f"{server.url}/v2/repository/models/beta/load", content=bad, timeout=30)
        assert r.status_code == 400, (bad, r.text)
    assert _ready(server.url, "beta")


def test_tritonclient_still_loads_and_unloads(server: ServerProcess) -> None:
    """tritonclient sends ``{}`` (load) and ``unload_dependents`` (unload) with no content type."""
    client = triton.InferenceServerClient(server.url.removeprefix("http://"))
    try:
        client.unload_model("beta")
        assert not client.is_model_ready("beta")
        client.load_model("beta")
        assert client.is_model_ready("beta")
        client.unload_model("beta", unload_dependents=True)
        client.load_model("beta")
        with pytest.raises(InferenceServerException) as e:
            client.load_model("beta", config='{"max_batch_size": 8}')
        assert e.value.status() == "400"
    finally:
        client.close()


def test_the_admin_key_and_not_the_inference_key_controls_models(repo: Path) -> None:
    """With IRPE_ADMIN_KEY set, the inference key neither loads nor unloads."""
    env = server_env(IRPE_API_KEY="inference-key", IRPE_ADMIN_KEY="admin-key")
    s = start_server(repo, "--model-control", "explicit", "--default-model", "alpha", env=env)
    try:
        url = f"{s.url}/v2/repository/models/beta/unload"
        inference, admin = ({"authorization": f"Bearer {k}"} for k in ("inference-key", "admin-key"))
        assert httpx.post(url, json={}, headers=inference, timeout=30).status_code == 403
        assert httpx.get(f"{s.url}/v2/models/beta/ready", headers=inference, timeout=10).status_code == 200
        assert httpx.post(url, json={}, timeout=30).status_code == 401  # no key at all: the key check first
        assert httpx.get(f"{s.url}/v2/models/alpha/ready", headers=admin, timeout=10).status_code == 401
        assert httpx.post(url, json={}, headers=admin, timeout=30).status_code == 200
        assert httpx.get(f"{s.url}/v2/models/beta/ready", headers=inference, timeout=10).status_code == 503
        assert "admin-key" not in s.output()
    finally:
        s.stop()


def test_off_loopback_model_control_needs_an_admin_key(repo: Path) -> None:
    """A server configured for a non-loopback bind (served here on 127.0.0.1) without an admin key."""
    with running_server(repo, host="0.0.0.0", insecure=True, model_control="explicit", default_model="alpha") as url:
        r = httpx.post(f"{url}/v2/repository/models/beta/unload", json={}, timeout=30)
        assert r.status_code == 403 and "IRPE_ADMIN_KEY" in r.json()["error"]
        assert _ready(url, "beta")
    with running_server(repo, host="0.0.0.0", insecure=True, model_control="explicit", default_model="alpha",
                        admin_key="adm") as url:
        r = httpx.post(f"{url}/v2/repository/models/beta/unload", json={}, headers={"authorization": "Bearer adm"},
                       timeout=30)
        assert r.status_code == 200 and not _ready(url, "beta")


GRPC_UNLOAD = """
import sys
import tritonclient.grpc as g
from tritonclient.utils import InferenceServerException
client = g.InferenceServerClient(sys.argv[1])
try:
    client.unload_model("beta", headers={"authorization": "Bearer " + sys.argv[2]})
    print("OK")
except InferenceServerException as e:
    print(e.status())
"""


def test_grpc_model_control_takes_the_admin_key_too(repo: Path) -> None:
    """The same rule over gRPC: the inference key does not unload, the admin key does."""
    import re
    import subprocess
    import sys

    env = server_env(IRPE_API_KEY="inference-key", IRPE_ADMIN_KEY="admin-key")
    s = start_server(repo, "--model-control", "explicit", "--default-model", "alpha", "--grpc-port", "0", env=env)
    try:
        address = re.search(r"gRPC listening on ([0-9.]+:[0-9]+)", s.output()).group(1)

        def unload(key: str) -> str:
            out = subprocess.run([sys.executable, "-c", GRPC_UNLOAD, address, key], capture_output=True, text=True,
                                 timeout=60)
            return out.stdout.strip() or out.stderr[-500:]

        assert unload("inference-key") == "StatusCode.PERMISSION_DENIED"
        assert _ready_with(s.url, "beta", "inference-key")
        assert unload("admin-key") == "OK"
        assert not _ready_with(s.url, "beta", "inference-key")
    finally:
        s.stop()


def _ready_with(url: str, model: str, key: str) -> bool:
    return httpx.get(f"{url}/v2/models/{model}/ready", headers={"authorization": f"Bearer {key}"},
                     timeout=10).status_code == 200


def test_the_log_settings_follow_the_model_control_rules(repo: Path) -> None:
    """POST /v2/logging (Triton's log settings; turning the log off hides what the server does) takes the admin
    key where one is set, refuses cross-site pages and non-JSON bodies, and off loopback needs an admin key.
    Before: the inference key changed them, from anywhere."""
    quiet = {"log_info": False, "log_warning": False, "log_verbose_level": 0}
    with running_server(repo, default_model="alpha", api_key="inf", admin_key="adm") as url:
        inference, admin = ({"authorization": f"Bearer {k}"} for k in ("inf", "adm"))
        before = httpx.get(f"{url}/v2/logging", headers=inference, timeout=10).json()
        r = httpx.post(f"{url}/v2/logging", json=quiet, headers=inference, timeout=10)
        assert r.status_code == 403 and "admin key" in r.json()["error"]
        for extra in ({"origin": "http://evil.example"}, {"sec-fetch-site": "cross-site"}):
            r = httpx.post(f"{url}/v2/logging", json=quiet, headers={**admin, **extra}, timeout=10)
            assert r.status_code == 403 and "refused" in r.json()["error"]
        r = httpx.post(f"{url}/v2/logging", content=b"{}", headers={**admin, "content-type": "text/plain"}, timeout=10)
        assert r.status_code == 415
        assert httpx.get(f"{url}/v2/logging", headers=inference, timeout=10).json() == before  # nothing changed
        changed = httpx.post(f"{url}/v2/logging", json=quiet, headers=admin, timeout=10)
        assert changed.status_code == 200 and changed.json()["log_info"] is False
        restore = {k: before[k] for k in ("log_info", "log_warning", "log_error", "log_verbose_level")}
        assert httpx.post(f"{url}/v2/logging", json=restore, headers=admin, timeout=10).json() == before
    with running_server(repo, default_model="alpha", host="0.0.0.0", insecure=True) as url:
        r = httpx.post(f"{url}/v2/logging", json=quiet, timeout=10)
        assert r.status_code == 403 and "IRPE_ADMIN_KEY" in r.json()["error"]
