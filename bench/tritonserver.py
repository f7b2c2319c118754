"""The real NVIDIA Triton Inference Server (2.51, from the ``nvidia-pytriton`` 0.7.0 wheel) on 127.0.0.1, serving
an exported ``model.onnx`` + ``model.json`` through a Python-backend model that runs ONNX Runtime on the CPU.

The wheel carries ``tritonserver`` and only the Python backend. Its stub links the system ``libpython``, so the
server runs from its own venv made with the system Python (``/usr/bin/python3``), holding the wheel, NumPy and
ONNX Runtime (the same ONNX Runtime version as this interpreter's): :func:`ensure_env` builds it once (pip,
about 450 MB) in ``$IRPE_TRITON_ENV`` or ``~/.cache/irpe/``. It is not an extra of irpe-deploy because the
wheel pins ``numpy<2``.

    with TritonServer(artifact_dir, max_batch=8, instances=1, threads=2) as server:
        server.http_port, server.grpc_port, server.metrics_port, server.model_name
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from irpe.artifact import ModelArtifact, load_artifact

PYTRITON_VERSION = "0.7.0"
SYSTEM_PYTHON = os.environ.get("IRPE_TRITON_PYTHON", "/usr/bin/python3")
MODEL_FILE = Path(__file__).with_name("triton_model.py")
LABELS_FILE = "labels.txt"


class TritonUnavailable(RuntimeError):
    """The Triton environment cannot be built or the server does not come up; the message names the fix."""


def _run(cmd: list[str], timeout: float) -> str:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise TritonUnavailable(f"{' '.join(cmd[:4])} ... failed ({out.returncode}): {out.stderr.strip()[-2000:]}")
    return out.stdout.strip()


def default_env_dir() -> Path:
    """``$IRPE_TRITON_ENV``, or ``~/.cache/irpe/tritonserver-<pytriton>-ort<onnxruntime>``."""
    if os.environ.get("IRPE_TRITON_ENV"):
        return Path(os.environ["IRPE_TRITON_ENV"])
    return Path.home() / ".cache" / "irpe" / f"tritonserver-{PYTRITON_VERSION}-ort{metadata.version('onnxruntime')}"


def ensure_env(env_dir: Path | None = None, *, python: str = SYSTEM_PYTHON, timeout: float = 900.0) -> Path:
    """Make (once) the venv that runs Triton and its Python stub; returns its directory."""
    env_dir = Path(env_dir or default_env_dir())
    env_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(env_dir.parent / f".{env_dir.name}.lock", "w") as lock:  # one builder at a time
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (env_dir / ".irpe-tritonserver-ready").is_file():
            _build_env(env_dir, python, timeout)
    return env_dir


def _build_env(env_dir: Path, python: str, timeout: float) -> None:
    if not Path(python).is_file():
        raise TritonUnavailable(f"{python} not found: Triton's Python stub needs the system Python "
                                "(apt-get install python3 python3-venv libpython3-dev, or set IRPE_TRITON_PYTHON)")
    version = _run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], 60)
    if not any(Path(p).is_file() for p in (f"/usr/lib/x86_64-linux-gnu/libpython{version}.so.1.0",
                                           f"/usr/lib/libpython{version}.so.1.0")):
        raise TritonUnavailable(f"libpython{version}.so.1.0 not found: apt-get install libpython{version}")
    _run([python, "-m", "venv", "--clear", str(env_dir)], 300)
    pins = [f"nvidia-pytriton=={PYTRITON_VERSION}", f"onnxruntime=={metadata.version('onnxruntime')}"]
    _run([str(env_dir / "bin" / "python"), "-m", "pip", "install", "-q", *pins], timeout)
    (env_dir / ".irpe-tritonserver-ready").write_text(" ".join(pins) + "\n")


@dataclass(frozen=True)
class EnvLayout:
    """Where the wheel's pieces are inside the Triton venv."""

    env_dir: Path
    site_packages: Path
    python_version: str

    @classmethod
    def of(cls, env_dir: Path) -> EnvLayout:
        (site,) = (env_dir / "lib").glob("python3*/site-packages")
        return cls(env_dir, site, site.parent.name.removeprefix("python"))

    @property
    def tritonserver(self) -> Path:
        return self.site_packages / "pytriton" / "tritonserver" / "bin" / "tritonserver"

    @property
    def libs(self) -> Path:
        return self.site_packages / "nvidia_pytriton.libs"

    def link_backend(self, backends: Path) -> Path:
        """``backends/python/`` with the backend library, its utils and the stub for this Python version."""
        tree = self.site_packages / "pytriton" / "tritonserver"
        python = backends / "python"
        python.mkdir(parents=True, exist_ok=True)
        for src in (tree / "backends" / "python" / "libtriton_python.so",
                    tree / "backends" / "python" / "triton_python_backend_utils.py",
                    tree / "python_backend_stubs" / self.python_version / "triton_python_backend_stub"):
            if not src.is_file():
                raise TritonUnavailable(f"{src} missing: reinstall the Triton env (delete {self.env_dir})")
            (python / src.name).symlink_to(src)
        return backends


