"""Prometheus metrics, one registry per app (so several apps can live in one process, e.g. in tests)."""

from __future__ import annotations

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
