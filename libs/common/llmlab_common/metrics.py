"""Prometheus helpers: one registry per app (tests run several apps in one process) and the
conventions in one place (``_total`` counters, ``_seconds`` histograms, bounded labels only).

Every :class:`Metrics` registry also carries prometheus_client's process collector (``process_*``),
:class:`NetworkCollector` (``llmlab_process_network_*_bytes_total``), :class:`HostOomCollector`
(``llmlab_host_oom_kills_total``) and :class:`GcPauseCollector` (``llmlab_process_gc_pause_seconds``).
The label rules of ``docs/observability.md`` are written here once (:data:`LABEL_ALLOW_LIST`,
:data:`MAX_SERIES_PER_FAMILY`) and checked on a scrape by :func:`check_exposition`."""

from __future__ import annotations

import bisect
import gc
import threading
import time
import weakref
from collections.abc import Iterable, Sequence
from pathlib import Path

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

# Latency buckets from 5 ms to 2 min: TTFT on a loaded GPU and queue waits both fit.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 0.75, 1, 1.5, 2.5, 5, 10, 20, 40, 80, 120)
# Inter-token gaps and time per output token: 1 ms to 2.5 s, finest where decode steps fall.
ITL_BUCKETS = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.06, 0.075, 0.1, 0.15, 0.2, 0.3,
    0.5, 0.75, 1, 2.5,
)  # fmt: skip
# One collection of the cyclic garbage collector: 10 us (a young generation) to 1 s (a full
# collection of a large heap, the event loop stopped for all of it).
GC_PAUSE_BUCKETS = (0.00001, 0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
TOKEN_BUCKETS = (1, 8, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)

LABEL_ALLOW_LIST: frozenset[str] = frozenset(
    {
        # llmlab services (docs/observability.md)
        "endpoint",
        "model",
        "plan",
        "status",
        "code",
        "why",
        "step",
        "pool",
        "priority",  # a plan's priority from the catalog (a handful of small integers)
        "engine",
        "outcome",
        "policy",
        "deployment",
        "result",
        "reason",
        "kind",
        "table",
        "consumer",
        "generation",  # CPython's garbage collector generation: 0, 1, 2
        # the engine simulator's vllm:/sglang: families (the engines' own labels)
        "model_name",
        "finished_reason",
        "engine_type",
        "tp_rank",
        "pp_rank",
        # DCGM-exporter's families (simulated by the engine simulator)
        "gpu",
        "modelName",
        "simulated",
        # histogram buckets
        "le",
    }
)
"""Every label name an llmlab service, the engine simulator or the (simulated) DCGM families may
put on a series. Anything else on a scrape is a bug: per-user, per-key, per-request and per-worker
detail belongs to the logs and to ClickHouse, never to a label."""

MAX_SERIES_PER_FAMILY = 200
"""The most series one metric family may have on one scrape of one process, counted as distinct
label sets without ``le`` (a histogram child counts once, whatever its buckets). Bounded labels
stay far below it: endpoint x model x plan x status x code of the gateway's request counter is
the largest family, a few dozen series after a load run."""

_WITH_PROCESS: weakref.WeakSet[CollectorRegistry] = weakref.WeakSet()


class Metrics:
    """A namespaced metric factory bound to its own registry, with the process collectors on it."""

    def __init__(self, namespace: str, registry: CollectorRegistry | None = None) -> None:
        self.namespace = namespace
        self.registry = registry or CollectorRegistry()
        add_process_collectors(self.registry, namespace)

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

    def bulk_histogram(
        self, name: str, doc: str, labels: dict[str, str] | None = None, buckets: tuple[float, ...] = LATENCY_BUCKETS
    ) -> BulkHistogram:
        """A histogram of one label set for many observations at once (:class:`BulkHistogram`)."""
        h = BulkHistogram(f"{self.namespace}_{name}" if self.namespace else name, doc, labels or {}, buckets)
        self.registry.register(h)
        return h

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class BulkHistogram:
    """A Prometheus histogram of one fixed label set, kept as plain counts and rendered at scrape:
    about a fifth of prometheus_client's cost per observation (no lock, no per-bucket object), for
    figures observed by the thousand at once, such as every inter-token gap of an attempt when it
    ends. Observe and scrape on one thread (the service's event loop)."""

    def __init__(self, name: str, doc: str, labels: dict[str, str], buckets: tuple[float, ...]) -> None:
        self.name, self.doc = name, doc
        self.label_names, self.label_values = list(labels), list(labels.values())
        self.bounds = tuple(float(b) for b in buckets)
        self.counts = [0] * (len(self.bounds) + 1)  # the last: above every bound (+Inf)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def observe_gaps(self, times: Sequence[float]) -> None:
        """Observe every difference between consecutive ``times`` (ascending)."""
        if len(times) < 2:
            return
        counts, bounds, find = self.counts, self.bounds, bisect.bisect_left
        prev = times[0]
        for at in times[1:]:
            counts[find(bounds, at - prev)] += 1
            prev = at
        self.sum += times[-1] - times[0]
        self.count += len(times) - 1

    def cumulative(self) -> list[tuple[str, float]]:
        """The exposition's ``(le, count)`` buckets, ``+Inf`` last."""
        acc, buckets = 0, list[tuple[str, float]]()
        for bound, n in zip(self.bounds, self.counts, strict=False):
            acc += n
            buckets.append((floatToGoString(bound), acc))
        buckets.append(("+Inf", self.count))
        return buckets

    def collect(self) -> Iterable[Metric]:
        fam = HistogramMetricFamily(self.name, self.doc, labels=self.label_names)
        fam.add_metric(self.label_values, self.cumulative(), self.sum)
        yield fam


def add_process_collectors(registry: CollectorRegistry, namespace: str = "llmlab") -> None:
    """prometheus_client's process collector (``process_*``), the network and host OOM counters on
    ``registry``, once per registry (a second :class:`Metrics` on the same registry adds nothing;
    prometheus_client's global registry has its own process collector already)."""
    if registry in _WITH_PROCESS:
        return
    _WITH_PROCESS.add(registry)
    if registry is not REGISTRY:
        ProcessCollector(registry=registry)
    registry.register(NetworkCollector(namespace))
    registry.register(HostOomCollector(namespace))
    registry.register(GcPauseCollector(namespace))


class _GcTimer:
    """Times every collection of this process's cyclic garbage collector (gc.callbacks: start and
    stop), per generation; one per process, shared by every registry's :class:`GcPauseCollector`."""

    _installed: _GcTimer | None = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        # one histogram per generation; their names are unused (GcPauseCollector names the family)
        self.generations = [BulkHistogram("", "", {"generation": str(g)}, GC_PAUSE_BUCKETS) for g in range(3)]
        self._started = 0.0

    @classmethod
    def installed(cls) -> _GcTimer:
        with cls._lock:
            if cls._installed is None:
                cls._installed = cls()
                gc.callbacks.append(cls._installed.on_gc)
            return cls._installed

    def on_gc(self, phase: str, info: dict[str, int]) -> None:
        # Runs with the GIL held, in whichever thread collected: one collection at a time.
        if phase == "start":
            self._started = time.perf_counter()
            return
        pause = time.perf_counter() - self._started
        self.generations[min(max(info.get("generation", 0), 0), 2)].observe(pause)


class GcPauseCollector:
    """``<namespace>_process_gc_pause_seconds{generation}``: each collection of CPython's cyclic
    garbage collector in this process, by generation (0-2). A collection holds the GIL, so an
    event loop stands still for its whole length: a full one over a large heap is a latency
    spike that no request's own timer explains."""

    def __init__(self, namespace: str = "llmlab") -> None:
        self.name = f"{namespace}_process_gc_pause_seconds"
        self.timer = _GcTimer.installed()

    def collect(self) -> Iterable[Metric]:
        fam = HistogramMetricFamily(
            self.name, "Collections of the cyclic garbage collector, by generation", labels=["generation"]
        )
        for h in self.timer.generations:
            fam.add_metric(h.label_values, h.cumulative(), h.sum)
        yield fam


def parse_net_dev(text: str) -> tuple[int, int] | None:
    """Received and transmitted bytes summed over the interfaces of ``/proc/<pid>/net/dev``
    except the loopback; None when the text has no interface line."""
    rx = tx = 0
    seen = False
    for line in text.splitlines():
        name, colon, rest = line.partition(":")
        if not colon or "|" in name:
            continue  # the two header lines
        fields = rest.split()
        if len(fields) < 9:
            continue
        seen = True
        if name.strip() == "lo":
            continue
        try:
            rx += int(fields[0])
            tx += int(fields[8])
        except ValueError:
            continue
    return (rx, tx) if seen else None


class NetworkCollector:
    """``<ns>_process_network_receive_bytes_total`` / ``_transmit_bytes_total``: the bytes of the
    process's network namespace (loopback excluded), read from ``/proc/self/net/dev`` at scrape.
    Where the file is missing (not Linux) the families are absent."""

    def __init__(self, namespace: str = "llmlab", path: str | Path = "/proc/self/net/dev") -> None:
        self.prefix = f"{namespace}_" if namespace else ""
        self.path = Path(path)

    def collect(self) -> Iterable[Metric]:
        try:
            totals = parse_net_dev(self.path.read_text())
        except OSError:
            return
        if totals is None:
            return
        rx, tx = totals
        yield CounterMetricFamily(
            f"{self.prefix}process_network_receive_bytes",
            "Bytes received in the process's network namespace (loopback excluded)",
            value=rx,
        )
        yield CounterMetricFamily(
            f"{self.prefix}process_network_transmit_bytes",
            "Bytes sent in the process's network namespace (loopback excluded)",
            value=tx,
        )


class HostOomCollector:
    """``<ns>_host_oom_kills_total``: the kernel's count of OOM kills on this host (or VM) since
    boot, ``oom_kill`` of ``/proc/vmstat``. A process cannot count its own OOM kill (it is dead):
    a rise of this counter beside a restart (``process_start_time_seconds``) says the restart was
    one. On Kubernetes the kubelet's view is kube-state-metrics'
    ``kube_pod_container_status_last_terminated_reason{reason="OOMKilled"}``. Absent where the
    kernel does not export it."""

    def __init__(self, namespace: str = "llmlab", path: str | Path = "/proc/vmstat") -> None:
        self.prefix = f"{namespace}_" if namespace else ""
        self.path = Path(path)

    def collect(self) -> Iterable[Metric]:
        try:
            text = self.path.read_text()
        except OSError:
            return
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                yield CounterMetricFamily(
                    f"{self.prefix}host_oom_kills", "OOM kills by the kernel on this host since boot", value=int(value)
                )
                return


def check_exposition(text: str) -> list[str]:
    """Problems of one scrape against the label rules: one line per (family, label) whose label is
    not in :data:`LABEL_ALLOW_LIST` and one per family with more than
    :data:`MAX_SERIES_PER_FAMILY` series (label sets without ``le``). Empty when all is well."""
    problems: list[str] = []
    seen: set[str] = set()
    for family in text_string_to_metric_families(text):
        if family.name.endswith("_created") and family.name[: -len("_created")] in seen:
            continue  # prometheus_client's creation times of the family above: the same series
        seen.add(family.name)
        bad: dict[str, None] = {}
        series: set[tuple[tuple[str, str], ...]] = set()
        for sample in family.samples:
            for label in sample.labels:
                if label not in LABEL_ALLOW_LIST:
                    bad.setdefault(label, None)
            series.add(tuple(sorted((k, v) for k, v in sample.labels.items() if k != "le")))
        problems.extend(f"{family.name}: label {label!r} is not in LABEL_ALLOW_LIST" for label in bad)
        if len(series) > MAX_SERIES_PER_FAMILY:
            problems.append(f"{family.name}: {len(series)} series, more than {MAX_SERIES_PER_FAMILY}")
    return problems


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
