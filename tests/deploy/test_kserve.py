"""deploy/kserve: the ServingRuntime and both InferenceServices match the kserve SDK's models field by field
(unknown fields, types and required fields refused), the pod KServe would build from runtime + InferenceService
validates strictly against the Kubernetes schemas, and the runtime runs the image as the Dockerfile and
deploy/k8s do. The Triton InferenceService points at the repository `irpe export --format triton` writes."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.kube import kserve_pod

REPO = Path(__file__).resolve().parents[2]
KSERVE = REPO / "deploy" / "kserve"
yaml = pytest.importorskip("yaml", reason="pyyaml is in the dev extra")
kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is in the dev extra")
k8s_models = pytest.importorskip("kubernetes.client.models", reason="kubernetes comes with kserve (dev extra)")
K8S_VERSIONS = ("1.29.0", kv.utils.latest_version())


def check_with_the_sdk(docs: list[dict]) -> list[dict]:
    """One verdict per document, ``{"ok": model class}`` or ``{"error": message}`` (tests/deploy/kserve_sdk.py,
    in its own process: kserve's v2 gRPC messages clash with tritonclient's in one process)."""
    out = subprocess.run([sys.executable, "-m", "tests.deploy.kserve_sdk"], input=json.dumps(docs), cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _docs() -> dict[str, dict]:
    return {f.name: yaml.safe_load(f.read_text()) for f in sorted(KSERVE.glob("*.yaml"))}


def _runtime() -> dict:
    return _docs()["servingruntime.yaml"]


def _isvc(name: str = "inferenceservice.yaml") -> dict:
    return _docs()[name]


def _k8s_deployment() -> dict:
    return yaml.safe_load((REPO / "deploy" / "k8s" / "deployment.yaml").read_text())


BROKEN = {  # a broken copy of each manifest -> what the SDK check must say
    "typo": ("servingruntime.yaml", lambda d: d["spec"].update(supportedModelFormat=d["spec"].pop(
        "supportedModelFormats")), "has no field supportedModelFormat$"),
    "type": ("servingruntime.yaml", lambda d: d["spec"]["containers"][0]["ports"][0].update(containerPort="8000"),
             "containerPort: expected int"),
    "required": ("servingruntime.yaml", lambda d: d["spec"]["containers"][0].pop("name"),
                 r"name\s+Field required"),  # kubernetes' models are pydantic
    "nested-typo": ("servingruntime.yaml", lambda d: d["spec"]["containers"][0]["securityContext"].update(
        readOnlyRootFileSystem=True), "has no field readOnlyRootFileSystem"),
    "required-isvc": ("inferenceservice.yaml", lambda d: d["spec"]["predictor"]["model"].pop("modelFormat"),
                      "`model_format`, must not be `None`"),  # kserve's are generated OpenAPI classes
    "type-isvc": ("inferenceservice.yaml", lambda d: d["spec"]["predictor"].update(minReplicas="2"),
                  "minReplicas: expected int"),
    "api-version": ("inferenceservice-triton.yaml", lambda d: d.update(apiVersion="serving.kserve.io/v1alpha1"),
                    "apiVersion must be serving.kserve.io/v1beta1"),
}


def test_every_manifest_matches_the_kserve_sdk_models() -> None:
    docs = _docs()
    assert sorted(docs) == ["inferenceservice-triton.yaml", "inferenceservice.yaml", "servingruntime.yaml"]
    verdicts = check_with_the_sdk(list(docs.values()))
    assert dict(zip(docs, verdicts, strict=True)) == {
        "inferenceservice-triton.yaml": {"ok": "V1beta1InferenceService"},
        "inferenceservice.yaml": {"ok": "V1beta1InferenceService"},
        "servingruntime.yaml": {"ok": "V1alpha1ServingRuntime"}}


def test_sdk_check_refuses_broken_copies() -> None:
    broken = []
    for name, mutate, _ in BROKEN.values():
        doc = copy.deepcopy(_docs()[name])
        mutate(doc)
        broken.append(doc)
    for (case, (_, _, message)), verdict in zip(BROKEN.items(), check_with_the_sdk(broken), strict=True):
        assert re.search(message, verdict.get("error", "")), (case, verdict)


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("isvc", ["inferenceservice.yaml"])
def test_the_merged_pod_validates_against_kubernetes(version: str, isvc: str) -> None:
    pod = kserve_pod(_runtime(), _isvc(isvc))
    try:
        kv.validate(pod, version, strict=True)
    except kv.utils.ValidationError as e:
        pytest.fail(f"runtime + {isvc} make a pod Kubernetes {version} refuses: {e}")
    broken = copy.deepcopy(pod)
    broken["spec"]["securityContext"]["runAsUser"] = "irpe"
    with pytest.raises(kv.utils.ValidationError):
        kv.validate(broken, version, strict=True)


def test_runtime_runs_the_image_as_the_dockerfile_and_k8s_do() -> None:
    from irpe.cli import build_parser

    runtime = _runtime()
    (c,) = runtime["spec"]["containers"]
    (k8s,) = _k8s_deployment()["spec"]["template"]["spec"]["containers"]
    dockerfile = (REPO / "Dockerfile").read_text()
    entrypoint = re.search(r"^ENTRYPOINT (\[.*\])$", dockerfile, re.M)[1]
    assert c["name"] == "kserve-container"  # KServe merges the model container into this one
    assert c["image"] == k8s["image"] and c["args"] == k8s["args"]
    assert yaml.safe_load(entrypoint)[:2] == c["command"][:2] == ["irpe", "serve"]
    assert c["command"][2] == "/mnt/models"  # where KServe puts the storageUri's content
    args = build_parser().parse_args([*c["command"][1:], *c["args"]])  # every flag is one `irpe serve` knows
    assert args.artifact_dir == "/mnt/models" and args.max_batch == 32
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    env = {e["name"]: e for e in c["env"]}
    assert ports == {"http": 8000, "grpc": 8001}
    assert re.search(r"^\s*IRPE_PORT=8000\b", dockerfile, re.M) and "EXPOSE 8000" in dockerfile
    assert env["IRPE_PORT"]["value"] == str(ports["http"]) and env["IRPE_GRPC_PORT"]["value"] == str(ports["grpc"])
    (k8s_key,) = [e for e in k8s["env"] if e["name"] == "IRPE_API_KEY"]
    assert env["IRPE_API_KEY"] == k8s_key and not k8s_key["valueFrom"]["secretKeyRef"].get("optional", False)
    for probe in ("startupProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["path"] == k8s[probe]["httpGet"]["path"]
        assert c[probe]["httpGet"]["port"] == ports["http"]
    assert c["readinessProbe"]["grpc"] == k8s["readinessProbe"]["grpc"] == {"port": ports["grpc"]}  # grpc.health.v1
    spec = runtime["spec"]
    assert {"v2", "grpc-v2"} <= set(spec["protocolVersions"])
    assert not any(k.startswith("prometheus.kserve.io/") for k in spec.get("annotations", {}))  # needs the key


def test_inference_service_is_hardened_and_bounded() -> None:
    pod = kserve_pod(_runtime(), _isvc())["spec"]
    (c,) = pod["containers"]
    assert pod["automountServiceAccountToken"] is False and pod["terminationGracePeriodSeconds"] > 30
    ps = pod["securityContext"]
    assert ps["runAsNonRoot"] is True and ps["runAsUser"] == 10001 and ps["seccompProfile"]["type"] == "RuntimeDefault"
    sc = c["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc.get("privileged", False) is False
    (tmp,) = [v for v in pod["volumes"] if v["name"] == "tmp"]
    assert tmp["emptyDir"]["sizeLimit"] and {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]
    r = c["resources"]
    assert r["requests"] == r["limits"] and {"cpu", "memory", "nvidia.com/gpu"} <= set(r["limits"])  # Guaranteed


def _shm(spec: dict, container: dict) -> dict:
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/dev/shm"]
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    return volume["emptyDir"]


def test_runtime_mounts_the_deployments_dev_shm() -> None:
    """--frontends hands images to the engine in /dev/shm (3 front ends at 224 px need about 115 MB, a container
    has 64 MB): the pod KServe builds gets the Deployment's memory-backed volume there."""
    pod = kserve_pod(_runtime(), _isvc())["spec"]
    deployment = _k8s_deployment()["spec"]["template"]["spec"]
    shm = _shm(pod, pod["containers"][0])
    assert shm == _shm(deployment, deployment["containers"][0]) and shm["medium"] == "Memory", shm
    assert int(shm["sizeLimit"].removesuffix("Mi")) >= 3 * 64 * 602 * 1024 / 2**20


