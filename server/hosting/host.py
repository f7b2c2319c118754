"""Where a model version lives, as a request sees it: the route table every host keeps.

A host holds the versions of every model of the repository and what state each is in. Two kinds exist:
:class:`~.local.LocalHost` loads engines in this process (one process, or the engine process of
``--frontends``); :class:`~.remote.RemoteHost` is a front end's table, fed only by the engine process's
status. A plain artifact directory is a one-model repository (:mod:`.repository`), so every process layout
routes alike. Requests look a READY version up and hold it while they run (:meth:`ModelHost.acquire`),
so a version is never dropped under a request.
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ..config import Settings
from ..errors import APIError
from ..metrics import Metrics
from .version import UNLOADED, ModelVersion, VersionState, clip, parse_version

log = logging.getLogger("irpe.server")
Listener = Callable[[list["ModelVersion"]], None]
NOT_STARTED = "model is loading / warming up"


@dataclass(frozen=True)
class CatalogEntry:
    """A model the repository holds, loaded or not: its version policy (config form) and any layout error."""

    policy: dict[str, Any]
    error: str = ""
    max_queue: int = 0


class ModelMetrics:
    """Per model and version (labels ``model``, ``version``): images, queue depth, readiness."""

    def __init__(self, metrics: Metrics):
        """Register the three series.

        Args:
            metrics: the server's metrics, whose registry the series join.
        """
        from prometheus_client import Counter, Gauge

        registry = metrics.registry
        labels = ["model", "version"]
        self.images = Counter("irpe_model_images_total", "Images classified, by model version", labels,
                              registry=registry)
        self.depth = Gauge("irpe_model_queue_depth", "Images waiting for inference, by model version", labels,
                           registry=registry)
        self.ready = Gauge("irpe_model_ready", "1 while the model version is loaded and warm", labels,
                           registry=registry)


class ModelHost(ABC):
    """The interface every host implements (the abstract methods), and the route table they share: routing
    over ``records`` (every version tried, by model) and ``catalog()`` (the repository's models). Subclasses
    load (:class:`~.local.LocalHost`) or follow the engine process (:class:`~.remote.RemoteHost`)."""

    def __init__(self, settings: Settings, metrics: Metrics | None = None):
        """An empty route table.

        Args:
            settings: the server's settings.
            metrics: where the per-version series go (a fresh registry when None).
        """
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.records: dict[str, dict[int, ModelVersion]] = {}
        self.labeled = ModelMetrics(self.metrics)
        self.started = False  # the startup warm-up is over (requests answer 503 before)
        # guards ``records`` and each version's state and users: a version is never both acquired and dropped
        self._table_lock = threading.Lock()
        self._released = threading.Condition(self._table_lock)  # notified when a version's last user leaves
        self._listeners: list[Listener] = []

    # ---- what a host provides ----
    @abstractmethod
    def start(self) -> None:
        """Load (or prepare) what startup serves.

        Raises:
            ArtifactError: the default model cannot be served (the one-line startup error).
        """

    @abstractmethod
    def warm(self) -> None:
        """Warm up and start serving (blocking); sets ``started``."""

    @abstractmethod
    def control(self, name: str, load: bool) -> None:
        """``POST /v2/repository/models/{name}/load|unload`` (blocking: run it in a thread).

        Args:
            name: the model.
            load: True to (re)load it, False to unload it.

        Raises:
            APIError: the answer for the client when the load cannot be done.
        """

    @abstractmethod
    def shutdown(self, timeout: float) -> None:
        """Stop taking work; what was handed over is still answered.

        Args:
            timeout: seconds to wait for what was handed over.
        """

    @abstractmethod
    def catalog(self) -> dict[str, CatalogEntry]:
        """Every model of the repository, loaded or not.

        Returns:
            model name -> its version policy, config error and queue bound.
        """

    def startup_failure(self) -> str:
        """Why the default model is not serving after :meth:`warm`.

        Returns:
            The reason, for the one-line startup error.
        """
        return "warm-up failed"

    def fatal(self) -> str:
        """Why the whole server can no longer serve (a dead inference thread, a gone engine process).

        Returns:
            The reason, or "" while it can serve.
        """
        return ""

    # ---- listeners (the service's readiness, the engine's broadcast to front ends) ----
    def subscribe(self, listener: Listener) -> None:
        """Call ``listener(leaving)`` after every change of what is served; ``leaving``: versions about to be
        retired (still answering what was routed to them). Called on the thread that made the change.

        Args:
            listener: called with the list of leaving versions (often empty).
        """
        self._listeners.append(listener)

    def unsubscribe(self, listener: Listener) -> None:
        """Stop calling ``listener``.

        Args:
            listener: one passed to :meth:`subscribe`.

        Raises:
            ValueError: it was not subscribed.
        """
        self._listeners.remove(listener)

    def changed(self, leaving: list[ModelVersion] | None = None) -> None:
        """Tell every listener that what is served changed.

        Args:
            leaving: versions about to be retired (None: none).
        """
        for listener in list(self._listeners):
            listener(leaving or [])

    # ---- routing ----
    def names(self) -> list[str]:
        """Models with at least one READY version.

        Returns:
            Their names, sorted.
        """
        return sorted(name for name, versions in self.records.items()
                      if any(model_version.ready for model_version in versions.values()))

    def default_name(self) -> str:
        """The model a request without one runs on.

        Returns:
            ``--default-model``, else the first ``--load-model``, else the only (or first) model; "" when the
            repository holds none.
        """
        if self.settings.default_model:
            return self.settings.default_model
        if startup := self.settings.startup_models():
            return startup[0]
        known = sorted(self.catalog()) or sorted(self.records)
        return known[0] if known else ""

    def knows(self, name: str) -> bool:
        """Whether the repository holds ``name`` (loaded or not).

        Args:
            name: a model name.

        Returns:
            True when a version was tried or the repository lists it.
        """
        return name in self.records or name in self.catalog()  # records first: no catalog per request

    def lookup(self, name: str | None, version: str | int | None = None) -> ModelVersion:
        """The READY version a request asks for.

        Args:
            name: the model (None or "": the default model).
            version: the version number as the client sent it (None or "": the highest READY one that is not
                being retired).

        Returns:
            The version to run the request on.

        Raises:
            APIError: 404 when no such version is READY; 503 when the model's versions failed to load.
        """
        name = name or self.default_name()
        loaded = {number: model_version for number, model_version in self.records.get(name, {}).items()
                  if model_version.ready}
        if version not in (None, ""):
            number = parse_version(version)
            if number in loaded:
                return loaded[number]
            raise APIError(404, "model_not_found", f"Request for unknown model: '{clip(name)}' version "
                           f"{clip(str(version))} is not found (loaded versions: {sorted(loaded) or 'none'}; see "
                           "POST /v2/repository/index)")
        # a version being retired takes only what was routed to it by number
        loaded = {number: model_version for number, model_version in loaded.items() if not model_version.leaving}
        if not loaded:
            raise self._not_served(name)
        return loaded[max(loaded)]

    def _not_served(self, name: str) -> APIError:
        """The answer when ``name`` has no routable version: 503 with the last failure, else 404."""
        failures = [model_version.failure for model_version in self.records.get(name, {}).values()
                    if model_version.failure]
        if failures:
            return APIError(503, "not_ready", f"model '{name}' is not available: {failures[-1]}",
                            {"Retry-After": "1"})
        why = "is not loaded" if name in self.catalog() else "is not in the model repository"
        return APIError(404, "model_not_found", f"Request for unknown model: '{clip(name)}' {why} (models served: "
                        f"{self.names() or 'none'}; see POST /v2/repository/index)")

    @contextmanager
    def acquire(self, name: str | None, version: str | None = None) -> Iterator[ModelVersion]:
        """Hold a READY version for one request: it is not dropped before the request is answered.

        Args:
            name: the model (None or "": the default model).
            version: the version as the client sent it (None or "": the newest).

        Yields:
            The version, held until the block ends.

        Raises:
            APIError: as :meth:`lookup`, and 503 when the version's inference thread died.
        """
        with self._table_lock:
            model_version = self.lookup(name, version)
            model_version.users += 1
        try:
            self.check_alive(model_version)
            yield model_version
        finally:
            with self._table_lock:
                model_version.users -= 1
                if not model_version.users and not model_version.ready:  # a drop may be waiting for it
                    self._released.notify_all()

    def wait_unused(self, model_version: ModelVersion, timeout: float) -> None:
        """Wait until no request holds ``model_version`` (see :meth:`acquire`), or ``timeout`` seconds.

        Args:
            model_version: a version no longer READY (so no new request takes it, and its last user's
                release wakes this wait).
            timeout: the most seconds to wait.
        """
        with self._released:
            self._released.wait_for(lambda: not model_version.users, timeout)

    def check_alive(self, model_version: ModelVersion) -> None:
        """A version whose inference thread died (an error outside the engine call) turns UNAVAILABLE:
        503 with the reason now and for later requests, until it is loaded again.

        Args:
            model_version: the version a request holds.

        Raises:
            APIError: 503 when its inference thread died.
        """
        if model_version.batcher is None or model_version.batcher.alive():
            return
        with self._table_lock:
            model_version.mark_unavailable("an inference worker thread stopped (see the server log); load the "
                                           "model again or restart")
        log.error("model %s version %d: inference worker thread died; it answers 503", model_version.name,
                  model_version.version)
        raise APIError(503, "not_ready", f"model '{model_version.name}' version {model_version.version}: "
                       f"{model_version.reason}", {"Retry-After": "1"})

    def versions(self, failed: bool = False) -> list[ModelVersion]:
        """Every version that serves, by model and version.

        Args:
            failed: include those that failed to load or warm up (with an artifact to describe them).

        Returns:
            The READY versions not being retired (and, before the startup warm-up is over, those still
            loading), sorted by model and version.
        """
        return [model_version for name in sorted(self.records)
                for _, model_version in sorted(self.records[name].items()) if self._listed(model_version, failed)]

    def _listed(self, model_version: ModelVersion, failed: bool) -> bool:
        """Whether :meth:`versions` lists ``model_version``."""
        if model_version.ready and not model_version.leaving:
            return True
        if failed and model_version.artifact is not None and model_version.failure:
            return True
        return not self.started and model_version.state == VersionState.LOADING and model_version.artifact is not None

    def newest(self, name: str) -> ModelVersion | None:
        """The highest READY version of ``name`` that is not being retired.

        Args:
            name: a model name.

        Returns:
            That version, or None when there is none.
        """
        ready = [model_version for model_version in self.records.get(name, {}).values()
                 if model_version.ready and not model_version.leaving]
        return max(ready, key=lambda model_version: model_version.version) if ready else None

    def index(self) -> list[dict[str, str]]:
        """Triton's repository index.

        Returns:
            A row for every version tried (state and reason), and one for each model never loaded.
        """
        rows: list[dict[str, str]] = []
        catalog = self.catalog()
        for name in sorted(set(catalog) | set(self.records)):
            tried = self.records.get(name, {})
            rows += [model_version.entry() for _, model_version in sorted(tried.items())]
            if not tried:
                entry = catalog.get(name)
                reason = entry.error if entry and entry.error else UNLOADED
                rows.append({"name": name, "version": "", "state": VersionState.UNAVAILABLE.value, "reason": reason})
        return rows

    def policy_config(self, name: str) -> dict[str, Any]:
        """The version policy of ``name`` in Triton's config form.

        Args:
            name: a model name.

        Returns:
            Its policy (the latest version when the repository does not list it).
        """
        entry = self.catalog().get(name)
        return entry.policy if entry else {"latest": {"num_versions": 1}}

    def observe(self) -> int:
        """Set every version's queue depth gauge.

        Returns:
            The images queued in all of them.
        """
        total = 0
        for model_version in self.versions():
            depth = model_version.batcher.depth if model_version.batcher is not None else 0
            self.labeled.depth.labels(model_version.name, str(model_version.version)).set(depth)
            total += depth
        return total

    def describe(self) -> dict[str, Any]:
        """Counts for the log.

        Returns:
            The models served and every (model, version) served.
        """
        return {"models": self.names(),
                "versions": [(model_version.name, model_version.version) for model_version in self.versions()]}
