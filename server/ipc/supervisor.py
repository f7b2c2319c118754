"""``irpe serve --frontends N``: N HTTP front-end processes on one port feeding one engine process; and
``irpe serve --workers N``: N whole servers on one port.

The supervisor (this process) holds the ports (bound with ``SO_REUSEPORT``, never listening) and starts the
processes: with ``--frontends``, the engine process (:mod:`.engine_server`: the model, the one batcher, the one
device context) and N front ends (uvicorn + decode + preprocess, handing images over through shared memory,
:mod:`.link`); with ``--workers``, N workers (:func:`worker_main`: model, batcher, HTTP and gRPC). Each front end
or worker listens on its own socket of the ports, so the kernel spreads new connections over them by their
addresses; on one shared listening socket the first process to wake accepted every connection queued (8 of 8 in
each of 5 bursts of 8 here). The supervisor announces the ports once one process listens, then watches them:

* a front end or worker that dies is restarted (its in-flight requests are lost with it; the others keep
  serving);
* the engine dying makes every front end's /readyz answer 503 at once; the supervisor then stops the
  front ends and exits 1; a front end or worker that exits before any listens (a model that cannot load)
  stops the others, with its exit code;
* SIGTERM/SIGINT: the front ends or workers drain (``--drain-s``: /readyz 503, still serving), stop accepting
  and finish their requests (uvicorn's graceful shutdown), then the engine drains its queue; exit 0.

``/metrics`` on any front end adds up every process (prometheus_client multiprocess mode); a worker's is its own
but for the ``nv_inference_*`` counters (:mod:`..worker_stats`).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from dataclasses import replace
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from pathlib import Path

from ..config import Settings
from ..http.protocol import uvicorn_config_kwargs
from ..runtime import announce, announce_grpc, child_setup

log = logging.getLogger("irpe.server")
RESTART_BACKOFF_S = 1.0
SLOTS = 64  # images a front end can have handed to the engine at once (more: 503 queue_full); 38 MB at 224 px


def frontend_main(settings: Settings, engine_path: str, index: int, listening: Connection) -> None:
    """Front-end process entry point: uvicorn on its own socket of ``settings.port`` (and gRPC on
    ``settings.grpc_port``), each with SO_REUSEPORT.

    Args:
        settings: the server's settings (the ports the supervisor holds).
        engine_path: the engine process's Unix socket.
        index: this front end's number (its process name).
        listening: where it says its number once it listens.

    Raises:
        SystemExit: the gRPC server could not start.
    """
    import uvicorn

    from ..frontend import FrontEndServer
    from ..hosting.remote import RemoteHost
    from ..http.app import create_app
    from ..memory import tune_gc
    from ..metrics import MultiprocessMetrics
    from ..pipeline.service import Service
    from .link import EngineLink

    child_setup(f"irpe-frontend{index}", settings)
    metrics = MultiprocessMetrics()
    slots = min(settings.max_queue, max(SLOTS, 2 * settings.resolved_max_batch()))
    link = EngineLink(engine_path, slots, settings.timeout_s)
    # auto: small baseline JPEGs decode on the event loop (the front-end processes are the parallelism),
    # anything bigger or slower in one thread, so it does not stall the other requests of this process
    service = Service(settings, RemoteHost(settings, link, metrics), metrics,
                      decode_threads=settings.decode_threads or 1)
    app = create_app(settings, service=service)
    service.load()
    tune_gc()
    config = uvicorn.Config(app, **uvicorn_config_kwargs(settings))  # type: ignore[arg-type]
    server = FrontEndServer(config, service, app.state.shm, announce=False, reuse_port=True,
                            on_listening=lambda: listening.send(index))
    server.run(sockets=[listen_on(settings)])
    if server.failure:
        raise SystemExit(f"irpe serve: front end {index}: {server.failure}")


def worker_main(settings: Settings, index: int, listening: Connection) -> None:
    """``--workers`` process entry point: a whole server (model, batcher, HTTP and, with ``--grpc-port``, gRPC)
    on its own listening socket of ``settings.port`` (``SO_REUSEPORT``).

    Args:
        settings: the server's settings (the ports the supervisor holds).
        index: this worker's number (its process name).
        listening: where it says its number once it listens.

    Raises:
        SystemExit: the model could not be loaded, or the gRPC server could not start.
    """
    from ..frontend import loaded_server

    child_setup(f"irpe-worker{index}", settings)
    server = loaded_server(settings, announce=False, reuse_port=True, on_listening=lambda: listening.send(index))
    server.run(sockets=[listen_on(settings)])
    if server.failure:
        raise SystemExit(f"irpe serve: worker {index}: {server.failure}")


def default_frontends(settings: Settings) -> int:
    """Enough front ends to keep the engine busy (:meth:`Settings.resolved_frontends` with ``auto``).

    Args:
        settings: the server's settings.

    Returns:
        The count (at least 1).
    """
    return max(1, replace(settings, frontends=-1).resolved_frontends())


def listen_on(settings: Settings) -> socket.socket:
    """This process's listening socket of ``settings.port`` (SO_REUSEPORT, beside the supervisor's and the other
    processes'): the kernel spreads new connections over the listening sockets of a port by their addresses."""
    sock = reserve_port(settings, settings.port, "--port")
    sock.listen(2048)
    return sock


