"""Prometheus metrics, one registry per app (so several apps can live in one process, e.g. in tests)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_BATCH = (1, 2, 4, 8, 16, 32, 64, 128)


class Metrics:
    """The server's counters and histograms; ``render()`` gives the text exposition format."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("irpe_requests_total", "HTTP requests by route, method and status",
                                ["route", "method", "status"], registry=r)
        self.latency = Histogram("irpe_request_latency_seconds", "HTTP request latency by route", ["route"],
                                 buckets=_LATENCY, registry=r)
        self.queue_wait = Histogram("irpe_queue_wait_seconds", "Time an image waits for its batch",
                                    buckets=_LATENCY, registry=r)
        self.batch_size = Histogram("irpe_batch_size", "Images per inference call", buckets=_BATCH, registry=r)
        self.inference = Histogram("irpe_inference_seconds", "Duration of one inference call",
                                   buckets=_LATENCY, registry=r)
        self.decode = Histogram("irpe_decode_seconds", "Decode + preprocess time per image",
                                buckets=_LATENCY, registry=r)
        self.queue_depth = Gauge("irpe_queue_depth", "Images waiting for inference", registry=r)
        self.images = Counter("irpe_images_total", "Images classified", registry=r)
        self.ready = Gauge("irpe_ready", "1 once the model is loaded and warmed up", registry=r)
        # the autoscaling signal (docs/deploy/scale-out.md): inference requests received and not yet answered,
        # HTTP and gRPC; with --frontends the sum over the front ends
        self.ongoing = Gauge("irpe_ongoing_requests", "Inference requests being served (received, not answered)",
                             registry=r, multiprocess_mode="livesum")

    def render(self) -> bytes:
        """Text exposition of every metric."""
        return generate_latest(self.registry)


class MultiprocessMetrics(Metrics):
    """Metrics whose values live in ``PROMETHEUS_MULTIPROC_DIR`` (every process of ``--frontends``);
    ``render()`` adds up every process."""

    def render(self) -> bytes:
        from prometheus_client.multiprocess import MultiProcessCollector

        registry = CollectorRegistry()
        MultiProcessCollector(registry)
        return generate_latest(registry)


_NV = (  # Triton's per-model families (labels model, version), their types and help texts
    ("nv_inference_request_success", "counter", "Number of successful inference requests, all batch sizes"),
    ("nv_inference_request_failure", "counter", "Number of failed inference requests, all batch sizes"),
    ("nv_inference_count", "counter", "Number of inferences performed (does not include cached requests)"),
    ("nv_inference_exec_count", "counter", "Number of model executions performed (does not include cached requests)"),
    ("nv_inference_request_duration_us", "counter", "Cumulative inference request duration in microseconds"),
    ("nv_inference_queue_duration_us", "counter", "Cumulative inference queuing duration in microseconds"),
    ("nv_inference_compute_input_duration_us", "counter", "Cumulative compute input duration in microseconds"),
    ("nv_inference_compute_infer_duration_us", "counter", "Cumulative compute inference duration in microseconds"),
    ("nv_inference_compute_output_duration_us", "counter", "Cumulative inference compute output duration in "
     "microseconds"),
    ("nv_inference_pending_request_count", "gauge", "Instantaneous number of pending requests awaiting execution "
     "per-model."),
)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _nv_samples(stats: dict[str, Any]) -> dict[str, list[tuple[str, int]]]:
    infer = stats["inference_stats"]
    us = {k: infer[k]["ns"] // 1000 for k in ("queue", "compute_input", "compute_infer", "compute_output")}
    return {"nv_inference_request_success": [("", infer["success"]["count"])],
            "nv_inference_request_failure": [(f'reason="{r}",', n) for r, n in stats.get("fail_reasons", {}).items()],
            "nv_inference_count": [("", stats["inference_count"])],
            "nv_inference_exec_count": [("", stats["execution_count"])],
            "nv_inference_request_duration_us": [("", (infer["success"]["ns"] + infer["fail"]["ns"]) // 1000)],
            **{f"nv_inference_{k}_duration_us": [("", v)] for k, v in us.items()},
            "nv_inference_pending_request_count": [("", stats["pending"])] if "pending" in stats else []}


def triton_exposition(model_stats: list[dict[str, Any]]) -> bytes:
    """Triton's ``nv_inference_*`` families in the text format, from Triton statistics entries (each with
    ``fail_reasons``, and ``pending`` where the queue is in this process): the same numbers as
    ``/v2/models/stats``, in Triton's metric units and labels."""
    rows = [(f'model="{_label(entry["name"])}",version="{_label(entry["version"])}"', _nv_samples(entry))
            for entry in model_stats]
    lines = []
    for name, kind, text in _NV:
        lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
        lines += [f"{name}{{{extra}{labels}}} {value}" for labels, samples in rows for extra, value in samples[name]]
    return ("\n".join(lines) + "\n").encode()
