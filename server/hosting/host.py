"""Where a model version lives, as a request sees it: the route table every host keeps.

A host holds the versions of every model of the repository and what state each is in. Two kinds exist:
:class:`~.local.LocalHost` loads engines in this process (one process, or the engine process of
``--frontends``); :class:`~.remote.RemoteHost` is a front end's table, fed only by the engine process's
status. A plain artifact directory is a one-model repository (:mod:`.layout`), so every process layout
routes alike. Requests look a READY version up and hold it while they run (:meth:`ModelHost.acquire`),
so a version is never dropped under a request.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from irpe.artifact import ModelArtifact

from ..batching import BatchQueue
from ..config import Settings
from ..engines.base import Engine, EngineInfo
from ..errors import APIError
from ..metrics import Metrics

log = logging.getLogger("irpe.server")
Listener = Callable[[list["ModelVersion"]], None]
NOT_STARTED = "model is loading / warming up"


_VERSION = re.compile(r"[0-9]{1,18}")  # ASCII digits only ('²'.isdigit() is true), at most 18 of them


def parse_version(version: str | int) -> int:
    """A version number a client sent (path or query), parsed once: a plain ASCII number, else -1."""
    if isinstance(version, int):
        return version
    return int(version) if _VERSION.fullmatch(version) else -1


def clip(text: str, limit: int = 80) -> str:
    """A client's string shortened for a message (model names and versions come from the URL)."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


@dataclass(eq=False)
class ModelVersion:
    """One version of one model: loaded (READY), loading, or UNAVAILABLE with the reason."""

    name: str
    version: int
    path: Path
    art: ModelArtifact | None = None
    engine: Engine | None = None  # in the process that runs it (LocalHost) only
    batcher: BatchQueue | None = None  # kept (stopped) after the version is retired: never another's
    state: str = "LOADING"
    reason: str = ""
    signature: tuple = ()
    users: int = 0  # requests holding this version (see ModelHost.acquire)
    info: EngineInfo | None = None  # what runs it (its engine's facts, in every process)
    leaving: bool = False  # being retired: still answers requests already routed to it, announced no more
    rejected: tuple = ()  # the signature of files rewritten in place that failed to load (this one serves on)

    @property
    def ready(self) -> bool:
        return self.state == "READY"

    def entry(self) -> dict[str, str]:
        """Its row of Triton's repository index (no ``reason`` when there is none, as Triton writes it)."""
        row = {"name": self.name, "version": str(self.version), "state": self.state}
        return {**row, "reason": self.reason} if self.reason else row


@dataclass(frozen=True)
class CatalogEntry:
    """A model the repository holds, loaded or not: its version policy (config form) and any layout error."""

    policy: dict[str, Any]
    error: str = ""
    max_queue: int = 0


class ModelMetrics:
    """Per model and version (labels ``model``, ``version``): images, queue depth, readiness."""

    def __init__(self, metrics: Metrics):
        from prometheus_client import Counter, Gauge

        r, labels = metrics.registry, ["model", "version"]
        self.images = Counter("irpe_model_images_total", "Images classified, by model version", labels, registry=r)
        self.depth = Gauge("irpe_model_queue_depth", "Images waiting for inference, by model version", labels,
                           registry=r)
        self.ready = Gauge("irpe_model_ready", "1 while the model version is loaded and warm", labels, registry=r)


