"""A host that runs its models here: load, warm, swap and unload without dropping a request.

Each loaded model version owns its artifact, engine and :class:`~..batching.Batcher` (its own queue and
``/v2`` statistics); all batchers share one :class:`~.loading.InferenceSlots`. A new version is loaded and
warmed before it becomes routable; the versions it replaces are announced as leaving (listeners: the engine
process tells its front ends), then stop taking requests and are drained (requests already holding them
finish on them) and dropped, after the control lock is released. A load that fails (bad model.json,
checksum mismatch, a model.onnx the runtime refuses, a failed warm-up, or any error no check foresaw)
leaves what was serving in place and the index shows the reason. ``--model-control poll`` guards each
model: a version that failed is logged once and not tried again until its files change, and the models
after it are still loaded and retired.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from irpe.artifact import ArtifactError, load_artifact

from .. import batching
from ..config import Settings
from ..engines import EngineError, load_engine, warm_up
from ..errors import APIError
from ..metrics import Metrics
from .host import CatalogEntry, ModelHost
from .loading import InferenceSlots, RepositoryPoller, log_engine, make_batcher
from .repository import ModelDir, RepositoryError, scan, signature
from .version import ModelVersion, VersionState, clip

log = logging.getLogger("irpe.server")


class LocalHost(ModelHost):
    """The models of ``settings.artifact_dir`` (see :mod:`.repository`), run in this process."""

    def __init__(self, settings: Settings, metrics: Metrics | None = None):
        """Nothing loaded yet (see :meth:`start`).

        Args:
            settings: the server's settings (``artifact_dir`` is the repository).
            metrics: where the per-version series go (a fresh registry when None).
        """
        super().__init__(settings, metrics)
        self.root = Path(settings.artifact_dir)
        self._roots: tuple[str, ...] | None = None
        self.slots = InferenceSlots(settings.resolved_inference_threads())
        self.dirs: dict[str, ModelDir] = {}
        self._control = threading.RLock()  # one load / unload / poll at a time
        self._leaving: list[ModelVersion] = []  # retired under the control lock, dropped after it
        self._quiet = False
        self._poller = RepositoryPoller(self.poll, settings.poll_interval_s)
        self._poll_errors: dict[str, str] = {}  # model -> the error its last poll logged (logged once)

    def catalog(self) -> dict[str, CatalogEntry]:
        """Every model the last scan found on disk, config errors with paths relative (see the base class)."""
        return {name: CatalogEntry(model_dir.config.policy.to_config(), self.relative(model_dir.error),
                                   model_dir.config.max_queue)
                for name, model_dir in self.dirs.items()}

    def relative(self, text: str) -> str:
        """A reason clients see, with the repository's absolute path taken out (paths inside it relative).

        Args:
            text: a message that may name files of the repository.

        Returns:
            The message without the repository's absolute path.
        """
        if self._roots is None:  # resolved once (a realpath walk of syscalls)
            self._roots = tuple(dict.fromkeys((str(self.root), str(self.root.resolve()))))
        for root in self._roots:
            text = text.replace(root + os.sep, "").replace(root, "the model repository")
        return text

    def startup_failure(self) -> str:
        """The first reason a version of the default model gives, else "warm-up failed" (see the base class)."""
        reasons = [model_version.reason for model_version in self.records.get(self.default_name(), {}).values()
                   if model_version.reason]
        return reasons[0] if reasons else "warm-up failed"

    def fatal(self) -> str:
        """The default model's inference thread died, or "" (see the base class)."""
        if not batching.Batcher.any_thread_died():  # asked per request: no thread has ended, nothing to look up
            return ""
        newest = self.newest(self.default_name()) if self.started else None
        if newest is not None and newest.batcher is not None and not newest.batcher.alive():
            return "an inference worker thread stopped (see the server log); restart the server"
        return ""

    # ---- lifecycle ----
    def start(self) -> None:
        """Scan and load every model (explicit with ``--load-model``: those models only), not yet warm.

        Raises:
            ArtifactError: the default model cannot be loaded (missing files, checksum, GPU fallback...).
        """
        self.open(warm=False)
        name = self.default_name()
        tried = self.records.get(name, {})
        failed = [model_version.reason for model_version in tried.values()
                  if model_version.state == VersionState.UNAVAILABLE]
        if not tried or (failed and not any(model_version.engine for model_version in tried.values())):
            raise ArtifactError(failed[0] if failed else f"default model {name!r} is not in {self.root} "
                                f"(models: {sorted(self.dirs)}); fix --default-model")

    def warm(self) -> None:
        """Warm every loaded version (every batch size once), start the batchers; with ``--model-control
        poll`` (and the default model ready), start watching the repository."""
        try:
            self.warm_all()
        finally:
            self.started = True
            self.changed()
        if self.settings.model_control == "poll" and self.newest(self.default_name()) is not None:
            self._poller.start()

    def control(self, name: str, load: bool) -> None:
        """``POST /v2/repository/models/{name}/load|unload`` (blocking: run it in a thread).

        Args:
            name: the model.
            load: True to (re)load it from disk, False to unload it.

        Raises:
            APIError: 503 unless ``--model-control explicit``; 404 for a model the repository lacks; 400 when
                the load fails (the reason, paths relative).
        """
        mode = self.settings.model_control
        if mode != "explicit":  # Triton's answer (and words) whenever the repository is not explicit
            raise APIError(503, "unsupported", "explicit model load / unload is not allowed if polling is enabled "
                           f"(--model-control {mode}; restart with --model-control explicit)")
        try:
            if load:
                self.load(name)
            else:
                self.unload(name)
        except KeyError:
            if not load:
                return  # unloading what is not there: nothing to do (Triton: 200)
            raise APIError(404, "model_not_found", f"failed to load '{clip(name)}': no such model in the repository "
                           f"(models: {sorted(self.dirs)})") from None
        except ArtifactError as e:
            raise APIError(400, "load_failed", self.relative(str(e))) from None

    def shutdown(self, timeout: float) -> None:
        """Stop polling, then drain every batcher: queued images still run (see the base class)."""
        self._poller.stop(timeout)
        for versions in self.records.values():
            for model_version in versions.values():
                if model_version.batcher is not None:
                    model_version.batcher.stop(drain=True, timeout=timeout)

    # ---- control (worker threads) ----
    @contextmanager
    def _controlled(self) -> Iterator[None]:
        """One control operation: under the lock; then (lock released) announce, drop what it retired, and
        tell the listeners again."""
        leaving: list[ModelVersion] = []
        try:
            with self._control:
                try:
                    yield
                finally:
                    leaving = self._leaving
                    self._leaving = []
        finally:
            if leaving:
                self.changed(leaving)  # the engine process: front ends stop routing to them first
                for model_version in leaving:
                    self._drop(model_version)
            self.changed()

    def open(self, warm: bool = False) -> None:
        """Scan and load every model (explicit with ``--load-model``: those models only).

        Args:
            warm: warm each version as it loads (False: :meth:`warm_all` does it later).

        Raises:
            RepositoryError: the repository cannot be read.
        """
        startup = self.settings.startup_models()
        with self._controlled():
            self.dirs = scan(self.root)
            self._quiet = True  # the default model's failure stops startup with its own one-line message
            try:
                for name in self.dirs if startup is None else [name for name in self.dirs if name in startup]:
                    failed = self._sync(name, warm)
                    if failed and name != self.default_name():
                        log.error("model %s version %d not loaded: %s", name, failed.version, failed.reason)
            finally:
                self._quiet = False

    def warm_all(self) -> None:
        """Warm and start every version loaded by :meth:`open` (``warm=False``)."""
        with self._controlled():
            for versions in list(self.records.values()):
                for model_version in list(versions.values()):
                    if model_version.state == VersionState.LOADING and model_version.batcher is not None:
                        self._activate(model_version)
            for name in list(self.records):
                self._retire_replaced(name)

    def load(self, name: str) -> ModelVersion | None:
        """(Re)load ``name`` from disk per its version policy.

        Args:
            name: the model.

        Returns:
            Its newest READY version (None when none is).

        Raises:
            RepositoryError: a version failed to load (400 from the route).
            KeyError: no such model is in the repository (404 from the route).
        """
        with self._controlled():
            self.dirs = scan(self.root)
            if name not in self.dirs:
                raise KeyError(name)
            failed = self._sync(name, warm=True)
            if failed:
                raise RepositoryError(f"failed to load '{name}' version {failed.version}: {failed.reason}")
        return self.newest(name)

    def unload(self, name: str) -> None:
        """Stop routing to every version of ``name``, drain them and free their engines.

        Args:
            name: the model.

        Raises:
            KeyError: neither loaded nor in the repository.
        """
        with self._controlled():
            if name not in self.records and name not in self.dirs:
                raise KeyError(name)
            for model_version in list(self.records.get(name, {}).values()):
                self._retire(model_version)

    def poll(self) -> None:
        """Rescan: load new or rewritten versions, unload removed ones (``--model-control poll``). Each model
        is guarded: one that fails in a way no check foresaw is logged (once while the error stays the same)
        and the models after it are still polled.

        Raises:
            RepositoryError: the repository cannot be read.
        """
        with self._controlled():
            self.dirs = scan(self.root)
            for name in sorted(set(self.dirs) | set(self.records)):
                try:
                    error = self._poll_model(name)
                except Exception as e:
                    error = f"{type(e).__name__}: {str(e)[:200]}"
                    if self._poll_errors.get(name) != error:
                        log.error("polling model %s failed (%s); the other models are still polled", name, error)
                        log.debug("polling model %s failed", name, exc_info=True)
                if error:
                    self._poll_errors[name] = error
                else:
                    self._poll_errors.pop(name, None)

    def _poll_model(self, name: str) -> str:
        """Load, retire or leave ``name`` as its files now say; the config error it has ("" if none)."""
        if name not in self.dirs:
            for model_version in list(self.records.get(name, {}).values()):
                self._retire(model_version)
            return ""
        model_dir = self.dirs[name]
        if model_dir.error:  # a config.json that cannot be read: the index says why; logged when it changes
            if self._poll_errors.get(name) != model_dir.error:
                self._failed(ModelVersion(name, 0, self.root / name), model_dir.error)
            return model_dir.error
        self._sync(name, warm=True, retry_failed=False)
        return ""

    def _sync(self, name: str, warm: bool, retry_failed: bool = True) -> ModelVersion | None:
        """Load what the policy wants and is not loaded (or changed on disk); retire what it no longer wants
        once every wanted version is READY. Returns the first version that failed, if any."""
        model_dir = self.dirs[name]
        if model_dir.error:
            return self._failed(ModelVersion(name, 0, self.root / name), model_dir.error)
        tried = self.records.setdefault(name, {})
        failed = None
        for number in model_dir.config.policy.select(list(model_dir.versions)):
            on_disk = signature(model_dir.versions[number])
            old = tried.get(number)
            if old is not None and old.is_current(on_disk, retry_failed):
                continue
            model_version = self._build(name, number, model_dir.versions[number], on_disk)
            if model_version.state == VersionState.LOADING and warm:
                self._activate(model_version)
            if model_version.state == VersionState.UNAVAILABLE:
                failed = failed or model_version
                if old is None or not old.ready:
                    tried[number] = model_version
                else:  # a version rewritten badly in place: the old one keeps serving, the index says why
                    old.reject_rewrite(model_version)
                continue
            with self._table_lock:
                tried[number] = model_version  # routable before the version it replaces stops taking requests
            if old is not None and old.ready:
                self._retire(old)
        if warm:
            self._retire_replaced(name)
        return failed

    def _retire_replaced(self, name: str) -> None:
        """Retire the READY versions of ``name`` its policy no longer wants, once every wanted one is READY."""
        model_dir = self.dirs.get(name)
        wanted = set(model_dir.config.policy.select(list(model_dir.versions))) if model_dir else set()
        tried = self.records.get(name, {})
        if all(tried.get(number) is not None and tried[number].ready and not tried[number].leaving
               for number in wanted):
            for number, model_version in list(tried.items()):
                if number not in wanted and model_version.ready:
                    self._retire(model_version)

    def _failed(self, model_version: ModelVersion, reason: str) -> ModelVersion:
        """``model_version`` failed to load or warm up: UNAVAILABLE with ``reason`` (paths relative), logged."""
        model_version.mark_unavailable(self.relative(reason))
        model_version.engine = None
        model_version.batcher = None
        if not self._quiet:
            log.error("model %s version %d not loaded: %s", model_version.name, model_version.version, reason)
        return model_version

    def _build(self, name: str, version: int, path: Path, on_disk: tuple) -> ModelVersion:
        """Read model.json (checksums verified), build the engine and the batcher; not yet warm."""
        model_version = ModelVersion(name, version, path, signature=on_disk)
        settings = self.settings
        try:
            model_version.artifact = load_artifact(path)
            model_version.engine = load_engine(
                path, model_version.artifact, backend=settings.backend, device=settings.device,
                threads=settings.resolved_threads(), max_batch=settings.resolved_max_batch(),
                precision=settings.precision, streams=settings.resolved_inference_threads(),
                solo_threads=settings.resolved_solo_threads())
        except (ArtifactError, EngineError, OSError) as e:
            return self._failed(model_version, str(e))
        except Exception as e:  # a file no check foresaw: this version fails (once), the other models still load
            log.debug("loading model %s version %d raised", name, version, exc_info=True)
            return self._failed(model_version, f"loading it raised {type(e).__name__} ({str(e)[:200]}); fix or "
                                "re-export the artifact")
        model_dir = self.dirs.get(name)
        model_version.info = model_version.engine.info
        model_version.batcher = make_batcher(model_version.engine, settings, self.slots, self.metrics,
                                             max_queue=model_dir.config.max_queue if model_dir else 0,
                                             stats_key=(name, version))
        log_engine(model_version, settings)
        return model_version

    def _activate(self, model_version: ModelVersion) -> None:
        """Warm every batch size, start the batcher, make it routable."""
        assert model_version.engine is not None and model_version.artifact is not None
        assert model_version.batcher is not None
        try:
            took = warm_up(model_version.engine, model_version.artifact)
        except Exception as e:  # a model that loads but cannot run
            self._failed(model_version, f"warm-up failed: {e}")
            return
        model_version.batcher.start()
        with self._table_lock:
            model_version.mark_ready()
        self.labeled.ready.labels(model_version.name, str(model_version.version)).set(1)
        log.info("model %s version %d ready (warm-up %.2fs)", model_version.name, model_version.version, took)

    def _retire(self, model_version: ModelVersion) -> None:
        """Under the control lock: announced as leaving; dropped once the lock is released (:meth:`_drop`)."""
        if model_version.leaving:
            return
        if not model_version.ready and model_version.engine is None:
            with self._table_lock:
                model_version.mark_unloaded()
            return
        model_version.leaving = True
        self._leaving.append(model_version)

    def _drop(self, model_version: ModelVersion) -> None:
        """Unroutable at once; requests holding it finish on it; then its batcher drains (and stays, stopped:
        a late request gets 503, never another version) and the engine goes."""
        with self._table_lock:
            model_version.mark_unloaded()
        self.wait_unused(model_version, self.settings.timeout_s)
        if model_version.batcher is not None:
            model_version.batcher.stop(drain=True, timeout=self.settings.timeout_s)
        model_version.engine = None
        self.labeled.ready.labels(model_version.name, str(model_version.version)).set(0)
        self.labeled.depth.labels(model_version.name, str(model_version.version)).set(0)
        gc.collect(0)  # the engine goes by refcount; a full collection would hold the GIL ~50 ms
        log.info("model %s version %d unloaded", model_version.name, model_version.version)

