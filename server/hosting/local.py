"""A host that runs its models here: load, warm, swap and unload without dropping a request.

Each loaded model version owns its artifact, engine and :class:`~..batching.Batcher` (its own queue and
``/v2`` statistics). All batchers share one :class:`InferenceSlots`: at most ``--inference-threads`` engine
calls run at once, granted first come first served, so a model whose queue is always full takes turns
with a quiet one instead of starving it. A new version is loaded and warmed before it becomes routable;
the versions it replaces are announced as leaving (listeners: the engine process tells its front ends),
then stop taking requests and are drained (requests already holding them finish on them) and dropped,
after the control lock is released. A load that fails (bad model.json, checksum mismatch, a model.onnx the
runtime refuses, a failed warm-up, or any error no check foresaw) leaves what was serving in place and the
index shows the reason. ``--model-control poll`` guards each model: a version that failed is logged once and
not tried again until its files change, and the models after it are still loaded and retired.
"""

from __future__ import annotations

import collections
import gc
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from irpe.artifact import ArtifactError, load_artifact

from .. import batching
from ..batching import Batcher
from ..config import Settings
from ..engines import EngineError, load_engine, warm_up
from ..errors import APIError
from ..metrics import Metrics
from .host import CatalogEntry, ModelHost, ModelVersion, clip
from .layout import ModelDir, RepositoryError, scan, signature

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

