"""Prometheus helpers: one registry per app (tests run several apps in one process) and the
conventions in one place (``_total`` counters, ``_seconds`` histograms, bounded labels only)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

# Latency buckets from 5 ms to 2 min: TTFT on a loaded GPU and queue waits both fit.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 0.75, 1, 1.5, 2.5, 5, 10, 20, 40, 80, 120)
TOKEN_BUCKETS = (1, 8, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)


class Metrics:
    """A namespaced metric factory bound to its own registry."""

    def __init__(self, namespace: str, registry: CollectorRegistry | None = None) -> None:
        self.namespace = namespace
        self.registry = registry or CollectorRegistry()

    def counter(self, name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
        if not name.endswith("_total"):
            raise ValueError(f"counter {name} must end in _total")
        # prometheus_client appends _total itself.
        return Counter(name[: -len("_total")], doc, labels, namespace=self.namespace, registry=self.registry)

    def gauge(self, name: str, doc: str, labels: tuple[str, ...] = ()) -> Gauge:
        return Gauge(name, doc, labels, namespace=self.namespace, registry=self.registry)

    def histogram(
        self, name: str, doc: str, labels: tuple[str, ...] = (), buckets: tuple[float, ...] = LATENCY_BUCKETS
    ) -> Histogram:
        return Histogram(name, doc, labels, namespace=self.namespace, registry=self.registry, buckets=buckets)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def parse_prometheus_text(text: str) -> dict[str, float]:
    """Sum samples by metric name (labels dropped): enough for engine load gauges/counters."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_end = line.find("{")
        if name_end == -1:
            name_end = line.find(" ")
        if name_end <= 0:
            continue
        name = line[:name_end]
        try:
            value = float(line.rsplit(" ", 1)[-1] if "}" not in line else line[line.rindex("}") + 1 :].split()[0])
        except (ValueError, IndexError):
            continue
        out[name] = out.get(name, 0.0) + value
    return out
