"""``irpe serve``: check the settings and the repository, then run one process, ``--workers N`` whole
servers, or ``--frontends N`` front-end processes over one engine process (:mod:`.ipc.supervisor`)."""

from __future__ import annotations

import sys
from pathlib import Path

from irpe.artifact import load_artifact
from irpe.artifact.builtin import resolve_artifact_dir

from .config import Settings
from .frontend import loaded_server
from .hosting.repository import check_layout, is_plain_artifact, scan
from .runtime import configure_logging, raise_open_file_limit
from .worker_stats import shared_directory


def serve(settings: Settings) -> None:
    """Run until SIGINT/SIGTERM (graceful: in-flight requests finish, the batchers drain).

    Args:
        settings: the server's settings.

    Raises:
        SystemExit: a setting, artifact or repository the server cannot start with (one line naming the fix).
    """
    try:
        settings.check_exposure()  # before anything else: an exposed server without a key never starts
    except ValueError as e:
        raise SystemExit(f"irpe serve: error: {e}") from None
    check_artifact_dir(settings)
    configure_logging(settings)
    raise_open_file_limit()  # every process of the server: connections meet the caps, not the fd limit
    frontends = settings.frontends if settings.frontends < -1 else settings.resolved_frontends()
    _check_repository_fits(settings, frontends)
    if frontends:
        from .ipc.supervisor import serve_frontends  # N HTTP processes + one engine process

        code = serve_frontends(settings, frontends)
        if code:
            raise SystemExit(code)
        return
    if settings.workers > 1:
        from .ipc.supervisor import serve_workers  # N whole servers, each on its own socket of the port

        with shared_directory():  # /v2 statistics summed over the workers
            code = serve_workers(settings)
        if code:
            raise SystemExit(code)
        return
    _serve_one(settings)


def check_artifact_dir(settings: Settings) -> None:
    """Resolve ``digits`` (the shipped model) and check the directory: a bad artifact or repository layout is
    a one-line ArtifactError, not a traceback.

    Args:
        settings: the server's settings (``artifact_dir`` is resolved in place).

    Raises:
        ArtifactError: a bad artifact or repository layout.
    """
    settings.artifact_dir = str(resolve_artifact_dir(settings.artifact_dir))
    root = Path(settings.artifact_dir)
    if is_plain_artifact(root) or not root.is_dir():
        load_artifact(root)
    else:
        check_layout(root)  # a model repository: <model>/<version>/


def _serve_one(settings: Settings) -> None:
    """One process: the model loaded before uvicorn, so a bad model is one line naming the fix."""
    server = loaded_server(settings)
    try:
        server.run()
    except SystemExit:  # uvicorn's exit 3: its lifespan or its bind failed, and it logged why
        if not server.started and not getattr(getattr(server, "lifespan", None), "should_exit", True):
            _cannot_listen(settings)
        raise
    if server.failure:
        raise SystemExit(f"irpe serve: error: {server.failure}")
    if not server.started:
        raise SystemExit(3)


def _check_repository_fits(settings: Settings, frontends: int) -> None:
    """``--load-model`` without explicit model control: refused, for an artifact too. A model repository with
    several models or model control: refuse --workers (each worker would hold its own copy; --frontends shares
    one engine process and forwards model control to it)."""
    if settings.load_model and settings.model_control != "explicit":  # an artifact or a repository alike
        raise SystemExit("irpe serve: error: --load-model picks the models loaded at startup with --model-control "
                         f"explicit (got {settings.model_control}); add --model-control explicit")
    root = Path(settings.artifact_dir)
    if not root.is_dir():
        return
    names = sorted(scan(root))
    if settings.default_model and settings.default_model not in names:
        raise SystemExit(f"irpe serve: error: --default-model {settings.default_model!r} is not in {root} "
                         f"(models: {names}); fix --default-model")
    _check_load_model(settings, names)
    if is_plain_artifact(root):
        return
    several = len(names) > 1 or settings.model_control != "none"
    if several and settings.workers > 1:
        raise SystemExit("irpe serve: error: --workers loads the repository once per process and model control "
                         "would reach only one; with several models or --model-control use --workers 1")


def _check_load_model(settings: Settings, names: list[str]) -> None:
    """``--load-model`` (with explicit model control, checked before): names the repository holds, the default
    among them."""
    if not settings.load_model:
        return
    startup = settings.startup_models() or []
    missing = [n for n in startup if n not in names]
    if missing:
        raise SystemExit(f"irpe serve: error: --load-model {missing[0]!r} is not in {settings.artifact_dir} "
                         f"(models: {names}); fix --load-model")
    if startup and settings.default_model and settings.default_model not in startup:
        raise SystemExit(f"irpe serve: error: --default-model {settings.default_model!r} is not loaded at startup "
                         f"(--load-model {','.join(startup)}); add --load-model {settings.default_model}")


def _cannot_listen(settings: Settings) -> None:
    """The one line after uvicorn's bind error (exit 3 follows)."""
    print(f"irpe serve: error: cannot listen on {settings.host}:{settings.port} (the error above); pick another "
          "--port, or stop the process that holds it", file=sys.stderr)
