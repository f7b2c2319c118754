"""A ``--frontends`` front end's view of a model repository: route by model name and version.

The engine process owns the models (:class:`~.repository.Repository`: engines, batchers, fair slots). A
front end reads each served version's model.json for its preprocessing and labels, and hands images over
through one shared-memory slot pool per crop size (:class:`~.remote.RemoteBatcher`, one engine connection
each); each frame names the model and version, and the engine runs it on that version's batcher.

Model control (``--model-control poll|explicit``) runs in the engine process: a load or unload arriving at
any front end is forwarded to it (``op: control``); the engine loads, warms, swaps or unloads as in one
process and sends every front end the versions to route to (status frames with ``versions`` and ``seq``),
before it retires a version and after every change, and waits for each link's ``op: ack`` of it. A version
with a new crop size gets its own slot pool and link.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from irpe.artifact import ArtifactError, load_artifact

from .batching import Result
from .config import Settings
from .errors import APIError
from .metrics import Metrics
from .remote import RemoteBatcher
from .repo_layout import RepositoryError, scan
from .repository import ModelVersion, Repository
from .shm import SlotPool
from .stats import ModelStats

CONTROL_TIMEOUT_S = 600.0  # a load builds and warms an engine in the engine process


class RoutedStats(ModelStats):
    """/v2 statistics of one model version, counted by the engine process over every front end; this
    front end's own counters when the engine does not answer."""

    def __init__(self, remote: RemoteBatcher, route: dict[str, str]):
        super().__init__()
        self.remote, self.route = remote, route

    def to_triton(self, name: str, version: str = "1") -> dict[str, Any]:
        try:
            reply = self.remote.request({"op": "stats", **self.route}, timeout=2.0)
        except OSError:
            reply = {}
        if reply.get("stats"):
            return {**reply["stats"], "name": name, "version": version}
        return super().to_triton(name, version)


class RoutedBatcher:
    """The :class:`~.batching.Batcher` surface for one model version, over its crop size's engine link."""

    def __init__(self, remote: RemoteBatcher, name: str, version: int, max_queue: int):
        self.remote, self.route = remote, {"model": name, "version": str(version)}
        self.max_queue = max_queue
        self.stats = RoutedStats(remote, self.route)
        self.stopping = False

    @property
    def depth(self) -> int:
        """Images handed to the engine on this link (all versions sharing the crop size)."""
        return self.remote.depth

    async def submit(self, images: list[np.ndarray]) -> list[Result]:
        """Run ``images`` on this model version in the engine process."""
        started, ok = time.perf_counter(), False
        try:
            results = await self.remote.submit(images, self.route)
            ok = True
            return results
        finally:
            self.stats.request(ok, time.perf_counter() - started)

    def start(self) -> None:
        """Nothing to start: the engine runs the batches."""

    def stop(self, drain: bool = True, timeout: float = 30.0) -> None:
        """The links are stopped by the front end's shutdown."""
        self.stopping = True


class RemoteRepository(Repository):
    """:class:`Repository` whose versions run in the engine process: loading reads model.json only."""

    def __init__(self, root: Path, settings: Settings, metrics: Metrics, engine_path: str, slots: int):
        super().__init__(root, settings, metrics)
        self.engine_path, self.slot_count = engine_path, slots
        self.remotes: dict[int, RemoteBatcher] = {}  # crop size -> engine link
        self.engine_index: list[dict[str, str]] | None = None  # the engine's repository index
        self.engine: Any = None
        self.on_change: Callable[[], None] | None = None
        self._apply = threading.Lock()

    def remote(self, crop: int) -> RemoteBatcher:
        """The engine link (and slot pool) for images of ``crop`` pixels (connected at once when serving)."""
        if crop not in self.remotes:
            pool = SlotPool(self.slot_count, (3, crop, crop))
            link = RemoteBatcher(self.engine_path, pool, self.settings.timeout_s)
            if self.on_change is not None:  # a new crop size loaded while serving
                link.connect()
                link.on_repo = self.apply
            self.remotes[crop] = link
        return self.remotes[crop]

    def live(self, engine: Any, on_change: Callable[[], None]) -> None:
        """Serving: follow the engine's versions from now on (the last status seen, then every new one)."""
        self.engine, self.on_change = engine, on_change
        for link in list(self.remotes.values()):
            link.on_repo = self.apply
        head = next((link.last_repo for link in self.remotes.values() if link.last_repo), None)
        if head is not None:
            self.apply(head)

    def apply(self, head: dict[str, Any]) -> None:
        """Route to exactly the versions the engine serves (a link's reader thread)."""
        with self._apply:
            self.engine_index = head.get("index")
            want = {(n, int(v)): (Path(p), tuple(tuple(f) for f in sig)) for n, v, p, sig in head["versions"]}
            for (name, v), (path, sig) in want.items():
                old = self.records.get(name, {}).get(v)
                if old is None or not old.ready or old.signature != sig:
                    self._route_to(self._build(name, v, path, sig))
            for (name, v), mv in [((n, v), mv) for n, vs in self.records.items() for v, mv in vs.items()]:
                if mv.ready and (name, v) not in want:
                    self._retire(mv)
            with contextlib.suppress(RepositoryError, OSError):
                self.dirs = scan(self.root)
        if self.on_change is not None:
            self.on_change()

    def _route_to(self, mv: ModelVersion) -> None:
        if mv.batcher is None:  # model.json unreadable here: the index says why
            return
        mv.engine = self.engine
        with self._route:
            self.records.setdefault(mv.name, {})[mv.version] = mv
        self._activate(mv)

    def index(self) -> list[dict[str, str]]:
        """The engine's repository index (every version tried there, with the reason)."""
        return self.engine_index if self.engine_index is not None else super().index()

    def control(self, name: str, load: bool) -> None:
        """``POST /v2/repository/models/{name}/load|unload``: done by the engine process (blocking)."""
        link = next(iter(self.remotes.values()))
        try:
            reply = link.request({"op": "control", "name": name, "load": load}, timeout=CONTROL_TIMEOUT_S)
        except OSError as e:
            raise APIError(503, "not_ready", f"the engine process is not reachable ({e})") from None
        if reply.get("status"):
            raise APIError(int(reply["status"]), reply.get("code", "internal"), reply.get("msg", ""),
                           reply.get("headers"))

    def _build(self, name: str, version: int, path: Path, sig: tuple) -> ModelVersion:
        mv = ModelVersion(name, version, path, signature=sig)
        try:
            mv.art = load_artifact(path, verify_checksum=False)  # the engine process verified the files
        except (ArtifactError, OSError) as e:
            return self._failed(mv, str(e))
        d = self.dirs.get(name)
        mv.batcher = RoutedBatcher(self.remote(mv.art.preprocess.crop), name, version,  # type: ignore[assignment]
                                   (d.config.max_queue if d else 0) or self.settings.max_queue)
        return mv

    def _activate(self, mv: ModelVersion) -> None:
        with self._route:
            mv.state = "READY"
        self.labeled.ready.labels(mv.name, str(mv.version)).set(1)  # per process: this front end routes to it

    def _retire(self, mv: ModelVersion) -> None:
        with self._route:
            mv.state, mv.reason = "UNAVAILABLE", "unloaded"
        self.labeled.ready.labels(mv.name, str(mv.version)).set(0)