def reserve_port(settings: Settings, port: int, flag: str) -> socket.socket:
    """A socket bound to ``port`` (0: a free port) with SO_REUSEPORT. The supervisor's never listens: it holds
    the port number while every front end or worker binds the port too and listens (gRPC cannot be handed a
    socket; a worker listens on its own socket of the HTTP port).

    Raises:
        SystemExit: the port cannot be bound (exit 3, as the one-process server's failed bind).
    """
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((settings.host.strip("[]"), port))
    except OSError as e:
        sock.close()
        print(f"irpe serve: error: cannot bind {flag} {port} on {settings.host}: {e.strerror}; pick another "
              f"{flag}, or stop the process that holds it", file=sys.stderr)
        raise SystemExit(3) from None
    return sock


class Supervisor:
    """Starts, watches and stops the engine and the front ends (see the module docstring)."""

    def __init__(self, settings: Settings, frontends: int, workdir: Path | None):
        """``workdir``: the engine process's directory (None: ``--workers``, no engine process)."""
        self.settings = settings
        self.n = frontends
        self.ctx = multiprocessing.get_context("spawn")
        self.engine_path = str(workdir / "engine.sock") if workdir is not None else ""
        self.sock = reserve_port(settings, settings.port, "--port")  # the processes bind the port picked here
        self.settings = replace(self.settings, port=self.sock.getsockname()[1])
        self.grpc_sock = reserve_port(settings, settings.grpc_port, "--grpc-port") if settings.grpc_port >= 0 \
            else None
        if self.grpc_sock is not None:  # the front ends bind the port picked here
            self.settings = replace(self.settings, grpc_port=self.grpc_sock.getsockname()[1])
        self.listening_r, self.listening_w = self.ctx.Pipe(duplex=False)
        self.engine: BaseProcess | None = None
        self.fronts: list[BaseProcess | None] = [None] * frontends
        self.started: list[float] = [0.0] * frontends
        self.stopping = False
        self.wake_r, self.wake_w = os.pipe()

    def _start_engine(self) -> None:
        from .engine_server import engine_main

        self.engine = self.ctx.Process(target=engine_main, args=(self.settings, self.engine_path),
                                       name="irpe-engine", daemon=False)
        self.engine.start()

    def _start_frontend(self, i: int) -> None:
        if self.engine_path:
            p = self.ctx.Process(target=frontend_main, args=(self.settings, self.engine_path, i, self.listening_w),
                                 name=f"irpe-frontend-{i}", daemon=False)
        else:
            p = self.ctx.Process(target=worker_main, args=(self.settings, i, self.listening_w),
                                 name=f"irpe-worker-{i}", daemon=False)
        p.start()
        self.fronts[i] = p
        self.started[i] = time.monotonic()

    def _signal(self, signum: int, frame: object) -> None:
        self.stopping = True
        os.write(self.wake_w, b"x")

    def run(self) -> int:
        """Start everything, watch until SIGTERM/SIGINT or the engine dies; the exit code."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._signal)
        if self.engine_path:
            self._start_engine()
            if not self._engine_loaded():  # a model that cannot load: its one error line, nothing announced
                return self._end(0 if self.stopping else 1)
        for i in range(self.n):
            self._start_frontend(i)
        if (code := self._await_listening()) is not None:
            return self._end(code)
        announce(self.sock.getsockname())  # --port 0: the port the kernel picked
        if self.grpc_sock is not None:
            announce_grpc(self.settings.host, self.settings.grpc_port)
        if self.engine is not None:
            log.info("serving on http://%s:%d with %d front-end process(es) and one engine process (pid %s)",
                     self.settings.host, self.settings.port, self.n, self.engine.pid)
        else:
            log.info("serving on http://%s:%d with %d worker processes", self.settings.host, self.settings.port,
                     self.n)
        return self._end(self._watch())

    def _await_listening(self) -> int | None:
        """Wait until a front end or worker listens: None, or the exit code when stopped first (0) or when one
        of the processes exited first (its own: it said why; the engine's, as in :meth:`_watch`)."""
        while not self.stopping:
            processes = [p for p in (self.engine, *self.fronts) if p is not None]
            wait([self.listening_r, self.wake_r, *(p.sentinel for p in processes)], timeout=1.0)
            if self.listening_r.poll():
                self.listening_r.recv()
                return None
            if (dead := next((p for p in processes if not p.is_alive()), None)) is not None:
                return dead.exitcode if dead.exitcode and dead.exitcode > 0 else 1
        return 0

    def _end(self, code: int) -> int:
        """Close the sockets, stop what runs; the exit code (the engine's own, 3, when it could not load)."""
        if self.grpc_sock is not None:
            self.grpc_sock.close()
        self.sock.close()  # the port's reservation; the processes close theirs as they stop
        self._stop_frontends()
        self._stop_engine()
        exitcode = self.engine.exitcode if self.engine is not None else None
        if code != 0 and exitcode is not None and exitcode > 0:
            return exitcode
        return 1 if code == 0 and exitcode not in (0, -signal.SIGTERM, None) else code

    def _engine_loaded(self) -> bool:
        """Wait until the engine has loaded the model (its socket exists; warm-up goes on meanwhile)."""
        assert self.engine is not None
        while not self.stopping and self.engine.is_alive() and not os.path.exists(self.engine_path):
            wait([self.engine.sentinel, self.wake_r], timeout=0.05)
        return not self.stopping and self.engine.is_alive()

    def _watch(self) -> int:
        while not self.stopping:
            sentinels = [p.sentinel for p in (self.engine, *self.fronts) if p is not None]
            wait([*sentinels, self.wake_r], timeout=1.0)
            if self.stopping:
                return 0
            while self.listening_r.poll():  # restarted workers
                self.listening_r.recv()
            if self.engine is not None and not self.engine.is_alive():
                log.error("the engine process exited with code %s; stopping the front ends and exiting",
                          self.engine.exitcode)
                time.sleep(0.5)  # the front ends' /readyz already answers 503
                code = self.engine.exitcode
                return code if code and code > 0 else 1  # 3: the model could not be loaded
            for i, p in enumerate(self.fronts):
                if p is not None and not p.is_alive():
                    self._restart(i, p)
        return 0

    def _restart(self, i: int, p: BaseProcess) -> None:
        what = "front end" if self.engine_path else "worker"
        log.error("%s %d (pid %s) exited with code %s; restarting it", what, i, p.pid, p.exitcode)
        if p.pid is not None and self.engine_path:
            from prometheus_client import multiprocess

            multiprocess.mark_process_dead(p.pid)
        if time.monotonic() - self.started[i] < RESTART_BACKOFF_S:
            time.sleep(RESTART_BACKOFF_S)  # a crash loop does not spin the supervisor
        self._start_frontend(i)

    def _stop_frontends(self) -> None:
        alive = [p for p in self.fronts if p is not None and p.is_alive()]
        for p in alive:
            os.kill(p.pid, signal.SIGTERM)  # type: ignore[arg-type]
        for p in alive:
            p.join(self.settings.drain_s + self.settings.timeout_s + 15)
            if p.is_alive():
                log.warning("front end pid %s did not stop in time; killing it", p.pid)
                p.kill()
                p.join()

    def _stop_engine(self) -> None:
        if self.engine is None or not self.engine.is_alive():
            return
        os.kill(self.engine.pid, signal.SIGTERM)  # type: ignore[arg-type]
        self.engine.join(self.settings.timeout_s + 15)
        if self.engine.is_alive():
            self.engine.kill()
            self.engine.join()


def serve_frontends(settings: Settings, frontends: int) -> int:
    """Run the supervisor until SIGTERM/SIGINT.

    Args:
        settings: the server's settings.
        frontends: the number of front-end processes, -1 for :func:`default_frontends`.

    Returns:
        The exit code (1 when the engine died).

    Raises:
        SystemExit: a front-end count that is neither >= 1 nor auto.
    """
    if frontends < -1 or frontends == 0:
        raise SystemExit(f"irpe serve: error: --frontends {frontends}: give a count >= 1 or 'auto'")
    workdir = Path(tempfile.mkdtemp(prefix="irpe-serve-"))
    metrics_dir = workdir / "metrics"
    metrics_dir.mkdir()
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)  # inherited by every child (spawned)
    try:
        n = default_frontends(settings) if frontends == -1 else frontends
        return Supervisor(settings, n, workdir).run()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def serve_workers(settings: Settings) -> int:
    """``--workers N``: run N whole servers on the port until SIGTERM/SIGINT.

    Args:
        settings: the server's settings (``workers`` > 1).

    Returns:
        The exit code (a worker's own when the model could not be loaded).
    """
    return Supervisor(settings, settings.workers, None).run()
