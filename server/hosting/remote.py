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
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from irpe.artifact import ArtifactError, ModelArtifact

from ..batching import BatcherStoppedError, BatchQueue
from ..config import Settings
from ..engines.base import EngineInfo
from ..errors import APIError
from ..metrics import Metrics
from .host import CatalogEntry, ModelHost, ModelVersion

log = logging.getLogger("irpe.server")
CONTROL_TIMEOUT_S = 600.0  # a load builds and warms an engine in the engine process


class Channel(Protocol):
    """What a RemoteHost needs of its link to the engine process."""

    gone: bool
    on_status: Callable[[dict[str, Any]], None] | None

    def connect(self) -> None: ...

    def wait_status(self, timeout: float | None = None) -> dict[str, Any] | None: ...

    def control(self, name: str, load: bool, timeout: float) -> None: ...

    def batcher(self, name: str, version: int, crop: int, max_queue: int) -> BatchQueue: ...

    def stop(self, drain: bool = True, timeout: float = 30.0) -> None: ...


class RemoteHost(ModelHost):
    """The versions the engine process serves, as its last status says (see the module docstring)."""

    def __init__(self, settings: Settings, link: Channel, metrics: Metrics | None = None):
        super().__init__(settings, metrics)
        self.link = link
        link.on_status = self.apply
        self.failure = ""
        self._catalog: dict[str, CatalogEntry] = {}
        self._index: list[dict[str, str]] = []
        self._default = ""
        self._apply = threading.Lock()

    def catalog(self) -> dict[str, CatalogEntry]:
        return self._catalog

    def default_name(self) -> str:
        return self._default or super().default_name()

    def index(self) -> list[dict[str, str]]:
        """The engine's repository index (every version tried there, with the reason)."""
        return list(self._index)

    def startup_failure(self) -> str:
        return self.failure or "the engine process stopped"

    def fatal(self) -> str:
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
        """``POST /v2/repository/models/{name}/load|unload``: done by the engine process (blocking)."""
        try:
            self.link.control(name, load, CONTROL_TIMEOUT_S)
        except (OSError, BatcherStoppedError) as e:
            raise APIError(503, "not_ready", f"the engine process is not reachable ({e})") from None

    def shutdown(self, timeout: float) -> None:
        """Wait for the engine's answers to what was handed over, then hang up."""
        self.link.stop(drain=True, timeout=timeout)

    def apply(self, head: dict[str, Any]) -> None:
        """Route to exactly the versions the engine serves (the link's reader thread)."""
        table = head["table"]
        with self._apply:
            self._default = table["default"]
            self._catalog = {n: CatalogEntry(p, e, q) for n, (p, e, q) in table["catalog"].items()}
            self._index = table["index"]
            want = {(n, int(v)): rest for n, v, *rest in table["versions"]}
            for (name, v), (path, sig, art, info) in want.items():
                sig = tuple(tuple(f) for f in sig)
                old = self.records.get(name, {}).get(v)
                if old is None or not old.ready or old.signature != sig:
                    mv = self._build(name, v, Path(path), sig, art, info)
                    with self._route:
                        self.records.setdefault(name, {})[v] = mv
            for (name, v), mv in [((n, v), mv) for n, vs in self.records.items() for v, mv in vs.items()]:
                if mv.ready and (name, v) not in want:
                    with self._route:
                        mv.state, mv.reason = "UNAVAILABLE", "unloaded"
                    self.labeled.ready.labels(name, str(v)).set(0)
        self.changed()

    def _build(self, name: str, version: int, path: Path, sig: tuple, art: dict[str, Any],
               info: dict[str, Any]) -> ModelVersion:
        mv = ModelVersion(name, version, path, signature=sig)
        try:
            mv.art = ModelArtifact.from_dict(art, source=f"the engine's {name} version {version}")
        except ArtifactError as e:
            mv.state, mv.reason = "UNAVAILABLE", str(e)
            return mv
        mv.info = EngineInfo(**info)
        entry = self._catalog.get(name)
        mv.batcher = self.link.batcher(name, version, mv.art.preprocess.crop,
                                       (entry.max_queue if entry else 0) or self.settings.max_queue)
        mv.state = "READY"
        self.labeled.ready.labels(name, str(version)).set(1)  # per process: this front end routes to it
        return mv
