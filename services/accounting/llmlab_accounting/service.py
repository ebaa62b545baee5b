"""Accounting application logic: insert batches of rows, run GPU-time attribution, export gauges.

Blocking (ClickHouse) methods are called from the transport through ``asyncio.to_thread``.
Imports neither NATS nor FastAPI.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field

import pyarrow as pa
from llmlab_common.catalog import Catalog

from llmlab_accounting.attribution import Alive, Span, WorkerPeriod, attribute
from llmlab_accounting.columns import ATTEMPT_SCHEMA, REQUEST_SCHEMA, to_arrow
from llmlab_accounting.domain import AttemptRow, HeartbeatRow, RequestRow
from llmlab_accounting.metrics import AccountingMetrics
from llmlab_accounting.ports import (
    ATTEMPTS_TABLE,
    ATTRIBUTION_TABLE,
    HEARTBEATS_TABLE,
    PERIODS_TABLE,
    REQUESTS_TABLE,
    Store,
)

log = logging.getLogger(__name__)


@dataclass
class Batch:
    """Rows as Arrow tables (see :mod:`llmlab_accounting.columns`)."""

    attempts: pa.Table
    requests: pa.Table
    ended_at: list[float] = field(default_factory=list)  # a sample, for the ingest-lag histogram

    @classmethod
    def of(cls, attempts: list[AttemptRow], requests: list[RequestRow] | None = None) -> Batch:
        return cls(
            to_arrow(attempts, ATTEMPT_SCHEMA),
            to_arrow(requests or [], REQUEST_SCHEMA),
            [r["ended_at"] for r in attempts[-50:]],
        )

    def __len__(self) -> int:
        return int(self.attempts.num_rows + self.requests.num_rows)


class AccountingService:
    def __init__(self, store: Store, catalog: Catalog, metrics: AccountingMetrics, prefill_weight: float = 1.0) -> None:
        self.store = store
        self.catalog = catalog
        self.m = metrics
        self.prefill_weight = prefill_weight
        self._models = {d.model for d in catalog.deployments}

    # -- ingest ------------------------------------------------------------------------------------
    def insert(self, batch: Batch) -> None:
        """Blocking. Both tables dedup by key (ReplacingMergeTree), so re-inserting a batch after a
        crash or a failed ack is harmless."""
        t0 = time.perf_counter()
        self.store.insert_arrow(ATTEMPTS_TABLE, batch.attempts)
        self.store.insert_arrow(REQUESTS_TABLE, batch.requests)
        self.m.insert_seconds.observe(time.perf_counter() - t0)
        self.m.batches.inc()
        self.m.attempt_rows.inc(batch.attempts.num_rows)
        self.m.request_rows.inc(batch.requests.num_rows)
        self.m.batch_rows.observe(len(batch))
        now = time.time()
        for ended_at in batch.ended_at:
            self.m.ingest_lag.observe(max(0.0, now - ended_at))

    def record_heartbeats(self, rows: list[HeartbeatRow]) -> None:
        """Blocking. Re-recording a heartbeat is harmless (keyed by worker and send time)."""
        self.store.insert_json(HEARTBEATS_TABLE, (json.dumps(r).encode() for r in rows))

    # -- attribution -------------------------------------------------------------------------------
    def alive(self, t0: float, t1: float) -> list[Alive]:
        """Heartbeat intervals that overlap [t0, t1)."""
        rows = self.store.query(
            """
            SELECT worker_id, deployment, model, gpu_usd_per_hour, toFloat64(sent_at), interval_s
            FROM worker_heartbeats FINAL
            WHERE sent_at < {t1:Float64} AND toFloat64(sent_at) + interval_s > {t0:Float64}
            """,
            {"t0": t0, "t1": t1},
        ).rows
        return [Alive(w, d, m, rate, sent, sent + interval) for w, d, m, rate, sent, interval in rows]

    def spans(self, t0: float, t1: float) -> list[Span]:
        rows = self.store.query(
            """
            SELECT worker_id, request_id, attempt, deployment, model, gpu_usd_per_hour,
                   toFloat64(started_at), engine_queue_s, ttft_s, decode_s, e2e_s,
                   prompt_tokens + completion_tokens
            FROM attempts
            WHERE worker_id IS NOT NULL AND started_at IS NOT NULL
              AND started_at < {t1:Float64} AND ended_at >= {t0:Float64}
            """,
            {"t0": t0, "t1": t1},
        ).rows
        return [Span.from_timings(*r) for r in rows]

    def attribute_period(self, t0: float, t1: float) -> list[WorkerPeriod]:
        """Blocking: attribute [t0, t1) and write its rows (a re-run replaces them)."""
        periods = attribute(self.spans(t0, t1), t0, t1, self.prefill_weight, self.alive(t0, t1))
        now = time.time()
        lines: list[bytes] = []
        plines: list[bytes] = []
        for wp in periods:
            for c in wp.attempts:
                lines.append(
                    json.dumps(
                        {
                            "period_start": t0,
                            "worker_id": c.worker_id,
                            "request_id": c.request_id,
                            "attempt": c.attempt,
                            "deployment": c.deployment,
                            "model": c.model,
                            "busy_s": c.busy_s,
                            "busy_usd": c.busy_usd,
                            "idle_usd": c.idle_usd,
                            "standby_usd": c.standby_usd,
                            "gpu_cost_usd": c.total_usd,
                            "computed_at": now,
                        }
                    ).encode()
                )
            plines.append(
                json.dumps(
                    {
                        "period_start": t0,
                        "period_s": wp.period_s,
                        "worker_id": wp.worker_id,
                        "deployment": wp.deployment,
                        "model": wp.model,
                        "usd_per_hour": wp.usd_per_hour,
                        "busy_s": wp.busy_s,
                        "period_usd": wp.period_usd,
                        "attributed_usd": wp.attributed_usd,
                        "attempts": len(wp.attempts),
                        "computed_at": now,
                    }
                ).encode()
            )
        self.store.insert_json(ATTRIBUTION_TABLE, lines)
        self.store.insert_json(PERIODS_TABLE, plines)
        self.m.attribution_runs.inc()
        if periods:
            self._export(periods)
            log.info(
                "attributed %s..%s: %d workers, GPU cost $%.6f, attributed $%.6f",
                dt.datetime.fromtimestamp(t0, dt.UTC).isoformat(),
                dt.datetime.fromtimestamp(t1, dt.UTC).isoformat(),
                len(periods),
                sum(p.period_usd for p in periods),
                sum(p.attributed_usd for p in periods),
            )
        return periods

    def _export(self, periods: list[WorkerPeriod]) -> None:
        rate: dict[str, float] = defaultdict(float)
        cost: dict[str, float] = defaultdict(float)
        count: dict[str, int] = defaultdict(int)
        tokens: dict[str, int] = defaultdict(int)
        for wp in periods:
            model = wp.model if wp.model in self._models else "other"
            rate[model] += wp.usd_per_hour
            for c in wp.attempts:
                cost[model] += c.total_usd
                count[model] += 1
                tokens[model] += c.tokens
        for model in rate:
            self.m.gpu_usd_per_hour.labels(model).set(rate[model])
            if count[model]:  # a model whose workers only stood by served no request
                self.m.gpu_usd_per_request.labels(model).set(cost[model] / count[model])
            if tokens[model]:
                self.m.gpu_usd_per_mtok.labels(model).set(cost[model] / tokens[model] * 1e6)
