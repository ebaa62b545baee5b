"""Prometheus metrics of the accounting service (bounded labels: model comes from the catalog)."""

from __future__ import annotations

from llmlab_common.metrics import TOKEN_BUCKETS, Metrics


class AccountingMetrics:
    def __init__(self, m: Metrics) -> None:
        self.events = m.counter(
            "accounting_events_total",
            "Events consumed, by kind (attempt, request, ignored, dead_letter, heartbeat, heartbeat_malformed)",
            ("kind",),
        )
        self.batches = m.counter("accounting_batches_total", "Batches inserted")
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
