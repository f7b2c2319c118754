"""A real local Ray cluster for the Ray Serve tests: a head and worker nodes, every one on 127.0.0.1, with
Serve's HTTP proxy on the head only (the nodes share one address, so one proxy port), a small object store,
one logical CPU a node, and nothing left behind (every Ray process gone at the end, checked)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# before Ray is imported anywhere: Ray reads it once, and without it on Linux turns every 127.0.0.1 it is given
# into the machine's outward address (ray.init(address="127.0.0.1:port") then dials that address)
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
HOST = "127.0.0.1"
OBJECT_STORE = 80 * 1024 * 1024  # Ray's minimum is 75 MiB
NODE = {"num_cpus": 1, "node_ip_address": HOST, "object_store_memory": OBJECT_STORE}
APP = "irpe"


@dataclass
class RayServe:
    """The cluster, the worker nodes it has now, and Serve's HTTP proxy URL."""

    cluster: Any
    url: str
    workers: list[Any] = field(default_factory=list)

    def deploy(self, **args: str) -> None:
        """``serve run irpe.ray:app`` with ``args``, as the application ``irpe`` at ``/``; waits until running."""
        from ray import serve

        from irpe.ray import app

        serve.run(app(args), name=APP, route_prefix="/")

    def replicas(self) -> dict[str, int]:
        """The deployment's replicas by state (``{"RUNNING": 2, ...}``)."""
        from ray import serve

        status = serve.status().applications.get(APP)
        if status is None:
            return {}
        return {str(k): v for k, v in status.deployments["irpe"].replica_states.items()}

    def running(self) -> int:
        return self.replicas().get("RUNNING", 0)

    def add_worker(self) -> Any:
        node = self.cluster.add_node(**NODE)
        self.workers.append(node)
        return node

    def remove_worker(self) -> None:
        self.cluster.remove_node(self.workers.pop())


def wait_for(check: Callable[[], bool], timeout: float, what: str, every: float = 0.2) -> float:
    """Seconds until ``check()`` is true; AssertionError naming ``what`` after ``timeout``."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if check():
            return time.monotonic() - start
        time.sleep(every)
    raise AssertionError(f"{what}: not within {timeout:.0f}s")


def ray_pids() -> list[int]:
    """Processes of Ray (any session) still alive."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if "site-packages/ray/" in cmd or cmd.startswith("ray::"):
                found.append(int(proc.name))
    return found


def replica_pids() -> list[int]:
    """The irpe replicas' processes (``ray::ServeReplica:irpe:irpe``)."""
    found = []
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if proc.name.isdigit() and (proc / "cmdline").read_bytes().startswith(b"ray::ServeReplica:irpe"):
                found.append(int(proc.name))
    return found


@contextlib.contextmanager
def ray_serve(port: int, workers: int = 2, **serve_options: Any) -> Iterator[RayServe]:
    """A head and ``workers`` worker nodes on 127.0.0.1 with Serve started; everything stopped after.

    Args:
        port: the HTTP proxy's port (on 127.0.0.1).
        workers: worker nodes besides the head.
        serve_options: more ``serve.start`` options.
    """
    import ray
    from ray import serve
    from ray._common.utils import get_ray_address_file
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    assert not ray_constants.ENABLE_RAY_CLUSTER, "Ray was imported before tests/server/hosting/ray_cluster.py"

    temp = tempfile.mkdtemp(prefix="irpe-ray-")
    # Cluster() records the head's address in Ray's default temp folder whatever temp_dir says, and fails where
    # that folder does not exist yet (a fresh machine)
    Path(get_ray_address_file(None)).parent.mkdir(parents=True, exist_ok=True)
    head = {**NODE, "include_dashboard": False, "dashboard_host": HOST, "temp_dir": temp}
    cluster = Cluster(initialize_head=True, head_node_args=head)
    try:
        rs = RayServe(cluster, f"http://{HOST}:{port}")
        for _ in range(workers):
            rs.add_worker()
        ray.init(address=cluster.address, log_to_driver=False)
        serve.start(http_options={"host": HOST, "port": port}, proxy_location="HeadOnly", **serve_options)
        yield rs
    finally:
        with contextlib.suppress(Exception):
            serve.shutdown()
        ray.shutdown()
        cluster.shutdown()
        _reap()
        shutil.rmtree(temp, ignore_errors=True)


def _reap(timeout: float = 20.0) -> None:
    """Wait for Ray's processes to leave; kill the stragglers and fail (a test must leave none behind)."""
    deadline = time.monotonic() + timeout
    while (left := ray_pids()) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert not left, f"Ray processes survived the cluster's shutdown: {left}"