class ModelHost:
    """The interface every host implements, and the route table they share: routing over ``records`` (every
    version tried, by model) and ``catalog()`` (the repository's models). Subclasses load
    (:class:`~.local.LocalHost`) or follow the engine process (:class:`~.remote.RemoteHost`)."""

    def __init__(self, settings: Settings, metrics: Metrics | None = None):
        self.settings, self.metrics = settings, metrics or Metrics()
        self.records: dict[str, dict[int, ModelVersion]] = {}
        self.labeled = ModelMetrics(self.metrics)
        self.started = False  # the startup warm-up is over (requests answer 503 before)
        self._route = threading.Lock()  # routing vs retiring: a version is never both acquired and dropped
        self._listeners: list[Listener] = []

    # ---- what a host provides ----
    def start(self) -> None:
        """Load (or prepare) what startup serves; ArtifactError / EngineError when the default model cannot
        be served (the one-line startup error)."""
        raise NotImplementedError

    def warm(self) -> None:
        """Warm up and start serving (blocking); sets ``started``."""
        raise NotImplementedError

    def control(self, name: str, load: bool) -> None:
        """``POST /v2/repository/models/{name}/load|unload`` (blocking; APIError for the client)."""
        raise NotImplementedError

    def shutdown(self, timeout: float) -> None:
        """Stop taking work; what was handed over is still answered (within ``timeout``)."""
        raise NotImplementedError

    def catalog(self) -> dict[str, CatalogEntry]:
        """Every model of the repository, loaded or not."""
        raise NotImplementedError

    def startup_failure(self) -> str:
        """Why the default model is not serving after :meth:`warm`."""
        return "warm-up failed"

    def fatal(self) -> str:
        """Why the whole server can no longer serve (a dead inference thread, a gone engine process), or ""."""
        return ""

    # ---- listeners (the service's readiness, the engine's broadcast to front ends) ----
    def subscribe(self, listener: Listener) -> None:
        """Call ``listener(leaving)`` after every change of what is served; ``leaving``: versions about to be
        retired (still answering what was routed to them). Called on the thread that made the change."""
        self._listeners.append(listener)

    def unsubscribe(self, listener: Listener) -> None:
        self._listeners.remove(listener)

    def changed(self, leaving: list[ModelVersion] | None = None) -> None:
        for listener in list(self._listeners):
            listener(leaving or [])

    # ---- routing ----
    def names(self) -> list[str]:
        """Models with at least one READY version, sorted."""
        return sorted(n for n, vs in self.records.items() if any(v.ready for v in vs.values()))

    def default_name(self) -> str:
        """``--default-model``, else the first ``--load-model``, else the only (or first) model."""
        if self.settings.default_model:
            return self.settings.default_model
        if startup := self.settings.startup_models():
            return startup[0]
        known = sorted(self.catalog()) or sorted(self.records)
        return known[0] if known else ""

    def knows(self, name: str) -> bool:
        """Whether the repository holds ``name`` (loaded or not)."""
        return name in self.records or name in self.catalog()  # records first: no catalog per request

    def lookup(self, name: str | None, version: str | int | None = None) -> ModelVersion:
        """The READY version asked for (no version: the highest READY one); 404 APIError otherwise."""
        name = name or self.default_name()
        loaded = {v: mv for v, mv in self.records.get(name, {}).items() if mv.ready}
        if version in (None, ""):  # a version being retired takes only what was routed to it by number
            loaded = {v: mv for v, mv in loaded.items() if not mv.leaving}
        else:
            v = parse_version(version)
            if v in loaded:
                return loaded[v]
            raise APIError(404, "model_not_found", f"Request for unknown model: '{clip(name)}' version "
                           f"{clip(str(version))} is not found (loaded versions: {sorted(loaded) or 'none'}; see "
                           "POST /v2/repository/index)")
        if not loaded:
            broken = [mv.reason for mv in self.records.get(name, {}).values() if mv.reason not in ("", "unloaded")]
            if broken:
                raise APIError(503, "not_ready", f"model '{name}' is not available: {broken[-1]}",
                               {"Retry-After": "1"})
            why = "is not loaded" if name in self.catalog() else "is not in the model repository"
            raise APIError(404, "model_not_found", f"Request for unknown model: '{clip(name)}' {why} (models served: "
                           f"{self.names() or 'none'}; see POST /v2/repository/index)")
        return loaded[max(loaded)]

    @contextmanager
    def acquire(self, name: str | None, version: str | None = None) -> Iterator[ModelVersion]:
        """Hold a READY version for one request: it is not dropped before the request is answered."""
        with self._route:
            mv = self.lookup(name, version)
            mv.users += 1
        try:
            self.check_alive(mv)
            yield mv
        finally:
            with self._route:
                mv.users -= 1

    def check_alive(self, mv: ModelVersion) -> None:
        """A version whose inference thread died (an error outside the engine call) turns UNAVAILABLE:
        503 with the reason now and for later requests, until it is loaded again."""
        if mv.batcher is None or mv.batcher.alive():
            return
        with self._route:
            mv.state = "UNAVAILABLE"
            mv.reason = "an inference worker thread stopped (see the server log); load the model again or restart"
        log.error("model %s version %d: inference worker thread died; it answers 503", mv.name, mv.version)
        raise APIError(503, "not_ready", f"model '{mv.name}' version {mv.version}: {mv.reason}", {"Retry-After": "1"})

    def versions(self, failed: bool = False) -> list[ModelVersion]:
        """Every READY version, by model and version (``failed``: and those that failed to warm up; before
        the startup warm-up is over: and those still loading)."""
        return [mv for n in sorted(self.records) for _, mv in sorted(self.records[n].items())
                if mv.ready and not mv.leaving or failed and mv.art is not None and mv.reason not in ("", "unloaded")
                or not self.started and mv.state == "LOADING" and mv.art is not None]

    def newest(self, name: str) -> ModelVersion | None:
        """The highest READY version of ``name``, if any."""
        ready = [mv for mv in self.records.get(name, {}).values() if mv.ready and not mv.leaving]
        return max(ready, key=lambda m: m.version) if ready else None

    def index(self) -> list[dict[str, str]]:
        """Triton's repository index: every version tried (state + reason), and models never loaded."""
        rows, catalog = [], self.catalog()
        for name in sorted(set(catalog) | set(self.records)):
            tried = self.records.get(name, {})
            rows += [mv.entry() for _, mv in sorted(tried.items())]
            if not tried:
                entry = catalog.get(name)
                reason = entry.error if entry and entry.error else "unloaded"
                rows.append({"name": name, "version": "", "state": "UNAVAILABLE", "reason": reason})
        return rows

    def policy_config(self, name: str) -> dict[str, Any]:
        """The version policy of ``name`` in Triton's config form."""
        entry = self.catalog().get(name)
        return entry.policy if entry else {"latest": {"num_versions": 1}}

    def observe(self) -> int:
        """Set every version's queue depth gauge; returns the images queued in all of them."""
        total = 0
        for mv in self.versions():
            depth = mv.batcher.depth if mv.batcher is not None else 0
            self.labeled.depth.labels(mv.name, str(mv.version)).set(depth)
            total += depth
        return total

    def describe(self) -> dict[str, Any]:
        """Counts for the log."""
        return {"models": self.names(), "versions": [(mv.name, mv.version) for mv in self.versions()]}
