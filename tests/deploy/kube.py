"""A Kubernetes manifest run under `podman kube play`, with the test doing kubelet's part where podman 4.3
(Debian 12) does not (docs/deploy/kubernetes.md has the table):

- Secret + secretKeyRef: podman reads a podman secret holding the Secret's `data` map as JSON (`kube play` of a
  Secret stores YAML it then cannot read): `create_secret`.
- emptyDir: podman makes a root-owned named volume on disk, without size; kubelet mounts a tmpfs of `sizeLimit`
  for `medium: Memory`: `memory_volumes` mounts one on the host and hands it over as hostPath.
- probes: podman turns liveness into a `curl` healthcheck on port 0 (the named port is not resolved, the image
  has no curl, and nothing schedules it without systemd) and drops startup and readiness: `probe` and
  `wait_probe` run them from the host, through the published ports, with kubelet's rules.
- preStop and terminationGracePeriodSeconds: not run, podman stops with 10 s: the tests run the hook with
  `podman exec` and stop with `podman pod stop -t GRACE`.
- containerPort without hostPort is published on every address (0.0.0.0) at the same number: `publish` gives
  each a hostPort on hostIP 127.0.0.1. replicas: 2 is two pods on one host whose second cannot bind its ports:
  the tests play one.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from tests.deploy.images import run


def kserve_pod(runtime: dict, isvc: dict) -> dict:
    """The pod KServe builds: the runtime's pod and container, overlaid with the InferenceService's predictor
    (pod fields) and model (container fields; KServe-only fields such as storageUri dropped).

    Args:
        runtime: the ServingRuntime.
        isvc: the InferenceService.

    Returns:
        A v1 Pod manifest named after the InferenceService.
    """
    from kubernetes.client import models as k8s_models

    container_fields = set(k8s_models.V1Container.attribute_map.values())
    pod_fields = set(k8s_models.V1PodSpec.attribute_map.values())
    predictor = isvc["spec"]["predictor"]
    (container,) = copy.deepcopy(runtime["spec"]["containers"])
    container.update({k: v for k, v in predictor["model"].items() if k in container_fields})
    spec = {k: copy.deepcopy(v) for k, v in runtime["spec"].items() if k in pod_fields}
    spec.update({k: copy.deepcopy(v) for k, v in predictor.items() if k in pod_fields and k != "containers"})
    spec["containers"] = [container]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": isvc["metadata"]["name"]}, "spec": spec}


def create_secret(engine: list[str], name: str, data: dict[str, str]) -> None:
    """The Secret `kubectl create secret generic NAME --from-literal=k=v` makes, in the form podman 4.3's
    ``secretKeyRef`` reads: its ``data`` map (values base64) as JSON."""
    payload = json.dumps({k: base64.b64encode(v.encode()).decode() for k, v in data.items()})
    run([*engine, "secret", "create", name, "-"], input=payload)


@contextlib.contextmanager
def memory_volumes(pod_spec: dict, root: Path) -> Iterator[None]:
    """Kubelet's part for ``emptyDir`` volumes: a directory of mode 1777 per volume, a tmpfs of ``sizeLimit``
    for ``medium: Memory``; the spec's volume becomes a ``hostPath`` to it. Unmounted on exit (needs root)."""
    mounted = []
    try:
        for vol in pod_spec.get("volumes", []):
            empty = vol.pop("emptyDir", None)
            if empty is None:
                continue
            path = root / vol["name"]
            path.mkdir(parents=True)
            path.chmod(0o1777)
            if empty.get("medium") == "Memory":
                size = quantity(empty["sizeLimit"])
                run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=1777", f"irpe-{vol['name']}", str(path)])
                mounted.append(path)
            vol["hostPath"] = {"path": str(path), "type": "Directory"}
        yield
    finally:
        for path in mounted:
            run(["umount", str(path)], check=False)


def quantity(text: str) -> int:
    """A Kubernetes quantity with a binary suffix (``256Mi``) in bytes."""
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
    for suffix, factor in units.items():
        if text.endswith(suffix):
            return int(text[: -len(suffix)]) * factor
    return int(text)


def publish(container: dict, ports: dict[int, int]) -> None:
    """Publish each ``containerPort`` on 127.0.0.1 at the host port ``ports`` names for it."""
    for p in container["ports"]:
        p.update(hostPort=ports[p["containerPort"]], hostIP="127.0.0.1")


