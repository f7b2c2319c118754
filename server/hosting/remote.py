"""A ``--frontends`` front end's host: a route table fed only by the engine process's status.

The engine process owns the models (:class:`~.local.LocalHost`: engines, batchers, fair slots). It pushes
its route table to every front end over one channel (:class:`~..ipc.link.EngineLink`): the repository's
models, the READY versions with their model.json as the engine verified it and their engine facts, and
the repository index. The front end applies each push and acknowledges it, so the engine knows when every
front end routes accordingly (before it retires a version, before it answers a load). Nothing is read from
disk here; model control is forwarded to the engine process.
"""

from __future__ import annotations

import logging
import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any

from irpe.artifact import ArtifactError, ModelArtifact

from ..batch_queue import BatcherStoppedError, BatchQueue
from ..config import Settings
from ..engines.base import EngineInfo
from ..errors import APIError
from ..metrics import Metrics
from .host import CatalogEntry, ModelHost
from .version import ModelVersion

log = logging.getLogger("irpe.server")
CONTROL_TIMEOUT_S = 600.0  # a load builds and warms an engine in the engine process


class Channel(ABC):
    """What a RemoteHost needs of its link to the engine process (:class:`~..ipc.link.EngineLink`)."""

    gone: bool  # the engine process closed the connection
    on_status: Callable[[dict[str, Any]], None] | None  # called with each status the engine pushes

    @abstractmethod
    def connect(self) -> None:
        """Connect to the engine process.

        Raises:
            OSError: it cannot be reached.
        """

    @abstractmethod
    def wait_status(self, timeout: float | None = None) -> dict[str, Any] | None:
        """Wait until the engine is ready, failed or gone.

        Args:
            timeout: the most seconds to wait (None: no limit).

        Returns:
            The engine's last status, or None when none came.
        """

    @abstractmethod
    def control(self, name: str, load: bool, timeout: float) -> None:
        """Have the engine process load or unload ``name``.

        Args:
            name: the model.
            load: True to (re)load it, False to unload it.
            timeout: the most seconds to wait for its answer.

        Raises:
            APIError: the engine's answer when it refused.
            OSError, BatcherStoppedError: the engine process cannot be reached.
        """

    @abstractmethod
    def batcher(self, name: str, version: int, crop: int, max_queue: int) -> BatchQueue:
        """The queue of one model version in the engine process.

        Args:
            name: the model.
            version: the version number.
            crop: the image side the version takes.
            max_queue: images this front end queues for it before 503.

        Returns:
            A queue whose batches the engine process runs.
        """

    @abstractmethod
    def stop(self, drain: bool = True, timeout: float = 30.0) -> None:
        """Hang up.

        Args:
            drain: wait for the answers to what was handed over first.
            timeout: the most seconds to wait for them.
        """


