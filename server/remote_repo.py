"""A ``--frontends`` front end's view of a model repository: route by model name and version.

The engine process owns the models (:class:`~.repository.Repository`: engines, batchers, fair slots). A
front end scans the same repository (``--model-control none``: the set is fixed for the server's life),
reads each served version's model.json for its preprocessing and labels, and hands images over through one
shared-memory slot pool per crop size (:class:`~.remote.RemoteBatcher`, one engine connection each); each
frame names the model and version, and the engine runs it on that version's batcher.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from irpe.artifact import ArtifactError, load_artifact

from .batching import Result
from .config import Settings
from .metrics import Metrics
from .remote import RemoteBatcher
from .repository import ModelVersion, Repository
from .shm import SlotPool
from .stats import ModelStats


class RoutedBatcher:
    """The :class:`~.batching.Batcher` surface for one model version, over its crop size's engine link."""

    def __init__(self, remote: RemoteBatcher, name: str, version: int, max_queue: int):
        self.remote, self.route = remote, {"model": name, "version": str(version)}
        self.max_queue = max_queue
        self.stats = ModelStats()
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

    def remote(self, crop: int) -> RemoteBatcher:
        """The engine link (and slot pool) for images of ``crop`` pixels."""
        if crop not in self.remotes:
            pool = SlotPool(self.slot_count, (3, crop, crop))
            self.remotes[crop] = RemoteBatcher(self.engine_path, pool, self.settings.timeout_s)
        return self.remotes[crop]

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
        mv.state = "READY"

    def _retire(self, mv: ModelVersion) -> None:
        mv.state, mv.reason = "UNAVAILABLE", "unloaded"