def container_port(container: dict, port: int | str) -> int:
    """A probe's port: a number, or the name of one of the container's ports."""
    if isinstance(port, int):
        return port
    (number,) = [p["containerPort"] for p in container["ports"] if p.get("name") == port]
    return number


def probe(container: dict, kind: str, host_ports: dict[int, int]) -> tuple[bool, str]:
    """One probe of ``container[kind]`` as kubelet runs it (httpGet: a status in [200, 400); grpc: grpc.health.v1
    SERVING; tcpSocket: a connection), within its ``timeoutSeconds`` (default 1), through the published ports.

    Returns:
        (success, what was seen).
    """
    spec = container[kind]
    timeout = spec.get("timeoutSeconds", 1)
    if "httpGet" in spec:
        port = host_ports[container_port(container, spec["httpGet"]["port"])]
        try:
            r = httpx.get(f"http://127.0.0.1:{port}{spec['httpGet'].get('path', '/')}", timeout=timeout)
        except httpx.HTTPError as e:
            return False, f"{type(e).__name__}: {e}"
        return 200 <= r.status_code < 400, f"HTTP {r.status_code}"
    if "grpc" in spec:
        return _grpc_health(host_ports[spec["grpc"]["port"]], spec["grpc"].get("service", ""), timeout)
    if "tcpSocket" in spec:
        port = host_ports[container_port(container, spec["tcpSocket"]["port"])]
        try:
            socket.create_connection(("127.0.0.1", port), timeout=timeout).close()
        except OSError as e:
            return False, str(e)
        return True, "connected"
    raise ValueError(f"{kind}: a probe this helper does not run: {sorted(spec)}")


def _grpc_health(port: int, service: str, timeout: float) -> tuple[bool, str]:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service),
                                                              timeout=timeout)
        except grpc.RpcError as e:
            return False, f"{e.code().name}"
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    return status == "SERVING", status


def wait_probe(container: dict, kind: str, host_ports: dict[int, int], alive: object = None,
               budget: float | None = None) -> float:
    """Probe until the first success, failing where kubelet would restart the container: after
    ``initialDelaySeconds`` + ``periodSeconds`` x ``failureThreshold`` (defaults 0, 10, 3). Probes every 0.25 s
    instead of every period, so a pass comes as soon as the server answers.

    Args:
        container: the container spec.
        kind: startupProbe, readinessProbe or livenessProbe.
        host_ports: containerPort -> published port.
        alive: a callable returning False once the container has exited (stops the wait early).
        budget: seconds instead of kubelet's: a failing readiness probe restarts nothing (the pod stays out of
            the Service), so a caller waiting for readiness gives its own bound.

    Returns:
        Seconds until the first success.

    Raises:
        AssertionError: no success within kubelet's budget, with the last answer.
    """
    spec = container[kind]
    if budget is None:
        budget = spec.get("initialDelaySeconds", 0) + spec.get("periodSeconds", 10) * spec.get("failureThreshold", 3)
    start = time.monotonic()
    seen = "never probed"
    while time.monotonic() - start < budget:
        ok, seen = probe(container, kind, host_ports)
        if ok:
            return time.monotonic() - start
        if callable(alive) and not alive():
            break
        time.sleep(0.25)
    raise AssertionError(f"{kind} did not pass within {budget} s: last answer {seen}")


def kube_play(engine: list[str], docs: list[dict], path: Path) -> None:
    """Write ``docs`` as one YAML stream and `podman kube play` it."""
    import yaml

    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    run([*engine, "kube", "play", str(path)], timeout=300)


def pod_container(engine: list[str], pod: str) -> str:
    """The name of the one non-infra container of a pod."""
    out = run([*engine, "ps", "-a", "--filter", f"pod={pod}", "--format", "{{.Names}} {{.IsInfra}}"]).stdout
    (name,) = [line.split()[0] for line in out.splitlines() if line.split()[1] == "false"]
    return name


def remove_pod(engine: list[str], pod: str) -> None:
    run([*engine, "pod", "rm", "-f", "-t", "0", pod], check=False)


def exec_in(engine: list[str], container: str, *cmd: str, **kwargs: object) -> subprocess.CompletedProcess:
    return run([*engine, "exec", "-i", container, *cmd], check=False, timeout=120, **kwargs)
