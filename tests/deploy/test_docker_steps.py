"""docs/deploy/docker.md's steps on the files getting-started leaves (artifacts/digits exported): step 2's copy of
the shipped model lands in a directory of its own, and deploy/docker-compose.yml, run by Debian's podman-compose
in that layout with IRPE_MODELS unset, serves artifacts/digits (the key required). The compose file is run from a
copy whose only changes are the image (the test's CPU build) and the published port (127.0.0.1 and a free port
instead of every address's 8000)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest

from tests.deploy.images import MODEL, run
from tests.server.helpers import encode, free_port, image

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "deploy" / "docker.md"
KEY = "compose-test-key"


def _block(marker: str) -> str:
    (block,) = [b for b in re.findall(r"```bash\n(.*?)```", DOC.read_text(), re.S) if marker in b]
    return block


def _tutorial_checkout(tmp: Path, artifact: Path) -> Path:
    """A checkout after getting-started: deploy/docker-compose.yml and artifacts/digits (an exported artifact)."""
    root = tmp / "checkout"
    (root / "deploy").mkdir(parents=True)
    shutil.copytree(artifact, root / "artifacts" / "digits")
    return root


def test_step_2_copies_the_shipped_model_beside_the_tutorials(artifact: Path, tmp_path: Path) -> None:
    root = _tutorial_checkout(tmp_path, artifact)
    before = sorted(p.name for p in (root / "artifacts" / "digits").iterdir())
    script = _block("builtin_artifact").replace("python -c", f"{sys.executable} -c") + 'echo "$MODEL_DIR"\n'
    out = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=root, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    model_dir = Path(out.stdout.split()[-1])
    assert model_dir.parent == root / "artifacts" and (model_dir / "model.json").is_file(), model_dir
    assert sorted(p.name for p in (root / "artifacts" / "digits").iterdir()) == before  # nothing nested inside


@pytest.mark.container
def test_compose_serves_the_tutorials_artifact(engine: list[str], cpu_image: str, artifact: Path,
                                               tmp_path: Path) -> None:
    if engine[0] != "podman" or shutil.which("podman-compose") is None:
        pytest.skip("needs podman and podman-compose (scripts/container-setup.sh installs both)")
    root = _tutorial_checkout(tmp_path, artifact)
    port, project = free_port(), f"irpe{uuid.uuid4().hex[:6]}"
    text = (REPO / "deploy" / "docker-compose.yml").read_text()
    assert text.count('"8000:8000"') == 1 and text.count("image: irpe-serve:cpu") == 1
    text = text.replace('"8000:8000"', f'"127.0.0.1:{port}:8000"').replace("image: irpe-serve:cpu",
                                                                          f"image: {cpu_image}")
    (root / "deploy" / "docker-compose.yml").write_text(text)
    line = [ln for ln in _block("--profile cpu up irpe-cpu").splitlines() if "--profile cpu" in ln][0]
    cmd = line.split("#")[0].split()
    assert cmd[:2] == ["docker", "compose"] and cmd[-4:] == ["--profile", "cpu", "up", "irpe-cpu"], cmd
    compose = ["podman-compose", "-p", project, *cmd[2:-4]]  # podman-compose 1.0.3: no --profile
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "IRPE_API_KEY": KEY}
    try:
        run([*compose, "up", "-d", "irpe-cpu"], cwd=root, env=env, timeout=300)
        url = f"http://127.0.0.1:{port}"
        _wait_ready(url)
        files = [("file", ("a.png", encode(image((64, 48))), "image/png"))]
        assert httpx.post(url + "/classify", files=files, timeout=30).status_code == 401
        r = httpx.post(url + "/classify", files=files, headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
        assert r.status_code == 200 and r.json()["model"] == MODEL, r.text
    finally:
        run([*compose, "down"], cwd=root, env=env, timeout=120, check=False)
        run([*engine, "network", "rm", "-f", f"{project}_default"], check=False)


def _wait_ready(url: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"compose's irpe-cpu not ready on {url} within {timeout} s")
