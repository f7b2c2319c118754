"""Server settings: defaults, overridden by ``IRPE_*`` environment variables, overridden by CLI flags."""

from __future__ import annotations

import ipaddress
import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

BACKENDS = ("auto", "onnxruntime", "tensorrt", "openvino")
PRECISIONS = ("auto", "fp32", "bf16")
DEVICES = ("cpu", "cuda")
MODEL_CONTROL = ("none", "poll", "explicit")


@dataclass
class Settings:
    """Everything ``irpe serve`` can be told; each field ``x`` is also read from ``IRPE_<X>``.

    docs/configuration.md is generated from these fields (``python -m irpe.docs_reference``): a field with an
    ``irpe serve`` flag is documented by the flag's help, a field without one by its end-of-line comment."""

    artifact_dir: str = "/models"
    host: str = "127.0.0.1"
    port: int = 8000
    grpc_port: int = -1  # the gRPC front end (inference.GRPCInferenceService); -1: off, 0: a free port
    backend: str = "auto"
    device: str = "cpu"
    max_batch: int = 0
    max_wait_ms: float = 5.0
    max_queue: int = 256
    workers: int = 1
    decode_threads: int = 0
    inference_threads: int = 0
    threads: int = 0
    max_body_mb: float = 20.0
    max_pixels: int = 40_000_000
    timeout_s: float = 30.0
    drain_s: float = 0.0
    api_key: str = ""  # when set, every request but the health checks needs 'Authorization: Bearer <key>'
    admin_key: str = ""  # model control (load/unload) needs it; without it: allowed on a loopback bind only
    log_level: str = "info"
    jpeg_draft: bool = False
    precision: str = "auto"
    insecure: bool = False
    max_images: int = 32
    max_decode_pixels: int = 0
    max_jpeg_scans: int = 100
    max_header_kb: int = 64
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    max_connections: int = 256
    grpc_max_streams: int = 64  # concurrent RPCs on one gRPC connection (HTTP/2 MAX_CONCURRENT_STREAMS)
    grpc_idle_timeout_s: float = 300.0  # a gRPC connection with no RPC, or a stream with no message, closed after
    grpc_max_age_s: float = 3600.0  # a gRPC connection asked to reconnect after (running RPCs get --timeout-s)
    allowed_hosts: str = ""
    frontends: int = -1  # HTTP front-end processes feeding one engine process; 0: one process, -1: auto
    model_control: str = "none"  # how the model repository changes: none | poll | explicit
    poll_interval_s: float = 5.0
    default_model: str = ""  # the model /classify serves without ?model= (default: the only/first one)
    load_model: str = ""  # --model-control explicit: models loaded at startup, comma-separated ('*' or none: all)
    allow_client_shm: bool = False  # Triton's system shared memory extension (clients name /dev/shm regions)
    max_shm_regions: int = 64
    max_shm_region_mb: float = 1024.0
    shm_name_prefix: str = ""  # /dev/shm names any local client may register, whoever owns the file ('': none)

    def startup_models(self) -> list[str] | None:
        """The models ``--load-model`` names for an explicit repository (None: load every model)."""
        names = [n.strip() for n in self.load_model.split(",") if n.strip()]
        return names if self.model_control == "explicit" and names and "*" not in names else None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Defaults < ``IRPE_*`` variables < ``overrides`` (``None`` overrides are ignored)."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = env.get(f"IRPE_{f.name.upper()}")
            if f.name == "frontends" and raw is not None and raw.strip().lower() == "auto":
                raw = "-1"  # IRPE_FRONTENDS=auto, as --frontends auto
            if raw is not None and raw != "":
                values[f.name] = _parse(f.name, raw, type(getattr(cls(), f.name)))
        values.update({k: v for k, v in overrides.items() if v is not None})
        settings = cls(**values)
        settings.validate()
        return settings

    def validate(self) -> None:
        """Raise ValueError naming the setting and the accepted range."""
        if self.backend not in BACKENDS:
            raise ValueError(f"backend {self.backend!r}: choose one of {', '.join(BACKENDS)}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision {self.precision!r}: choose one of {', '.join(PRECISIONS)}")
        if self.device not in DEVICES:
            raise ValueError(f"device {self.device!r}: choose one of {', '.join(DEVICES)}")
        if self.model_control not in MODEL_CONTROL:
            raise ValueError(f"model_control {self.model_control!r}: choose one of {', '.join(MODEL_CONTROL)}")
        if not -1 <= self.grpc_port < 65536 or self.grpc_port == self.port != 0:
            raise ValueError(f"grpc_port {self.grpc_port}: give a port other than the HTTP port {self.port}, "
                             "0 (a free one) or -1 (off)")
        if self.poll_interval_s <= 0:
            raise ValueError(f"poll_interval_s {self.poll_interval_s}: must be positive")
        checks = {"max_batch": self.max_batch >= 0, "max_queue": self.max_queue >= 1,
                  "workers": self.workers >= 1, "max_wait_ms": self.max_wait_ms >= 0,
                  "decode_threads": self.decode_threads >= 0, "threads": self.threads >= 0,
                  "inference_threads": self.inference_threads >= 0,
                  "max_body_mb": self.max_body_mb > 0, "max_pixels": self.max_pixels > 0,
                  "timeout_s": self.timeout_s > 0, "drain_s": self.drain_s >= 0, "port": 0 <= self.port < 65536,
                  **self._limit_checks()}
        bad = [k for k, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"invalid setting(s) {bad}: sizes and times must be positive")
        if self.allow_client_shm and (self.workers > 1 or self.frontends > 1):
            raise ValueError("allow_client_shm: client shared-memory regions are registered per process; use it "
                             "with --workers 1 and --frontends 0 or 1")
        prefix = self.shm_name_prefix
        if prefix and not (3 <= len(prefix) <= 64 and prefix[0] not in ".-"
                           and all(c.isascii() and (c.isalnum() or c in "_.-") for c in prefix)):
            raise ValueError(f"shm_name_prefix {prefix[:80]!r}: give 3-64 letters, digits, '_', '.' or '-' (not "
                             "starting with '.' or '-'), the start of the /dev/shm names clients may share")

    def _limit_checks(self) -> dict[str, bool]:
        """The hostile-input limits (SECURITY.md): all positive; the decode budget fits one maximal image."""
        return {"max_images": self.max_images >= 1, "max_jpeg_scans": self.max_jpeg_scans >= 1,
                "max_decode_pixels": self.max_decode_pixels == 0 or self.max_decode_pixels >= self.max_pixels,
                "max_header_kb": self.max_header_kb >= 1, "header_timeout_s": self.header_timeout_s > 0,
                "body_timeout_s": self.body_timeout_s > 0, "max_connections": self.max_connections >= 1,
                "grpc_max_streams": self.grpc_max_streams >= 1, "grpc_idle_timeout_s": self.grpc_idle_timeout_s > 0,
                "grpc_max_age_s": self.grpc_max_age_s > 0,
                "max_shm_regions": self.max_shm_regions >= 1, "max_shm_region_mb": self.max_shm_region_mb > 0}

    def resolved_max_decode_pixels(self) -> int:
        """Pixels being decoded at once across the pool (each costs up to ~12 bytes while it is
        converted and resized). Auto: twice --max-pixels, so one maximal image never waits for itself."""
        return self.max_decode_pixels or 2 * self.max_pixels

    def host_allowlist(self) -> frozenset[str]:
        """Accepted ``Host`` names (no port); empty = any. Auto: on a loopback bind without an API key,
        only loopback names, so a DNS-rebinding page cannot reach the server through a browser."""
        if self.allowed_hosts.strip() == "*":
            return frozenset()
        names = {h.strip().lower() for h in self.allowed_hosts.split(",") if h.strip()}
        if not names and is_loopback(self.host) and not self.api_key:
            names = set(LOOPBACK_NAMES)
        return frozenset(names)

    def check_exposure(self) -> None:
        """Refuse a non-loopback bind without an API key unless ``insecure`` (raises ValueError)."""
        if not is_loopback(self.host) and not self.api_key and not self.insecure:
            raise ValueError(f"refusing to listen on {self.host} without an API key: set IRPE_API_KEY=<secret> "
                             "(or pass --insecure / IRPE_INSECURE=1 to serve it unauthenticated)")

    @property
    def max_body_bytes(self) -> int:
        """--max-body-mb in bytes."""
        return int(self.max_body_mb * 1024 * 1024)

    def resolved_max_batch(self) -> int:
        """Auto: 32 on a GPU; 4 on a CPU, where measured cost per image grows with the batch (cache)."""
        return self.max_batch or (32 if self.device == "cuda" else 4)

    def resolved_decode_threads(self) -> int:
        """Decode pool size. Auto: one per core on a GPU host; on a CPU, where every core also runs an
        inference worker, half the cores (decoding takes ~10% of the CPU; fewer threads, less contention:
        +2-4% served throughput in ``irpe bench serve`` on 2 cores). With auto, a baseline JPEG of at most
        1 Mpx (the common upload) decodes on the event loop instead (no hand-off: ~0.5 CPU-ms less per
        request, ``irpe bench serve --frontend``); progressive, larger and other images use the pool."""
        if self.decode_threads:
            return self.decode_threads
        return usable_cpus() if self.device == "cuda" else max(1, usable_cpus() // 2)

    def resolved_inference_threads(self) -> int:
        """Auto: one worker per core on CPU (single-threaded sessions), one worker on a GPU."""
        return self.inference_threads or (1 if self.device == "cuda" else usable_cpus())

    def resolved_frontends(self) -> int:
        """Front-end processes (0: one process). Auto: on a GPU, one per usable core but one (kept for the
        engine process: batcher, CUDA driver threads), as decoding is the limit there; on a CPU, one process,
        as the engine needs the cores too and front-end processes only add the hand-off (``irpe bench serve
        --frontend``: --frontends 1 costs about what one process costs per request on 2 cores)."""
        if self.frontends >= 0:
            return self.frontends
        if self.allow_client_shm:  # the regions are registered in one front end
            return 1 if self.device == "cuda" else 0
        return max(1, usable_cpus() - 1) if self.device == "cuda" else 0

    def resolved_solo_threads(self) -> int:
        """Intra-op threads for a batch that runs alone (the engine otherwise idle, nothing queued): every
        usable core on a CPU whose cores are split between inference threads (0: no such session)."""
        if self.device != "cpu" or self.resolved_threads() >= usable_cpus():
            return 0
        return usable_cpus()

    def resolved_threads(self) -> int:
        """ONNX Runtime intra-op threads per worker; auto splits the cores between the workers."""
        return self.threads or max(1, usable_cpus() // self.resolved_inference_threads())

    def to_env(self) -> dict[str, str]:
        """``IRPE_*`` variables reproducing these settings (used to configure worker processes)."""
        return {f"IRPE_{k.upper()}": str(v) for k, v in asdict(self).items()}

    def public(self) -> dict[str, Any]:
        """The settings without secrets (for logs and /v1/models)."""
        d = asdict(self)
        d["api_key"] = "***" if self.api_key else ""
        d["admin_key"] = "***" if self.admin_key else ""
        return d


LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1", "[::1]")


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1)."""
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def usable_cpus() -> int:
    """CPUs this process may really use: the smallest of the CPU count, the affinity mask and the
    cgroup CPU quota (``cpu.max`` in v2, ``cpu.cfs_quota_us`` in v1), rounded up."""
    n = os.cpu_count() or 1
    if hasattr(os, "sched_getaffinity"):
        n = min(n, len(os.sched_getaffinity(0)) or n)
    quota = cgroup_cpu_quota()
    if quota is not None:
        n = min(n, math.ceil(quota))
    return max(1, n)


def cgroup_cpu_quota(root: str = "/sys/fs/cgroup") -> float | None:
    """CPUs allowed by the cgroup quota of this process, or None when unlimited or unknown."""
    base = Path(root)
    try:
        raw = (base / "cpu.max").read_text().split()
        if raw and raw[0] != "max":
            return int(raw[0]) / int(raw[1] if len(raw) > 1 else 100_000)
        if raw:
            return None
    except (OSError, ValueError, ZeroDivisionError):
        pass
    for v1 in (base / "cpu", base / "cpu,cpuacct"):
        try:
            quota = int((v1 / "cpu.cfs_quota_us").read_text())
            period = int((v1 / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            continue
        return quota / period if quota > 0 and period > 0 else None
    return None


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _parse(name: str, raw: str, kind: type) -> Any:
    if kind is bool:
        if raw.strip().lower() not in _TRUE + _FALSE:
            raise ValueError(f"IRPE_{name.upper()}={raw!r}: expected 1/0, true/false, yes/no or on/off")
        return raw.strip().lower() in _TRUE
    try:
        if kind is int:
            return int(float(raw))
        if kind is float:
            return float(raw)
    except ValueError:
        raise ValueError(f"IRPE_{name.upper()}={raw!r}: expected a {kind.__name__}") from None
    return raw
