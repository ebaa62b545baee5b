"""Prometheus metrics of the accounting service (bounded labels: model comes from the catalog)."""

from __future__ import annotations

from collections.abc import Iterable

from llmlab_common.jsprobe import ConsumerLoad, StreamLoad, pending_by_durable
from llmlab_common.metrics import TOKEN_BUCKETS, Metrics


class AccountingMetrics:
    def __init__(self, m: Metrics) -> None:
        self.events = m.counter(
            "accounting_events_total",
            "Events consumed, by kind (attempt, request, ignored, dead_letter, heartbeat, heartbeat_malformed)",
            ("kind",),
        )
        # Exported at 0 from the start, so the first dead letter is an increase an alert can see.
        self.events.labels("dead_letter")
        self.batches = m.counter("accounting_batches_total", "Batches inserted")
        self.rows = m.counter("accounting_rows_total", "Rows inserted, by table (attempts, requests)", ("table",))
        self.attempt_rows = self.rows.labels("attempts")
        self.request_rows = self.rows.labels("requests")
        self.insert_errors = m.counter("accounting_insert_errors_total", "Failed inserts (the batch is retried)")
        self.insert_seconds = m.histogram("accounting_insert_seconds", "Time to insert one batch")
        self.batch_rows = m.histogram("accounting_batch_rows", "Events per inserted batch", buckets=TOKEN_BUCKETS)
        self.ingest_lag = m.histogram("accounting_ingest_lag_seconds", "Event end → inserted")
        self.attribution_runs = m.counter("accounting_attribution_runs_total", "Attribution periods computed")
        self.attribution_errors = m.counter("accounting_attribution_errors_total", "Failed attribution runs")
        # Cost gauges of the latest attributed period, by model (idle time included).
        self.gpu_usd_per_hour = m.gauge(
            "accounting_gpu_cost_usd_per_hour", "GPU cost rate of the workers seen in the last period", ("model",)
        )
        self.gpu_usd_per_request = m.gauge(
            "accounting_gpu_cost_usd_per_request", "Attributed GPU cost per attempt in the last period", ("model",)
        )
        self.gpu_usd_per_mtok = m.gauge(
            "accounting_gpu_cost_usd_per_mtok",
            "Attributed GPU cost per 1M tokens (prompt + completion) in the last period",
            ("model",),
        )
        # The events stream (JetStream stream info) and its durable consumers' backlogs.
        self.stream_bytes = m.gauge("accounting_events_stream_bytes", "Bytes held by the events stream")
        self.stream_max_bytes = m.gauge(
            "accounting_events_stream_max_bytes", "The events stream's byte limit (past it new events are refused)"
        )
        self.stream_messages = m.gauge("accounting_events_stream_messages", "Events held by the events stream")
        self.consumer_pending = m.gauge(
            "accounting_consumer_pending_messages",
            "Events not yet delivered to each durable consumer of the events stream",
            ("consumer",),
        )

    def set_stream(self, stream: StreamLoad, consumers: Iterable[ConsumerLoad]) -> None:
        """One probe of the events stream: its size, and each durable consumer's backlog (a
        consumer that was deleted loses its series)."""
        self.stream_bytes.set(stream.bytes)
        self.stream_messages.set(stream.messages)
        if stream.max_bytes is not None:
            self.stream_max_bytes.set(stream.max_bytes)
        self.consumer_pending.clear()
        for name, pending in pending_by_durable(consumers).items():
            self.consumer_pending.labels(name).set(pending)