class LocalHost(ModelHost):
    """The models of ``settings.artifact_dir`` (see :mod:`.layout`), run in this process."""

    def __init__(self, settings: Settings, metrics: Metrics | None = None):
        super().__init__(settings, metrics)
        self.root = Path(settings.artifact_dir)
        self._roots: tuple[str, ...] | None = None
        self.slots = InferenceSlots(settings.resolved_inference_threads())
        self.dirs: dict[str, ModelDir] = {}
        self._control = threading.RLock()  # one load / unload / poll at a time
        self._leaving: list[ModelVersion] = []  # retired under the control lock, dropped after it
        self._quiet = False
        self._poller: threading.Thread | None = None
        self._stop_poll = threading.Event()
        self._poll_errors: dict[str, str] = {}  # model -> the error its last poll logged (logged once)

    def catalog(self) -> dict[str, CatalogEntry]:
        return {n: CatalogEntry(d.config.policy.to_config(), self.relative(d.error), d.config.max_queue)
                for n, d in self.dirs.items()}

    def relative(self, text: str) -> str:
        """A reason clients see, with the repository's absolute path taken out (paths inside it relative)."""
        if self._roots is None:  # resolved once (a realpath walk of syscalls)
            self._roots = tuple(dict.fromkeys((str(self.root), str(self.root.resolve()))))
        for root in self._roots:
            text = text.replace(root + os.sep, "").replace(root, "the model repository")
        return text

    def startup_failure(self) -> str:
        """Why the default model is not serving after the startup warm-up."""
        reasons = [mv.reason for mv in self.records.get(self.default_name(), {}).values() if mv.reason]
        return reasons[0] if reasons else "warm-up failed"

    def fatal(self) -> str:
        if not batching.Batcher.any_thread_died():  # asked per request: no thread has ended, nothing to look up
            return ""
        mv = self.newest(self.default_name()) if self.started else None
        if mv is not None and mv.batcher is not None and not mv.batcher.alive():
            return "an inference worker thread stopped (see the server log); restart the server"
        return ""

    # ---- lifecycle ----
    def start(self) -> None:
        """Scan and load every model (explicit with ``--load-model``: those models only), not yet warm;
        ArtifactError when the default model cannot be loaded (missing files, checksum, GPU fallback...)."""
        self.open(warm=False)
        name = self.default_name()
        tried = self.records.get(name, {})
        failed = [mv.reason for mv in tried.values() if mv.state == "UNAVAILABLE"]
        if not tried or failed and not any(mv.engine for mv in tried.values()):
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
            self._poller = threading.Thread(target=self._poll, name="irpe-repository-poll", daemon=True)
            self._poller.start()

    def _poll(self) -> None:
        while not self._stop_poll.wait(self.settings.poll_interval_s):
            try:
                self.poll()
            except Exception:  # a repository that cannot be read now: try again next time
                log.exception("polling the model repository failed")

    def control(self, name: str, load: bool) -> None:
        """``POST /v2/repository/models/{name}/load|unload`` (blocking: run it in a thread)."""
        mode = self.settings.model_control
        if mode != "explicit":  # Triton's answer (and words) whenever the repository is not explicit
            raise APIError(503, "unsupported", "explicit model load / unload is not allowed if polling is enabled "
                           f"(--model-control {mode}; restart with --model-control explicit)")
        try:
            self.load(name) if load else self.unload(name)
        except KeyError:
            if not load:
                return  # unloading what is not there: nothing to do (Triton: 200)
            raise APIError(404, "model_not_found", f"failed to load '{clip(name)}': no such model in the repository "
                           f"(models: {sorted(self.dirs)})") from None
        except ArtifactError as e:
            raise APIError(400, "load_failed", self.relative(str(e))) from None

    def shutdown(self, timeout: float) -> None:
        """Stop polling, then drain every batcher (queued images still run)."""
        self._stop_poll.set()
        if self._poller is not None:
            self._poller.join(timeout)
        for vs in self.records.values():
            for mv in vs.values():
                if mv.batcher is not None:
                    mv.batcher.stop(drain=True, timeout=timeout)

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
                    leaving, self._leaving = self._leaving, []
        finally:
            if leaving:
                self.changed(leaving)  # the engine process: front ends stop routing to them first
                for mv in leaving:
                    self._drop(mv)
            self.changed()

    def open(self, warm: bool = False) -> None:
        """Scan and load every model (explicit with ``--load-model``: those models only)."""
        startup = self.settings.startup_models()
        with self._controlled():
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
        with self._controlled():
            for vs in list(self.records.values()):
                for mv in list(vs.values()):
                    if mv.state == "LOADING" and mv.batcher is not None:
                        self._activate(mv)
            for name in list(self.records):
                self._retire_replaced(name)

    def load(self, name: str) -> ModelVersion | None:
        """(Re)load ``name`` from disk per its version policy; RepositoryError (400) when it fails, or
        KeyError (404 from the route) when no such model is in the repository."""
        with self._controlled():
            self.dirs = scan(self.root)
            if name not in self.dirs:
                raise KeyError(name)
            failed = self._sync(name, warm=True)
            if failed:
                raise RepositoryError(f"failed to load '{name}' version {failed.version}: {failed.reason}")
        return self.newest(name)

    def unload(self, name: str) -> None:
        """Stop routing to every version of ``name``, drain them and free their engines."""
        with self._controlled():
            if name not in self.records and name not in self.dirs:
                raise KeyError(name)
            for mv in list(self.records.get(name, {}).values()):
                self._retire(mv)

    def poll(self) -> None:
        """Rescan: load new or rewritten versions, unload removed ones (``--model-control poll``). Each model
        is guarded: one that fails in a way no check foresaw is logged (once while the error stays the same)
        and the models after it are still polled."""
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
            for mv in list(self.records.get(name, {}).values()):
                self._retire(mv)
            return ""
        d = self.dirs[name]
        if d.error:  # a config.json that cannot be read: the index says why; logged when the reason changes
            if self._poll_errors.get(name) != d.error:
                self._failed(ModelVersion(name, 0, self.root / name), d.error)
            return d.error
        self._sync(name, warm=True, retry_failed=False)
        return ""

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
            if _current(old, sig, retry_failed):
                continue
            mv = self._build(name, v, d.versions[v], sig)
            if mv.state == "LOADING" and warm:
                self._activate(mv)
            if mv.state == "UNAVAILABLE":
                failed = failed or mv
                if old is None or not old.ready:
                    tried[v] = mv
                else:  # a version rewritten badly in place: the old one keeps serving, the index says why
                    old.reason, old.rejected = (f"the files now on disk failed to load ({mv.reason}); the version "
                                                "loaded before keeps serving"), sig
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
        if all(tried.get(v) is not None and tried[v].ready and not tried[v].leaving for v in wanted):
            for v, mv in list(tried.items()):
                if v not in wanted and mv.ready:
                    self._retire(mv)

    def _failed(self, mv: ModelVersion, reason: str) -> ModelVersion:
        mv.state, mv.reason, mv.engine, mv.batcher = "UNAVAILABLE", self.relative(reason), None, None
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
                                    streams=s.resolved_inference_threads(), solo_threads=s.resolved_solo_threads())
        except (ArtifactError, EngineError, OSError) as e:
            return self._failed(mv, str(e))
        except Exception as e:  # a file no check foresaw: this version fails (once), the other models still load
            log.debug("loading model %s version %d raised", name, version, exc_info=True)
            return self._failed(mv, f"loading it raised {type(e).__name__} ({str(e)[:200]}); fix or re-export "
                                "the artifact")
        d = self.dirs.get(name)
        info = mv.info = mv.engine.info
        solo = getattr(mv.engine, "run_solo", None)
        mv.batcher = Batcher(self.slots.wrap(mv.engine.run), sizes=info.batch_sizes, max_wait_ms=s.max_wait_ms,
                             max_queue=(d.config.max_queue if d else 0) or s.max_queue, metrics=self.metrics,
                             workers=s.resolved_inference_threads(), solo=solo and self.slots.wrap(solo))
        log.info("model %s version %d: backend %s (%s) on %s, providers in use %s%s, batch sizes %s, %d inference "
                 "thread(s) x %d intra-op thread(s)", name, version, info.backend, info.precision, info.device,
                 info.providers, f", custom ops {info.custom_ops}" if info.custom_ops else "", info.batch_sizes,
                 s.resolved_inference_threads(), s.resolved_threads())
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
        """Under the control lock: announced as leaving; dropped once the lock is released (:meth:`_drop`)."""
        if mv.leaving:
            return
        if not mv.ready and mv.engine is None:
            with self._route:
                mv.state, mv.reason = "UNAVAILABLE", "unloaded"
            return
        mv.leaving = True
        self._leaving.append(mv)

    def _drop(self, mv: ModelVersion) -> None:
        """Unroutable at once; requests holding it finish on it; then its batcher drains (and stays, stopped:
        a late request gets 503, never another version) and the engine goes."""
        with self._route:
            mv.state, mv.reason = "UNAVAILABLE", "unloaded"
        deadline = time.monotonic() + self.settings.timeout_s
        while mv.users and time.monotonic() < deadline:
            time.sleep(0.005)
        if mv.batcher is not None:
            mv.batcher.stop(drain=True, timeout=self.settings.timeout_s)
        mv.engine = None
        self.labeled.ready.labels(mv.name, str(mv.version)).set(0)
        self.labeled.depth.labels(mv.name, str(mv.version)).set(0)
        gc.collect(0)  # the engine goes by refcount; a full collection would hold the GIL ~50 ms
        log.info("model %s version %d unloaded", mv.name, mv.version)


def _current(old: ModelVersion | None, sig: tuple, retry_failed: bool) -> bool:
    """Nothing to load: ``old`` is loaded from the files on disk (``sig``), or failed on them and a poll
    does not retry them (a failed load, or a failed rewrite in place while the old version serves)."""
    if old is None or old.leaving:
        return False
    if old.signature == sig:
        return old.ready or not retry_failed and old.reason != "unloaded"
    return not retry_failed and old.ready and old.rejected == sig
