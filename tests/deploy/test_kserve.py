"""deploy/kserve: the ServingRuntime and both InferenceServices match the kserve SDK's models field by field
(unknown fields, types and required fields refused), the pod KServe would build from runtime + InferenceService
validates strictly against the Kubernetes schemas, and the runtime runs the image as the Dockerfile and
deploy/k8s do. The Triton InferenceService points at the repository `irpe export --format triton` writes."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
KSERVE = REPO / "deploy" / "kserve"
yaml = pytest.importorskip("yaml", reason="pyyaml is in the dev extra")
kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is in the dev extra")
kserve_models = pytest.importorskip("kserve.models", reason="kserve is in the dev extra")
k8s_models = pytest.importorskip("kubernetes.client.models", reason="kubernetes comes with kserve (dev extra)")
K8S_VERSIONS = ("1.29.0", kv.utils.latest_version())
KINDS = {"ServingRuntime": ("serving.kserve.io/v1alpha1", "V1alpha1ServingRuntime"),
         "InferenceService": ("serving.kserve.io/v1beta1", "V1beta1InferenceService")}
PRIMITIVES = {"str": (str,), "int": (int,), "float": (int, float), "bool": (bool,), "object": (object,),
              "ResourceQuantity": (str,)}  # quantities: quoted strings ("4", 4Gi) in these manifests


class ManifestError(ValueError):
    """A manifest field the SDK's models do not accept."""


def _model_class(name: str) -> type:
    for module in (kserve_models, k8s_models):
        if hasattr(module, name):
            return getattr(module, name)
    raise LookupError(f"{name}: neither kserve.models nor kubernetes.client.models defines it")


def _check(value: Any, type_name: str, path: str) -> Any:
    """``value`` as the SDK's ``type_name`` ('str', 'list[V1Container]', 'dict(str, str)', a model class)."""
    if m := re.fullmatch(r"[Ll]ist\[(.+)\]", type_name):
        if not isinstance(value, list):
            raise ManifestError(f"{path}: expected a list, got {value!r}")
        return [_check(v, m[1], f"{path}[{i}]") for i, v in enumerate(value)]
    if m := re.fullmatch(r"dict\(str, (.+)\)|Dict\[str, (.+)\]", type_name):
        if not isinstance(value, dict):
            raise ManifestError(f"{path}: expected a mapping, got {value!r}")
        return {k: _check(v, m[1] or m[2], f"{path}.{k}") for k, v in value.items()}
    if type_name in PRIMITIVES:
        bad_bool = type_name in ("int", "float") and isinstance(value, bool)
        if bad_bool or not isinstance(value, PRIMITIVES[type_name]):
            raise ManifestError(f"{path}: expected {type_name}, got {value!r}")
        return value
    cls = _model_class(type_name)
    if not isinstance(value, dict):
        raise ManifestError(f"{path}: expected a {type_name} mapping, got {value!r}")
    fields = {json_key: attr for attr, json_key in cls.attribute_map.items()}
    unknown = sorted(set(value) - set(fields))
    if unknown:
        raise ManifestError(f"{path}: {type_name} has no field {', '.join(unknown)}")
    kwargs = {fields[k]: _check(v, cls.openapi_types[fields[k]], f"{path}.{k}") for k, v in value.items()}
    try:
        return cls(**kwargs)  # the generated models refuse a missing required field (client-side validation)
    except ValueError as e:
        raise ManifestError(f"{path}: {e}") from e


def check_kserve(doc: dict) -> Any:
    """The SDK model for ``doc`` (ServingRuntime or InferenceService), or ManifestError naming the field."""
    api_version, class_name = KINDS[doc.get("kind", "?")]
    if doc.get("apiVersion") != api_version:
        raise ManifestError(f"{doc['kind']}: apiVersion must be {api_version}, got {doc.get('apiVersion')!r}")
    return _check(doc, class_name, doc["kind"])


def _docs() -> dict[str, dict]:
    return {f.name: yaml.safe_load(f.read_text()) for f in sorted(KSERVE.glob("*.yaml"))}


def _runtime() -> dict:
    return _docs()["servingruntime.yaml"]