@pytest.mark.parametrize("name", ["inferenceservice.yaml", "inferenceservice-triton.yaml"])
def test_inference_services_use_the_models_volume_in_raw_mode(name: str) -> None:
    isvc = _isvc(name)
    claim = _k8s_deployment()["spec"]["template"]["spec"]["volumes"]
    (models,) = [v["persistentVolumeClaim"]["claimName"] for v in claim if v["name"] == "models"]
    model = isvc["spec"]["predictor"]["model"]
    assert re.fullmatch(rf"pvc://{models}(/.*)?", model["storageUri"])
    # two ports (HTTP and gRPC) need a plain Deployment + Service: Knative gives a container one port
    assert isvc["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "RawDeployment"
    assert isvc["spec"]["predictor"]["minReplicas"] <= isvc["spec"]["predictor"]["maxReplicas"]


def test_inference_service_picks_the_irpe_runtime() -> None:
    runtime, model = _runtime(), _isvc()["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    formats = {f["name"]: f for f in runtime["spec"]["supportedModelFormats"]}
    assert model["modelFormat"]["name"] in formats and formats[model["modelFormat"]["name"]]["autoSelect"]
    assert model["protocolVersion"] in runtime["spec"]["protocolVersions"]
    assert model["storageUri"] == "pvc://irpe-models"  # the artifact directory itself, as /models in deploy/k8s


def test_triton_service_serves_the_exported_repository(tmp_path: Path) -> None:
    pytest.importorskip("onnx", reason="onnx is in the export extra")
    from irpe.export.triton import triton_repo_from_artifact
    from tests.server.helpers import make_artifact

    model = _isvc("inferenceservice-triton.yaml")["spec"]["predictor"]["model"]
    assert model["runtime"] == "kserve-tritonserver" and model["protocolVersion"] == "v2"
    assert re.fullmatch(r"\d{2}\.\d{2}-py3", model["runtimeVersion"])  # a pinned Triton release
    artifact = make_artifact(tmp_path / "artifact")
    root = triton_repo_from_artifact(artifact)  # where `irpe export --format triton` puts it by default
    assert model["storageUri"] == f"pvc://irpe-models/{root.relative_to(artifact)}"
    (config,) = root.glob("*/config.pbtxt")
    assert 'platform: "onnxruntime_onnx"' in config.read_text() and model["modelFormat"]["name"] == "onnx"
    assert (config.parent / "1" / "model.onnx").is_file()
