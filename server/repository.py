"""Many models and versions in one server: load, warm, swap and unload without dropping a request.

Each loaded model version owns its artifact, engine and :class:`~.batching.Batcher` (its own queue and
``/v2`` statistics). All batchers share one :class:`InferenceSlots`: at most ``--inference-threads`` engine
calls run at once, granted first come first served, so a model whose queue is always full takes turns
with a quiet one instead of starving it. A new version is loaded and warmed before it becomes routable;
the versions it replaces stop taking requests at once and are drained (requests already holding them
finish on them) and then dropped. A load that fails (bad model.json, checksum mismatch, a model.onnx the
runtime refuses, a failed warm-up) leaves what was serving in place and the index shows the reason.
Sits above the :class:`~.engine.Engine` interface: every backend works alike.
"""

from __future__ import annotations

import collections
import gc
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from irpe.artifact import ArtifactError, ModelArtifact, load_artifact

from .batching import Batcher
from .config import Settings
from .engine import Engine, EngineError, load_engine, warm_up
from .errors import APIError
from .metrics import Metrics
from .repo_layout import ModelDir, RepositoryError, VersionPolicy, scan, signature

log = logging.getLogger("irpe.server")


class InferenceSlots:
    """At most ``n`` engine calls at once across every model, granted in arrival order (fair share)."""

    def __init__(self, n: int):
        self._free = n
        self._line: collections.deque[object] = collections.deque()
        self._cond = threading.Condition()

    def wrap(self, run: Callable[[np.ndarray], np.ndarray]) -> Callable[[np.ndarray], np.ndarray]:
        """``run`` that waits its turn for a slot."""
        def gated(x: np.ndarray) -> np.ndarray:
            me = object()
            with self._cond:
                self._line.append(me)
                self._cond.wait_for(lambda: self._free > 0 and self._line[0] is me)
                self._line.popleft()
                self._free -= 1
                self._cond.notify_all()
            try:
                return run(x)
            finally:
                with self._cond:
                    self._free += 1
                    self._cond.notify_all()
        return gated


class ModelMetrics:
    """Per model and version (labels ``model``, ``version``): images, queue depth, readiness."""

    def __init__(self, metrics: Metrics):
        from prometheus_client import Counter, Gauge

        r, labels = metrics.registry, ["model", "version"]
        self.images = Counter("irpe_model_images_total", "Images classified, by model version", labels, registry=r)
        self.depth = Gauge("irpe_model_queue_depth", "Images waiting for inference, by model version", labels,
                           registry=r)
        self.ready = Gauge("irpe_model_ready", "1 while the model version is loaded and warm", labels, registry=r)


@dataclass(eq=False)
class ModelVersion:
    """One version of one model: loaded (READY), loading, or UNAVAILABLE with the reason."""

    name: str
    version: int
    path: Path
    art: ModelArtifact | None = None
    engine: Engine | None = None
    batcher: Batcher | None = None
    state: str = "LOADING"
    reason: str = ""
    signature: tuple = ()
    users: int = 0  # requests holding this version (see Repository.acquire)

    @property
    def ready(self) -> bool:
        return self.state == "READY"

    def entry(self) -> dict[str, str]:
        """Its row of Triton's repository index."""
        return {"name": self.name, "version": str(self.version), "state": self.state, "reason": self.reason}


