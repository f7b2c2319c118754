"""Server settings: defaults, overridden by ``IRPE_*`` environment variables, overridden by CLI flags."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

BACKENDS = ("auto", "onnxruntime", "tensorrt", "openvino")
PRECISIONS = ("auto", "fp32", "bf16")
DEVICES = ("cpu", "cuda")


@dataclass
class Settings:
    """Everything ``irpe serve`` can be told; each field ``x`` is also read from ``IRPE_X``."""

    artifact_dir: str = "/models"
    host: str = "127.0.0.1"
    port: int = 8000
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
    api_key: str = ""
    log_level: str = "info"
    jpeg_draft: bool = False
    precision: str = "auto"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Defaults < ``IRPE_*`` variables < ``overrides`` (``None`` overrides are ignored)."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = env.get(f"IRPE_{f.name.upper()}")
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
        checks = {"max_batch": self.max_batch >= 0, "max_queue": self.max_queue >= 1,
                  "workers": self.workers >= 1, "max_wait_ms": self.max_wait_ms >= 0,
                  "decode_threads": self.decode_threads >= 0, "threads": self.threads >= 0,
                  "inference_threads": self.inference_threads >= 0,
                  "max_body_mb": self.max_body_mb > 0, "max_pixels": self.max_pixels > 0,
                  "timeout_s": self.timeout_s > 0, "port": 0 <= self.port < 65536}
        bad = [k for k, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"invalid setting(s) {bad}: sizes and times must be positive")

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
        +2-4% served throughput in ``irpe bench serve`` on 2 cores)."""
        if self.decode_threads:
            return self.decode_threads
        return _cores() if self.device == "cuda" else max(1, _cores() // 2)

    def resolved_inference_threads(self) -> int:
        """Auto: one worker per core on CPU (single-threaded sessions), one worker on a GPU."""
        return self.inference_threads or (1 if self.device == "cuda" else _cores())

    def resolved_threads(self) -> int:
        """ONNX Runtime intra-op threads per worker; auto splits the cores between the workers."""
        return self.threads or max(1, _cores() // self.resolved_inference_threads())

    def to_env(self) -> dict[str, str]:
        """``IRPE_*`` variables reproducing these settings (used to configure worker processes)."""
        return {f"IRPE_{k.upper()}": str(v) for k, v in asdict(self).items()}

    def public(self) -> dict[str, Any]:
        """The settings without secrets (for logs and /v1/models)."""
        d = asdict(self)
        d["api_key"] = "***" if self.api_key else ""
        return d


def _cores() -> int:
    return max(1, os.cpu_count() or 1)


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