def model_config(name: str, art: ModelArtifact, *, max_batch: int, max_delay_us: int, instances: int,
                 threads: int, preferred: tuple[int, ...] = ()) -> str:
    """``config.pbtxt`` of the Python-backend model (dynamic batching; ``max_delay_us=0``: a lone request runs
    at once; ``preferred``: the preferred batch sizes, none by default)."""
    s = art.img_size
    sizes = f"preferred_batch_size: [ {', '.join(map(str, preferred))} ] " if preferred else ""
    labels = f' label_filename: "{LABELS_FILE}"' if art.labels else ""
    return (f'name: "{name}"\nbackend: "python"\nmax_batch_size: {max_batch}\n'
            f'input [ {{ name: "{art.input_name}" data_type: TYPE_FP32 dims: [ 3, {s}, {s} ] }} ]\n'
            f'output [ {{ name: "{art.output_name}" data_type: TYPE_FP32 dims: [ {art.num_classes} ]{labels} }} ]\n'
            f"dynamic_batching {{ {sizes}max_queue_delay_microseconds: {max_delay_us} }}\n"
            f"instance_group [ {{ count: {instances} kind: KIND_CPU }} ]\n"
            f'parameters {{ key: "intra_op_threads" value: {{ string_value: "{threads}" }} }}\n')