class Repository:
    """The models of ``root`` (see :mod:`.repo_layout`) and what is loaded of them."""

    def __init__(self, root: Path, settings: Settings, metrics: Metrics | None = None):
        self.root, self.settings, self.metrics = root, settings, metrics or Metrics()
        self.slots = InferenceSlots(settings.resolved_inference_threads())
        self.records: dict[str, dict[int, ModelVersion]] = {}  # every version ever tried, by model
        self.dirs: dict[str, ModelDir] = {}
        self._route = threading.Lock()  # routing vs retiring: a version is never both acquired and dropped
        self._control = threading.RLock()  # one load / unload / poll at a time
        self.labeled = ModelMetrics(self.metrics)
        self._quiet = False
        self.on_retire: Callable[[ModelVersion], None] | None = None  # --frontends: the engine tells the front ends

    # ---- routing (event loop) ----
    def names(self) -> list[str]:
        """Models with at least one READY version, sorted."""
        return sorted(n for n, vs in self.records.items() if any(v.ready for v in vs.values()))

    def default_name(self) -> str:
        """``--default-model``, else the only (or first) model of the repository."""
        if self.settings.default_model:
            return self.settings.default_model
        if startup := self.settings.startup_models():
            return startup[0]
        known = sorted(self.dirs) or sorted(self.records)
        return known[0] if known else ""

    def lookup(self, name: str | None, version: str | int | None = None) -> ModelVersion:
        """The READY version asked for (no version: the highest READY one); 404 APIError otherwise."""
        name = name or self.default_name()
        loaded = {v: mv for v, mv in self.records.get(name, {}).items() if mv.ready}
        if version not in (None, ""):
            v = int(version) if str(version).isdigit() else -1
            if v in loaded:
                return loaded[v]
            raise APIError(404, "model_not_found", f"Request for unknown model: '{name}' version {version} is not "
                           f"found (loaded versions: {sorted(loaded) or 'none'}; see POST /v2/repository/index)")
        if not loaded:
            broken = [mv.reason for mv in self.records.get(name, {}).values() if mv.reason not in ("", "unloaded")]
            if broken:
                raise APIError(503, "not_ready", f"model '{name}' is not available: {broken[-1]}",
                               {"Retry-After": "1"})
            why = "is not loaded" if name in self.dirs else "is not in the model repository"
            raise APIError(404, "model_not_found", f"Request for unknown model: '{name}' {why} (models served: "
                           f"{self.names() or 'none'}; see POST /v2/repository/index)")
        return loaded[max(loaded)]

    @contextmanager
    def acquire(self, name: str | None, version: str | None = None) -> Iterator[ModelVersion]:
        """Hold a READY version for one request: it is not dropped before the request is answered."""
        with self._route:
            mv = self.lookup(name, version)
            mv.users += 1
        try:
            yield mv
        finally:
            with self._route:
                mv.users -= 1

    def check_alive(self, mv: ModelVersion) -> None:
        """A version whose inference thread died (an error outside the engine call) turns UNAVAILABLE:
        503 with the reason now and for later requests, until it is loaded again."""
        b = mv.batcher
        if b is None or b.stopping or not any(t.ident is not None and not t.is_alive()
                                              for t in getattr(b, "_threads", [])):
            return
        with self._route:
            mv.state = "UNAVAILABLE"
            mv.reason = "an inference worker thread stopped (see the server log); load the model again or restart"
        log.error("model %s version %d: inference worker thread died; it answers 503", mv.name, mv.version)
        raise APIError(503, "not_ready", f"model '{mv.name}' version {mv.version}: {mv.reason}", {"Retry-After": "1"})

    def versions(self, failed: bool = False) -> list[ModelVersion]:
        """Every READY version, by model and version (``failed``: and those that failed to warm up)."""
        return [mv for n in sorted(self.records) for _, mv in sorted(self.records[n].items())
                if mv.ready or failed and mv.art is not None and mv.reason not in ("", "unloaded")]

    def index(self) -> list[dict[str, str]]:
        """Triton's repository index: every version tried (state + reason), and models never loaded."""
        rows = []
        for name in sorted(set(self.dirs) | set(self.records)):
            tried = self.records.get(name, {})
            rows += [mv.entry() for _, mv in sorted(tried.items())]
            if not tried:
                d = self.dirs.get(name)
                reason = d.error if d and d.error else "unloaded"
                rows.append({"name": name, "version": "", "state": "UNAVAILABLE", "reason": reason})
        return rows

    def policy(self, name: str) -> VersionPolicy:
        d = self.dirs.get(name)
        return d.config.policy if d else VersionPolicy()

    # ---- control (worker threads) ----
    def open(self, warm: bool = False) -> None:
        """Scan and load every model (explicit with ``--load-model``: those models only)."""
        startup = self.settings.startup_models()
        with self._control:
            self.dirs = scan(self.root)
            self._quiet = True  # the default model's failure stops startup with its own one-line message
            try:
                for name in self.dirs if startup is None else [n for n in self.dirs if n in startup]:
                    failed = self._sync(name, warm)
                    if failed and name != self.default_name():
                        log.error("model %s version %d not loaded: %s", name, failed.version, failed.reason)
            finally:
                self._quiet = False

    def warm_all(self) -> None:
        """Warm and start every version loaded by :meth:`open` (``warm=False``)."""
        with self._control:
            for vs in list(self.records.values()):
                for mv in list(vs.values()):
                    if mv.state == "LOADING" and mv.batcher is not None:
                        self._activate(mv)
            for name in list(self.records):
                self._retire_replaced(name)

    def load(self, name: str) -> ModelVersion | None:
        """(Re)load ``name`` from disk per its version policy; RepositoryError (400) when it fails, or
        when no such model is in the repository (404 from the route)."""
        with self._control:
            self.dirs = scan(self.root)
            if name not in self.dirs:
                raise KeyError(name)
            failed = self._sync(name, warm=True)
            if failed:
                raise RepositoryError(f"failed to load '{name}' version {failed.version}: {failed.reason}")
            return self.newest(name)

    def unload(self, name: str) -> None:
        """Stop routing to every version of ``name``, drain them and free their engines."""
        with self._control:
            if name not in self.records and name not in self.dirs:
                raise KeyError(name)
            for mv in list(self.records.get(name, {}).values()):
                self._retire(mv)

    def poll(self) -> None:
        """Rescan: load new or rewritten versions, unload removed ones (``--model-control poll``)."""
        with self._control:
            self.dirs = scan(self.root)
            for name in sorted(set(self.dirs) | set(self.records)):
                if name in self.dirs:
                    self._sync(name, warm=True, retry_failed=False)
                else:
                    for mv in list(self.records.get(name, {}).values()):
                        self._retire(mv)

    def shutdown(self, timeout: float) -> None:
        """Drain every batcher (queued images still run)."""
        for vs in self.records.values():
            for mv in vs.values():
                if mv.batcher is not None:
                    mv.batcher.stop(drain=True, timeout=timeout)

    def newest(self, name: str) -> ModelVersion | None:
        """The highest READY version of ``name``, if any."""
        ready = [mv for mv in self.records.get(name, {}).values() if mv.ready]
        return max(ready, key=lambda m: m.version) if ready else None

    def _sync(self, name: str, warm: bool, retry_failed: bool = True) -> ModelVersion | None:
        """Load what the policy wants and is not loaded (or changed on disk); retire what it no longer wants
        once every wanted version is READY. Returns the first version that failed, if any."""
        d = self.dirs[name]
        if d.error:
            return self._failed(ModelVersion(name, 0, self.root / name), d.error)
        tried = self.records.setdefault(name, {})
        failed = None
        for v in d.config.policy.select(list(d.versions)):
            sig = signature(d.versions[v])
            old = tried.get(v)
            if old is not None and old.signature == sig and \
                    (old.ready or not retry_failed and old.reason != "unloaded"):
                continue  # loaded, or failed and unchanged on disk (a poll does not retry it)
            mv = self._build(name, v, d.versions[v], sig)
            if mv.state == "LOADING" and warm:
                self._activate(mv)
            if mv.state == "UNAVAILABLE":
                failed = failed or mv
                if old is None or not old.ready:  # a version rewritten badly in place: the old one stays
                    tried[v] = mv
                continue
            with self._route:
                tried[v] = mv  # routable before the version it replaces stops taking requests
            if old is not None and old.ready:
                self._retire(old)
        if warm:
            self._retire_replaced(name)
        return failed

    def _retire_replaced(self, name: str) -> None:
        wanted = set(self.dirs[name].config.policy.select(list(self.dirs[name].versions))) if name in self.dirs \
            else set()
        tried = self.records.get(name, {})
        if all(tried.get(v) is not None and tried[v].ready for v in wanted):
            for v, mv in list(tried.items()):
                if v not in wanted and mv.ready:
                    self._retire(mv)

    def _failed(self, mv: ModelVersion, reason: str) -> ModelVersion:
        mv.state, mv.reason, mv.engine, mv.batcher = "UNAVAILABLE", reason, None, None
        if not self._quiet:
            log.error("model %s version %d not loaded: %s", mv.name, mv.version, reason)
        return mv

    def _build(self, name: str, version: int, path: Path, sig: tuple) -> ModelVersion:
        """Read model.json (checksums verified), build the engine and the batcher; not yet warm."""
        mv = ModelVersion(name, version, path, signature=sig)
        s = self.settings
        try:
            mv.art = load_artifact(path)
            mv.engine = load_engine(path, mv.art, backend=s.backend, device=s.device, threads=s.resolved_threads(),
                                    max_batch=s.resolved_max_batch(), precision=s.precision,
                                    streams=s.resolved_inference_threads())
        except (ArtifactError, EngineError, OSError) as e:
            return self._failed(mv, str(e))
        d = self.dirs.get(name)
        info = mv.engine.info
        mv.batcher = Batcher(self.slots.wrap(mv.engine.run), sizes=info.batch_sizes, max_wait_ms=s.max_wait_ms,
                             max_queue=(d.config.max_queue if d else 0) or s.max_queue, metrics=self.metrics,
                             workers=s.resolved_inference_threads())
        log.info("model %s version %d: backend %s (%s) on %s, providers in use %s, batch sizes %s, %d inference "
                 "thread(s) x %d intra-op thread(s)", name, version, info.backend, info.precision, info.device,
                 info.providers, info.batch_sizes, s.resolved_inference_threads(), s.resolved_threads())
        return mv

    def _activate(self, mv: ModelVersion) -> None:
        """Warm every batch size, start the batcher, make it routable."""
        assert mv.engine is not None and mv.art is not None and mv.batcher is not None
        try:
            took = warm_up(mv.engine, mv.art)
        except Exception as e:  # a model that loads but cannot run
            self._failed(mv, f"warm-up failed: {e}")
            return
        mv.batcher.start()
        with self._route:
            mv.state = "READY"
        self.labeled.ready.labels(mv.name, str(mv.version)).set(1)
        log.info("model %s version %d ready (warm-up %.2fs)", mv.name, mv.version, took)

    def _retire(self, mv: ModelVersion) -> None:
        """Unroutable at once; requests holding it finish on it; then its batcher drains and the engine goes."""
        if self.on_retire is not None and mv.ready:
            self.on_retire(mv)
        with self._route:
            was_ready = mv.ready
            mv.state, mv.reason = "UNAVAILABLE", "unloaded"
        if not was_ready and mv.engine is None:
            return
        deadline = time.monotonic() + self.settings.timeout_s
        while mv.users and time.monotonic() < deadline:
            time.sleep(0.005)
        if mv.batcher is not None:
            mv.batcher.stop(drain=True, timeout=self.settings.timeout_s)
        mv.engine, mv.batcher = None, None
        self.labeled.ready.labels(mv.name, str(mv.version)).set(0)
        self.labeled.depth.labels(mv.name, str(mv.version)).set(0)
        gc.collect(0)  # the engine goes by refcount; a full collection would hold the GIL ~50 ms
        log.info("model %s version %d unloaded", mv.name, mv.version)

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
