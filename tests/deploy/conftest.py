"""Session fixtures of the container tests (tests/deploy/test_container.py, test_pod.py): the engine, the CPU
image built once per session, and an exported artifact the image's user can read."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.deploy.images import MODEL, TAG, build, find_engine


@pytest.fixture(scope="session")
def engine() -> list[str]:
    cmd = find_engine()
    if cmd is None:
        pytest.skip("no container engine: neither `docker info` nor `podman --runtime runc info` succeeds "
                    "(scripts/container-setup.sh installs podman on Debian as root)")
    return cmd


@pytest.fixture(scope="session")
def cpu_image(engine: list[str]) -> str:
    size = build(engine, "cpu", TAG)
    # 372 MB with ONNX Runtime alone; the OpenVINO runtime (CPU plugin + ONNX reader, stripped) adds ~110 MB.
    assert size < 500e6, f"CPU image is {size / 1e6:.0f} MB; the target is < 500 MB (< 400 MB without OpenVINO)"
    return TAG


@pytest.fixture(scope="session")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real `irpe export` of a small random iRPE model, readable by the image's user (uid 10001)."""
    if importlib.util.find_spec("torch") is None:
        pytest.fail("torch is not installed: scripts/test.sh installs the export extra")
    import torch

    from irpe.export import ExportOptions, export_artifact
    from irpe.models import create_model

    tmp = tmp_path_factory.mktemp("container")
    torch.manual_seed(0)
    ckpt = tmp / "model.pth"
    torch.save(create_model(MODEL).eval().state_dict(), ckpt)
    out = Path(export_artifact(ckpt, tmp / "artifact", ExportOptions(name=MODEL, progress=False)))
    for p in [out, *out.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return out
