"""Accounting's metric families (docs/observability.md): rows inserted by table, and the events
stream's size and durable consumers' backlogs from the JetStream probe."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pyarrow as pa
import pytest
from llmlab_accounting.metrics import AccountingMetrics
from llmlab_accounting.service import AccountingService, Batch
from llmlab_common.catalog import Catalog
from llmlab_common.jsprobe import ConsumerLoad, StreamLoad
from llmlab_common.metrics import Metrics, check_exposition
from llmlab_testkit.e2e import samples

pytestmark = pytest.mark.unit


class _Store:
    def __init__(self) -> None:
        self.inserted: list[tuple[str, int]] = []

    def insert_arrow(self, table: str, data: pa.Table) -> None:
        self.inserted.append((table, data.num_rows))

    def insert_json(self, table: str, lines: Iterable[bytes]) -> None: ...

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"unexpected store call {name}")


def test_rows_are_counted_per_table_when_a_batch_is_inserted(catalog: Catalog) -> None:
    """Catches: rows counted per batch or per event instead of per table, or the tables swapped."""
    m = Metrics("llmlab")
    svc = AccountingService(_Store(), catalog, AccountingMetrics(m))  # type: ignore[arg-type]
    svc.insert(Batch(pa.table({"x": [1, 2, 3]}), pa.table({"y": [1]})))
    svc.insert(Batch(pa.table({"x": [4]}), pa.table({"y": pa.array([], pa.int64())})))
    assert samples(m, "llmlab_accounting_rows_total") == {
        'llmlab_accounting_rows_total{table="attempts"}': 4,
        'llmlab_accounting_rows_total{table="requests"}': 1,
    }


def test_events_stream_gauges_show_size_limit_and_each_durable_consumers_backlog() -> None:
    """Catches: an ephemeral consumer (generated name) as a label value, a deleted consumer
    keeping its last backlog, or the stream's limit taken for its size."""
    m = Metrics("llmlab")
    am = AccountingMetrics(m)
    consumers = [
        ConsumerLoad("accounting", True, ("ns.evt.>",), 12, 3),
        ConsumerLoad("budget-settle", True, ("ns.evt.>",), 0, 0),
        ConsumerLoad("Qx81ab", False, ("ns.evt.attempt",), 99, 0),
    ]
    am.set_stream(StreamLoad(messages=40, bytes=8000, max_bytes=1024**3), consumers)
    am.set_stream(StreamLoad(messages=41, bytes=8200, max_bytes=1024**3), consumers[:1])
    assert samples(m, "llmlab_accounting_events_stream") == {
        "llmlab_accounting_events_stream_bytes": 8200,
        "llmlab_accounting_events_stream_max_bytes": 1024**3,
        "llmlab_accounting_events_stream_messages": 41,
    }
    assert samples(m, "llmlab_accounting_consumer_pending_messages") == {
        'llmlab_accounting_consumer_pending_messages{consumer="accounting"}': 12
    }
    assert check_exposition(m.render()[0].decode()) == []
