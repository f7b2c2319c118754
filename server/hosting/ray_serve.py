"""irpe on Ray Serve: each replica hosts irpe's own ASGI app (engine, batcher, routes, key, limits) behind
Ray's HTTP proxy, and the KServe v2 gRPC service behind Ray's gRPC proxy (:mod:`.ray_grpc`).

``serve run irpe.ray:app model=DIR [setting=value ...]`` calls :func:`build_app` (through :mod:`irpe.ray`).
A replica answers what ``irpe serve`` answers, byte for byte: the same :func:`~..http.app.create_app` on the
same :class:`~..config.Settings`. Its lifespan startup ends only when the model is warm, so Ray routes to a
replica once it is ready (Ray marks a replica running when its startup ends); ``check_health`` fails a
replica whose inference cannot go on, and Ray replaces it. Imported only under Ray (the ``ray`` extra).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from ray import serve

from ..config import Settings
from ..launch import check_artifact_dir
from .ray_grpc import SERVICER_FUNCTIONS, RayGrpcMethods

log = logging.getLogger("irpe.server")
# Ray's own knobs (the rest of the arguments are irpe settings); their defaults suit one replica per GPU
AUTOSCALING_FLOATS = ("target_ongoing_requests", "upscale_delay_s", "downscale_delay_s", "look_back_period_s")
RAY_KEYS = ("num_replicas", "min_replicas", "max_replicas", "initial_replicas", *AUTOSCALING_FLOATS,
            "max_ongoing_requests", "num_cpus", "num_gpus", "health_check_period_s", "name")
# what Ray's proxies own: a replica binds nothing and runs in one process
PROXY_OWNED = ("host", "port", "grpc_port", "workers", "frontends")
ALIASES = {"model": "artifact_dir"}

READY_POLL_S = 0.05
__all__ = ["RAY_KEYS", "SERVICER_FUNCTIONS", "IrpeReplica", "build_app", "deployment_options", "split_args"]


def split_args(args: Mapping[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """Split ``serve run`` arguments into irpe settings (as ``IRPE_*`` variables) and Ray's own knobs.

    Args:
        args: ``setting=value`` pairs (``model=DIR`` for the artifact or repository).

    Returns:
        ``(irpe_env, ray_args)``.

    Raises:
        ValueError: an unknown name, or one Ray's proxies own (``host``, ``port``...), naming the fix.
    """
    known = {f.name for f in fields(Settings)}
    env: dict[str, str] = {}
    ray_args: dict[str, str] = {}
    for raw_name, value in args.items():
        name = ALIASES.get(raw_name.replace("-", "_"), raw_name.replace("-", "_"))
        if name in RAY_KEYS:
            ray_args[name] = str(value)
        elif name in PROXY_OWNED:
            raise ValueError(f"{raw_name}={value}: under Ray Serve the proxies listen (http_options / grpc_options "
                             "of the Serve config, or `serve start --http-host`) and a replica is one process; "
                             f"leave {raw_name} out")
        elif name in known:
            env[f"IRPE_{name.upper()}"] = str(value)
        else:
            raise ValueError(f"{raw_name}={value}: not an irpe setting nor one of Ray's ({', '.join(RAY_KEYS)}); "
                             "docs/configuration.md lists the settings, docs/deploy/ray.md Ray's")
    return env, ray_args


def check_fits_ray(settings: Settings) -> None:
    """Refuse the settings that cannot hold across replicas.

    Raises:
        ValueError: ``model_control=explicit`` (a load or unload would reach one replica of many) or
            ``allow_client_shm`` (Ray's proxy, not the client, is the replica's peer), naming the fix.
    """
    if settings.model_control == "explicit":
        raise ValueError("model_control=explicit: under Ray Serve a load or unload request reaches one replica "
                         "of many; use model_control=poll (each replica watches its repository) or redeploy")
    if settings.allow_client_shm:
        raise ValueError("allow_client_shm: client shared memory needs the client on the replica's host, and "
                         "under Ray Serve the proxy is the replica's peer; leave it off")


def replica_settings(env: Mapping[str, str], proxy_host: str) -> Settings:
    """The replica's settings: its own ``IRPE_*`` variables < the ones the builder passed; one process that
    binds nothing, its exposure judged by the address Ray's proxy listens on.

    Raises:
        ValueError: a bad setting, or an exposed proxy without an API key (as ``irpe serve``).
    """
    merged = {**os.environ, **env, "IRPE_HOST": proxy_host, "IRPE_FRONTENDS": "0", "IRPE_WORKERS": "1"}
    settings = Settings.from_env(merged)
    check_fits_ray(settings)
    settings.check_exposure()
    return settings


def proxy_host() -> str:
    """The address Ray's proxies listen on: the HTTP proxy's host, or every address when the gRPC proxy runs
    (Ray binds it to ``[::]`` with no option to narrow it). Asked of the Serve controller."""
    import ray
    from ray.serve.context import _get_global_client

    client = _get_global_client()
    grpc_options = ray.get(client._controller.get_grpc_config.remote())
    if grpc_options.grpc_servicer_functions:
        return "::"
    return client.http_config.host or "127.0.0.1"


class ReadyGate:
    """irpe's app, with its lifespan startup answered only once the model is warm (or failed): Ray routes to
    a replica when its startup ends, and irpe warms up in the background of its lifespan."""

    def __init__(self, app: Any, service: Any):
        self.app, self.service = app, service

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return

        async def send_when_warm(message: dict[str, Any]) -> None:
            if message["type"] == "lifespan.startup.complete":
                while not self.service.started:  # the host sets it when warm-up ends, then the state
                    await asyncio.sleep(READY_POLL_S)
                await asyncio.sleep(READY_POLL_S)
                if not self.service.ready:
                    message = {"type": "lifespan.startup.failed",
                               "message": f"the model is not ready: {self.service.reason or 'warm-up failed'}"}
            await send(message)

        await self.app(scope, receive, send_when_warm)


@serve.ingress()
class IrpeReplica(RayGrpcMethods):
    """One replica: irpe's app on its own engine and batcher (HTTP through Ray's HTTP proxy), and the
    ``inference.GRPCInferenceService`` RPCs Ray's gRPC proxy routes here by method name."""

    def __init__(self, env: dict[str, str]):
        from ..http.app import create_app

        settings = replica_settings(env, proxy_host())
        check_artifact_dir(settings)
        self.irpe_app = create_app(settings)
        self.service = self.irpe_app.state.irpe
        RayGrpcMethods.__init__(self, self.service, self.irpe_app.state.shm)

    def __serve_build_asgi_app__(self) -> ReadyGate:
        """The ASGI app Ray's HTTP proxy sends this replica's requests to."""
        return ReadyGate(self.irpe_app, self.service)

    def check_health(self) -> None:
        """Ray's periodic health check: raise when inference cannot go on (Ray then replaces the replica)."""
        self.service.check_workers()
        if self.service.failure:
            raise RuntimeError(f"irpe replica unhealthy: {self.service.failure}")