def _isvc(name: str = "inferenceservice.yaml") -> dict:
    return _docs()[name]


def _merged_pod(runtime: dict, isvc: dict) -> dict:
    """The pod KServe builds: the runtime's pod and container, overlaid with the InferenceService's predictor
    (pod fields) and model (container fields; KServe-only fields such as storageUri dropped)."""
    container_fields = set(k8s_models.V1Container.attribute_map.values())
    pod_fields = set(k8s_models.V1PodSpec.attribute_map.values())
    predictor = isvc["spec"]["predictor"]
    (container,) = copy.deepcopy(runtime["spec"]["containers"])
    container.update({k: v for k, v in predictor["model"].items() if k in container_fields})
    spec = {k: v for k, v in runtime["spec"].items() if k in pod_fields}
    spec.update({k: v for k, v in predictor.items() if k in pod_fields and k != "containers"})
    spec["containers"] = [container]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": isvc["metadata"]["name"]}, "spec": spec}


def _k8s_deployment() -> dict:
    return yaml.safe_load((REPO / "deploy" / "k8s" / "deployment.yaml").read_text())


def test_every_manifest_matches_the_kserve_sdk_models() -> None:
    docs = _docs()
    assert sorted(docs) == ["inferenceservice-triton.yaml", "inferenceservice.yaml", "servingruntime.yaml"]
    runtime = check_kserve(docs["servingruntime.yaml"])
    assert isinstance(runtime, kserve_models.V1alpha1ServingRuntime)
    assert isinstance(runtime.spec.containers[0], k8s_models.V1Container)
    for name in ("inferenceservice.yaml", "inferenceservice-triton.yaml"):
        isvc = check_kserve(docs[name])
        assert isinstance(isvc.spec.predictor.model, kserve_models.V1beta1ModelSpec), name


@pytest.mark.parametrize(("name", "mutate", "message"), [
    ("servingruntime.yaml", lambda d: d["spec"].update(supportedModelFormat=d["spec"].pop("supportedModelFormats")),
     "has no field supportedModelFormat$"),
    ("servingruntime.yaml", lambda d: d["spec"]["containers"][0]["ports"][0].update(containerPort="8000"),
     "containerPort: expected int"),
    ("servingruntime.yaml", lambda d: d["spec"]["containers"][0].pop("name"),
     r"name\s+Field required"),  # kubernetes' models are pydantic
    ("servingruntime.yaml", lambda d: d["spec"]["containers"][0]["securityContext"].update(readOnlyRootFileSystem=True),
     "has no field readOnlyRootFileSystem"),
    ("inferenceservice.yaml", lambda d: d["spec"]["predictor"]["model"].pop("modelFormat"),
     "`model_format`, must not be `None`"),  # kserve's are generated OpenAPI classes
    ("inferenceservice.yaml", lambda d: d["spec"]["predictor"].update(minReplicas="2"), "minReplicas: expected int"),
    ("inferenceservice-triton.yaml", lambda d: d.update(apiVersion="serving.kserve.io/v1alpha1"), "apiVersion"),
], ids=["typo", "type", "required", "nested-typo", "required-isvc", "type-isvc", "api-version"])
def test_sdk_check_refuses_a_broken_copy(name: str, mutate, message: str) -> None:
    doc = copy.deepcopy(_docs()[name])
    check_kserve(doc)
    mutate(doc)
    with pytest.raises(ManifestError, match=message):
        check_kserve(doc)


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("isvc", ["inferenceservice.yaml"])
def test_the_merged_pod_validates_against_kubernetes(version: str, isvc: str) -> None:
    pod = _merged_pod(_runtime(), _isvc(isvc))
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
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["path"] == k8s[probe]["httpGet"]["path"]
        assert c[probe]["httpGet"]["port"] == ports["http"]
    spec = runtime["spec"]
    assert {"v2", "grpc-v2"} <= set(spec["protocolVersions"])
    assert not any(k.startswith("prometheus.kserve.io/") for k in spec.get("annotations", {}))  # needs the key


def test_inference_service_is_hardened_and_bounded() -> None:
    pod = _merged_pod(_runtime(), _isvc())["spec"]
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