def write_repository(root: Path, name: str, artifact_dir: Path, **config: Any) -> Path:
    """``root/<name>/{config.pbtxt, labels.txt, 1/model.py, 1/model.onnx}``; returns ``root``."""
    art = load_artifact(artifact_dir)
    version = root / name / "1"
    version.mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(model_config(name, art, **config))
    if art.labels:  # Triton's classification extension names the classes from it
        (root / name / LABELS_FILE).write_text("\n".join(art.labels) + "\n")
    shutil.copyfile(MODEL_FILE, version / "model.py")
    shutil.copyfile(artifact_dir / art.onnx_file, version / "model.onnx")
    return root


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TritonServer:
    """``tritonserver`` on 127.0.0.1 serving one exported artifact as ``model_name`` (a context manager)."""

    def __init__(self, artifact_dir: str | Path, *, model_name: str = "irpe", max_batch: int = 8,
                 max_delay_us: int = 0, instances: int = 1, threads: int = 1, env_dir: Path | None = None,
                 startup_timeout_s: float = 120.0, exit_timeout_s: int = 5, preferred: tuple[int, ...] = ()) -> None:
        if min(max_batch, instances, threads) < 1 or max_delay_us < 0:
            raise ValueError("max_batch, instances and threads must be >= 1 and max_delay_us >= 0")
        if any(not 1 <= b <= max_batch for b in preferred):
            raise ValueError(f"preferred batch sizes {preferred} must lie in 1..max_batch ({max_batch})")
        self.artifact_dir = Path(artifact_dir)
        load_artifact(self.artifact_dir)  # a bad directory fails here, before anything starts
        self.model_name = model_name
        self.config = {"max_batch": max_batch, "max_delay_us": max_delay_us, "instances": instances,
                       "threads": threads, "preferred": tuple(preferred)}
        self.env_dir = env_dir
        self.startup_timeout_s = startup_timeout_s
        self.exit_timeout_s = exit_timeout_s  # how long Triton waits for in-flight requests and open clients
        self.http_port = self.grpc_port = self.metrics_port = 0
        self.process: subprocess.Popen | None = None
        self._work: tempfile.TemporaryDirectory | None = None

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def _command(self, layout: EnvLayout, work: Path) -> list[str]:
        return [str(layout.tritonserver), f"--model-repository={work / 'models'}",
                f"--backend-directory={layout.link_backend(work / 'backends')}",
                "--http-address=127.0.0.1", f"--http-port={self.http_port}",
                "--grpc-address=127.0.0.1", f"--grpc-port={self.grpc_port}",
                "--metrics-address=127.0.0.1", f"--metrics-port={self.metrics_port}",
                "--allow-gpu-metrics=false", "--strict-readiness=true", "--exit-on-error=true",
                f"--exit-timeout-secs={self.exit_timeout_s}", "--log-verbose=0"]

    def _environ(self, layout: EnvLayout) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(layout.libs), env.get("LD_LIBRARY_PATH")]))
        env["PATH"] = os.pathsep.join([str(layout.env_dir / "bin"), env.get("PATH", "/usr/bin:/bin")])
        env["VIRTUAL_ENV"] = str(layout.env_dir)
        return env

    def start(self) -> TritonServer:
        """Build the repository, start the server and wait until the model is ready."""
        layout = EnvLayout.of(ensure_env(self.env_dir))
        self._work = tempfile.TemporaryDirectory(prefix="irpe-triton-")
        work = Path(self._work.name)
        write_repository(work / "models", self.model_name, self.artifact_dir, **self.config)
        self.http_port, self.grpc_port, self.metrics_port = free_port(), free_port(), free_port()
        self._log = open(work / "tritonserver.log", "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(self._command(layout, work), env=self._environ(layout), cwd=work,
                                        stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def log_tail(self, chars: int = 3000) -> str:
        """The end of the server's log (stdout and stderr)."""
        if self._work is None:
            return ""
        path = Path(self._work.name) / "tritonserver.log"
        return path.read_text(errors="replace")[-chars:] if path.is_file() else ""

    def _wait_ready(self) -> None:
        url = f"http://{self.http_url}/v2/models/{self.model_name}/ready"
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise TritonUnavailable(f"tritonserver exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        raise TritonUnavailable(f"tritonserver not ready after {self.startup_timeout_s:.0f} s:\n{self.log_tail()}")

    def stop(self) -> int | None:
        """SIGTERM (Triton unloads the model and stops its stubs); SIGKILL to the group, and its shared-memory
        regions removed, if it still runs 10 s after its exit timeout. Returns the exit status."""
        code = None
        if self.process is not None:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGTERM)
            try:
                code = self.process.wait(self.exit_timeout_s + 10.0)
            except subprocess.TimeoutExpired:
                regions = _shm_regions(self.process.pid)
                _kill_group(self.process.pid)
                code = self.process.wait(10)
                for name in regions:
                    Path("/dev/shm", name).unlink(missing_ok=True)
            _kill_group(self.process.pid)  # a stub left behind
        if self._work is not None:
            self._log.close()
            self._work.cleanup()
            self._work = None
        return code

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _shm_regions(pgid: int) -> list[str]:
    """The Python stubs' shared-memory regions in process group ``pgid`` (named on their command lines)."""
    names = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if os.getpgid(int(proc.name)) == pgid:
                args = (proc / "cmdline").read_bytes().split(b"\0")
                names += [a.decode() for a in args if a.startswith(b"triton_python_backend_shm_region_")]
        except (OSError, ValueError):
            continue
    return names


def _raise_keyboard_interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def main() -> int:
    """``python -m irpe.bench.tritonserver ARTIFACT_DIR``: serve until Ctrl-C (prints the ports)."""
    if len(sys.argv) != 2:
        print(f"usage: {sys.argv[0]} ARTIFACT_DIR", file=sys.stderr)
        return 2
    for sig in (signal.SIGINT, signal.SIGTERM):  # also when started in the background (SIGINT ignored)
        signal.signal(sig, _raise_keyboard_interrupt)
    with TritonServer(sys.argv[1]) as server:
        print(f"http {server.http_url}  grpc {server.grpc_url}  metrics 127.0.0.1:{server.metrics_port}  "
              f"model {server.model_name}", flush=True)
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