class RemoteHost(ModelHost):
    """The versions the engine process serves, as its last status says (see the module docstring)."""

    def __init__(self, settings: Settings, link: Channel, metrics: Metrics | None = None):
        """An empty table until the engine's first status.

        Args:
            settings: the server's settings.
            link: the channel to the engine process (its statuses call :meth:`apply`).
            metrics: where the per-version series go (a fresh registry when None).
        """
        super().__init__(settings, metrics)
        self.link = link
        link.on_status = self.apply
        self.failure = ""
        self._catalog: dict[str, CatalogEntry] = {}
        self._index: list[dict[str, str]] = []
        self._default = ""
        self._apply = threading.Lock()

    def catalog(self) -> dict[str, CatalogEntry]:
        """The repository's models as the engine's last status lists them (see the base class)."""
        return self._catalog

    def default_name(self) -> str:
        """The engine's default model (see the base class)."""
        return self._default or super().default_name()

    def index(self) -> list[dict[str, str]]:
        """The engine's repository index: every version tried there, with the reason (see the base class)."""
        return list(self._index)

    def startup_failure(self) -> str:
        """Why the engine process did not come up (see the base class)."""
        return self.failure or "the engine process stopped"

    def fatal(self) -> str:
        """The engine process stopped, or "" (see the base class)."""
        return "the engine process stopped (see the server log); the server is exiting" if self.link.gone else ""

    def start(self) -> None:
        """Nothing to load here: the engine process loads."""

    def warm(self) -> None:
        """Connect and wait until the engine is warmed up (its route table applied) or failed."""
        try:
            self.link.connect()
        except OSError as e:
            self.failure = f"cannot reach the engine process ({e})"
            log.error("%s", self.failure)
            return
        status = self.link.wait_status() or {}
        if status.get("ready") and "table" in status:
            self.started = True
            log.info("front end pid %d ready", os.getpid())
        else:
            self.failure = status.get("failure") or "the engine process stopped"

    def control(self, name: str, load: bool) -> None:
        """``POST /v2/repository/models/{name}/load|unload``: done by the engine process (blocking).

        Args:
            name: the model.
            load: True to (re)load it, False to unload it.

        Raises:
            APIError: 503 when the engine process cannot be reached; the engine's own answer otherwise.
        """
        try:
            self.link.control(name, load, CONTROL_TIMEOUT_S)
        except (OSError, BatcherStoppedError) as e:
            raise APIError(503, "not_ready", f"the engine process is not reachable ({e})") from None

    def shutdown(self, timeout: float) -> None:
        """Wait for the engine's answers to what was handed over, then hang up (see the base class)."""
        self.link.stop(drain=True, timeout=timeout)

    def apply(self, head: dict[str, Any]) -> None:
        """Route to exactly the versions the engine serves (the link's reader thread).

        Args:
            head: the engine's status, whose ``table`` holds the default model, the catalog, the index and
                every READY version (name, number, path, signature, model.json, engine facts).
        """
        table = head["table"]
        with self._apply:
            self._default = table["default"]
            self._catalog = {name: CatalogEntry(policy, error, max_queue)
                             for name, (policy, error, max_queue) in table["catalog"].items()}
            self._index = table["index"]
            wanted = {(name, int(number)): rest for name, number, *rest in table["versions"]}
            for (name, number), (path, files, artifact, info) in wanted.items():
                on_disk = tuple(tuple(file) for file in files)
                old = self.records.get(name, {}).get(number)
                if old is None or not old.ready or old.signature != on_disk:
                    model_version = self._build(name, number, Path(path), on_disk, artifact, info)
                    with self._table_lock:
                        self.records.setdefault(name, {})[number] = model_version
            self._unload_unwanted(wanted)
        self.changed()

    def _unload_unwanted(self, wanted: dict[tuple[str, int], Any]) -> None:
        """Mark unloaded every READY version the engine no longer serves."""
        for name, versions in list(self.records.items()):
            for number, model_version in list(versions.items()):
                if model_version.ready and (name, number) not in wanted:
                    with self._table_lock:
                        model_version.mark_unloaded()
                    self.labeled.ready.labels(name, str(number)).set(0)

    def _build(self, name: str, version: int, path: Path, on_disk: tuple, artifact: dict[str, Any],
               info: dict[str, Any]) -> ModelVersion:
        """A READY version from the engine's row, its batcher over the link (UNAVAILABLE when the model.json
        sent does not parse)."""
        model_version = ModelVersion(name, version, path, signature=on_disk)
        try:
            model_version.artifact = ModelArtifact.from_dict(artifact, source=f"the engine's {name} version {version}")
        except ArtifactError as e:
            model_version.mark_unavailable(str(e))
            return model_version
        model_version.info = EngineInfo(**info)
        entry = self._catalog.get(name)
        model_version.batcher = self.link.batcher(name, version, model_version.artifact.preprocess.crop,
                                                  (entry.max_queue if entry else 0) or self.settings.max_queue)
        model_version.mark_ready()
        self.labeled.ready.labels(name, str(version)).set(1)  # per process: this front end routes to it
        return model_version