def deployment_options(settings: Settings, ray_args: Mapping[str, str]) -> dict[str, Any]:
    """``serve.deployment`` options: one replica per GPU on cuda (one CPU otherwise), autoscaling on ongoing
    requests per replica with a target of two batches (one running, one filling) unless ``num_replicas``
    fixes the count.

    Args:
        settings: the irpe settings (the batch size and device set the defaults).
        ray_args: Ray's knobs from the arguments (:data:`RAY_KEYS`).

    Returns:
        Keyword arguments for ``serve.deployment`` / ``Deployment.options``.
    """
    batch = settings.resolved_max_batch()
    gpus = float(ray_args.get("num_gpus", 1 if settings.device == "cuda" else 0))
    actor = {"num_cpus": float(ray_args.get("num_cpus", 1)), "num_gpus": gpus}
    options: dict[str, Any] = {"name": ray_args.get("name", "irpe"), "ray_actor_options": actor,
                               "max_ongoing_requests": int(ray_args.get("max_ongoing_requests", 4 * batch))}
    if "health_check_period_s" in ray_args:
        options["health_check_period_s"] = float(ray_args["health_check_period_s"])
    if "num_replicas" in ray_args:
        options["num_replicas"] = int(ray_args["num_replicas"])
        return options
    defaults = {"target_ongoing_requests": 2 * batch, "upscale_delay_s": 10, "downscale_delay_s": 300}
    autoscaling: dict[str, Any] = {k: int(ray_args[k]) for k in ("initial_replicas",) if k in ray_args}
    autoscaling |= {"min_replicas": int(ray_args.get("min_replicas", 1)),
                    "max_replicas": int(ray_args.get("max_replicas", 4))}
    autoscaling |= {k: float(ray_args.get(k, defaults.get(k, 0))) for k in AUTOSCALING_FLOATS
                    if k in ray_args or k in defaults}
    options["autoscaling_config"] = autoscaling
    return options


def build_app(args: Mapping[str, Any]) -> Any:
    """The Ray Serve application: ``serve run irpe.ray:app model=DIR [setting=value ...]``.

    Args:
        args: irpe settings (``model=DIR``, ``api_key=...``, ``max_batch=8``...; each also read from the
            ``IRPE_*`` variables of this process and, in each replica, of its node) and Ray's knobs
            (:data:`RAY_KEYS`).

    Returns:
        The bound application (``ray.serve.Application``).

    Raises:
        ValueError: an unknown or proxy-owned argument, or a bad setting (checked here, before any replica).
        ArtifactError: a bad artifact or repository layout.
    """
    env, ray_args = split_args(args)
    passed = {k: v for k, v in os.environ.items() if k.startswith("IRPE_")}
    env = {**passed, **env}
    settings = Settings.from_env(env, frontends=0, workers=1)  # checked here: one line, not a failed replica
    check_fits_ray(settings)
    check_artifact_dir(settings)
    env["IRPE_ARTIFACT_DIR"] = settings.artifact_dir  # 'digits' resolved to the installed path
    deployment = serve.deployment(IrpeReplica).options(**deployment_options(settings, ray_args))
    return deployment.bind(env)
