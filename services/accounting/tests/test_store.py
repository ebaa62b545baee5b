"""The store on a real chdb directory: the raw tables keep every insert (at least once), FINAL and
the views one row per event and per attempt with a stated precedence (exactly once), list costs
priced per token kind, read-only queries, and the single-writer lock (released after SIGKILL)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import pytest
from llmlab_accounting.columns import ATTEMPT_SCHEMA, REQUEST_SCHEMA
from llmlab_accounting.domain import attempt_row, request_row
from llmlab_accounting.metrics import AccountingMetrics
from llmlab_accounting.ports import ATTEMPTS_TABLE, REQUESTS_TABLE
from llmlab_accounting.service import AccountingService, Batch
from llmlab_accounting.store import ClickHouseStore, StoreLocked, StoreProcess
from llmlab_common.catalog import Catalog
from llmlab_common.messages import AttemptEvent, RequestEvent, Usage
from llmlab_common.metrics import Metrics

pytestmark = pytest.mark.integration
# configs/catalog.yaml: Llama-3.1-8B list prices, USD per 1M tokens (input and output differ on purpose)
LLAMA_IN, LLAMA_OUT = 0.10, 0.20


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ClickHouseStore]:
    s = ClickHouseStore.open(data_dir=tmp_path / "chdb")
    s.ensure_schema()
    try:
        yield s
    finally:
        s.close()


def test_redelivered_events_count_once_and_views_pick_one_row_per_attempt(
    store: ClickHouseStore,
    catalog: Catalog,
    attempt_factory: Callable[..., AttemptEvent],
    refusal_factory: Callable[..., RequestEvent],
    stop_merges: Callable[[ClickHouseStore], None],
) -> None:
    """Catches: an insert that writes a batch twice, or drops rows (raw counts are exact with
    merges stopped); a table key that does not collapse a re-inserted event (FINAL and a forced
    merge hold exactly one row per event); input and output prices swapped in list cost or in
    burnt-token cost; the view picking the wrong row of an attempt."""
    stop_merges(store)
    svc = AccountingService(store, catalog, AccountingMetrics(Metrics("t")))
    events = [
        attempt_factory("r1", 1, "worker_lost", "gateway"),
        attempt_factory("r1", 2, "completed", prompt=100, completion=40),
        attempt_factory("r2", 1, "cancelled", "gateway", prompt=0, completion=5, error_code="client_disconnected"),
        attempt_factory("r2", 1, "cancelled", "worker", prompt=30, completion=9),
        attempt_factory("r4", 1, "engine_error", prompt=30, completion=9),  # failed on the engine: all burnt
        # The engine failed after the last allowed token: the gateway ended the stream at length
        # and its completed event bills what the client received (the prompt: its estimate).
        attempt_factory("r5", 1, "engine_error", prompt=30, completion=8),
        attempt_factory(
            "r5",
            1,
            "completed",
            "gateway",
            finish_reason="length",
            usage=Usage(prompt_tokens=7, completion_tokens=8, total_tokens=15),
        ),
    ]
    refusals = [refusal_factory("r3")]
    copies = 3  # the same events decoded and inserted three times: a crash between insert and ack, twice
    for i in range(copies):
        now = 1_800_000_000.0 + i  # a redelivery is decoded again: a later ingested_at each time
        svc.insert(
            Batch.of([attempt_row(e, catalog, now) for e in events], [request_row(r, catalog, now) for r in refusals])
        )
    # Raw: every insert is stored whole (at-least-once), duplicates included...
    assert store.scalar(f"SELECT count() FROM {ATTEMPTS_TABLE}") == copies * len(events)
    assert store.scalar(f"SELECT count() FROM {REQUESTS_TABLE}") == copies * len(refusals)
    # ...FINAL holds exactly one row per event (key: request_id, attempt, source), the latest copy...
    final = f"SELECT count(), uniqExact(request_id, attempt, source), max(ingested_at) FROM {ATTEMPTS_TABLE} FINAL"
    n, uniq, latest = store.query(final).rows[0]
    assert (n, uniq) == (len(events), len(events)) and latest.timestamp() == pytest.approx(1_800_000_000.0 + copies - 1)
    assert store.scalar(f"SELECT count() FROM {REQUESTS_TABLE} FINAL") == len(refusals)
    # ...and the views one per (request_id, attempt): r2's attempt 1 has two sources.
    assert store.query("SELECT count() FROM attempts").rows == [[5]]
    by_key = {
        (r[0], r[1]): tuple(r[2:])
        for r in store.query(
            "SELECT request_id, attempt, source, events, billed_input_tokens, billed_output_tokens, burnt_tokens,"
            " list_cost_usd, burnt_list_cost_usd FROM attempts"
        ).rows
    }
    assert by_key[("r1", 1)][:5] == ("gateway", 1, 0, 0, 0)
    assert by_key[("r1", 2)][:5] == ("worker", 1, 100, 40, 0)
    # Hand calculation, each token kind at its own catalog price: 100 in × $0.10 + 40 out × $0.20 per 1M.
    assert by_key[("r1", 2)][5:] == (pytest.approx((100 * LLAMA_IN + 40 * LLAMA_OUT) / 1e6), 0)
    # worker row preferred; billing from the gateway's client-disconnect event (input: the worker's count)
    assert by_key[("r2", 1)][:5] == ("worker", 2, 30, 5, 4)
    assert by_key[("r2", 1)][5:] == (
        pytest.approx((30 * LLAMA_IN + 5 * LLAMA_OUT) / 1e6),
        pytest.approx(4 * LLAMA_OUT / 1e6),  # generated beyond what was delivered: output tokens
    )
    assert by_key[("r4", 1)][:5] == ("worker", 1, 0, 0, 39)
    assert by_key[("r4", 1)][5:] == (0, pytest.approx((30 * LLAMA_IN + 9 * LLAMA_OUT) / 1e6))
    reqs = {
        r[0]: tuple(r[1:])
        for r in store.query(
            "SELECT request_id, attempts, status_class, http_status, billed_tokens, fallback_chain FROM requests"
        ).rows
    }
    assert reqs == {
        "r1": (2, "ok", 200, 140, "llama-8b-vllm>llama-8b-vllm"),
        "r2": (1, "cancelled", 499, 35, "llama-8b-vllm"),
        "r3": (0, "refused_budget", 429, 0, ""),
        "r4": (1, "server_error", 0, 0, "llama-8b-vllm"),
        "r5": (1, "ok", 200, 7 + 8, "llama-8b-vllm"),  # how the billing row ended, not the worker's error
    }
    # The attempt keeps the worker's row (the engine's counts and timings) and the billing row's end.
    ended = "SELECT source, outcome, finish_reason, error_code, burnt_tokens FROM attempts WHERE request_id = 'r5'"
    assert store.query(ended).rows == [["worker", "completed", "length", None, 30 - 7]]
    # A merge (forced here) collapses the raw duplicates to exactly what FINAL showed.
    for table in (ATTEMPTS_TABLE, REQUESTS_TABLE):
        store.client.command(f"ALTER TABLE {table} RESET SETTING max_bytes_to_merge_at_max_space_in_pool")
        store.client.command(f"OPTIMIZE TABLE {table} FINAL")
    assert store.scalar(f"SELECT count() FROM {ATTEMPTS_TABLE}") == len(events)
    assert store.scalar(f"SELECT count() FROM {REQUESTS_TABLE}") == len(refusals)


def test_a_given_up_attempt_that_still_completed_bills_nothing_its_continuation_bills_once(
    store: ClickHouseStore, catalog: Catalog, attempt_factory: Callable[..., AttemptEvent]
) -> None:
    """Catches: a request billed twice when the gateway gave up an attempt (its worker cut off by
    a NATS outage) and continued the stream elsewhere while that worker still completed and
    reported it: the request pays for its highest billing attempt, as the budget settles it. By
    hand: 15 prompt tokens; 34 tokens reached the client from attempt 1, 6 more from attempt 2
    (whose engine prompt was 15 + 34); attempt 1's engine generated 40."""
    svc = AccountingService(store, catalog, AccountingMetrics(Metrics("t")))
    events = [
        attempt_factory("r5", 1, "completed", prompt=15, completion=40),
        attempt_factory("r5", 1, "worker_lost", "gateway", carried_tokens=34),
        attempt_factory("r5", 2, "completed", prompt=49, completion=6, resumed_tokens=34),
    ]
    svc.insert(Batch.of([attempt_row(e, catalog, 1_800_000_000.0) for e in events], []))
    rows = store.query(
        "SELECT attempt, is_billing, billed_input_tokens, billed_output_tokens, burnt_tokens FROM attempts "
        "ORDER BY attempt"
    ).rows
    # attempt 1: 15 input and the 6 tokens generated after the gateway gave it up are burnt
    # (its 34 delivered ones are billed by attempt 2); attempt 2: the 34 re-read as prompt.
    assert rows == [[1, 0, 0, 0, 15 + 6], [2, 1, 15, 40, 34]]
    assert store.query("SELECT billed_tokens, burnt_tokens FROM requests").rows == [[55, 55]]


def test_queries_are_read_only(store: ClickHouseStore) -> None:
    assert store.query("SELECT 1 AS one").rows == [[1]]
    with pytest.raises(Exception, match=r"(?i)readonly"):
        store.query("INSERT INTO requests_raw (request_id) VALUES ('x')")


_HOLDER = """
import os, sys, time
from llmlab_accounting.store import ClickHouseStore, StoreProcess
if sys.argv[2] == "child":
    s = StoreProcess(sys.argv[1])
    owner = s.pid
else:
    s = ClickHouseStore.open(data_dir=sys.argv[1])
    owner = os.getpid()
s.ensure_schema()
print("open", owner, flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("kind", ["in-process", "child"])
def test_second_writer_is_refused_and_the_lock_survives_no_sigkill(tmp_path: Path, kind: str) -> None:
    """The service's store runs in a child process ("child"): killing the service with SIGKILL
    must take the child, and so the lock, with it."""
    data = tmp_path / "chdb"
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(data), kind], stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None
        word, owner = holder.stdout.readline().split()
        assert word == b"open"
        with pytest.raises(StoreLocked, match=f"pid {int(owner)}"):
            ClickHouseStore.open(data_dir=data)
        with pytest.raises(StoreLocked, match=f"pid {int(owner)}"):  # the service's way: refused alike
            StoreProcess(data)
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(10)
    finally:
        if holder.poll() is None:
            holder.kill()
    deadline = time.monotonic() + 10
    while True:  # the kernel releases both flocks (ours and chdb's) when the process is gone
        try:
            s = ClickHouseStore.open(data_dir=data)
            break
        except StoreLocked:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    try:
        s.ensure_schema()
        assert s.query("SELECT count() FROM attempts").rows == [[0]]
    finally:
        s.close()


def test_arrow_batches_match_the_table_and_keep_every_value(
    store: ClickHouseStore, catalog: Catalog, attempt_factory: Callable[..., AttemptEvent]
) -> None:
    """The Arrow schema derived from the row types is the table's, and a row read back equals the
    row inserted (timestamps to the millisecond)."""
    for table, schema in (("attempts_raw", ATTEMPT_SCHEMA), ("requests_raw", REQUEST_SCHEMA)):
        cols = store.query(f"SELECT name FROM system.columns WHERE table = '{table}' ORDER BY position").rows
        assert [c for (c,) in cols] == schema.names
    row = attempt_row(
        attempt_factory("rt", 1, "completed", prompt=7, completion=3, ended_at=1_800_000_000.1234), catalog
    )
    svc = AccountingService(store, catalog, AccountingMetrics(Metrics("t")))
    svc.insert(Batch.of([row]))
    res = store.query(
        "SELECT * EXCEPT (created_at, started_at, ended_at, ingested_at),"
        " toFloat64(created_at), toFloat64(started_at), toFloat64(ended_at) FROM attempts_raw"
    )
    got = dict(zip(res.columns, res.rows[0], strict=True))
    for k, v in row.items():
        if k.endswith("_at"):
            if k != "ingested_at":
                assert v is not None and got[f"toFloat64({k})"] == pytest.approx(v, abs=1e-3), k
        else:
            assert got[k] == v, k


def test_a_dead_chdb_process_is_replaced_and_the_data_is_still_there(tmp_path: Path) -> None:
    """Catches: the service's chdb child dying (OOM-killed) for good: every later insert and
    query failed until a restart of the whole service (dd4f538 never recreated it)."""
    s = StoreProcess(tmp_path / "chdb")
    try:
        s.ensure_schema()
        s.insert_json("gpu_periods", [])  # a no-op write through the child
        first = s.pid
        os.kill(first, signal.SIGKILL)
        time.sleep(0.5)
        try:
            rows = s.query("SELECT count() FROM attempts").rows  # served by a new child
        except BrokenProcessPool:
            pytest.fail("the store is unusable after its chdb process died")
        assert rows == [[0]]
        assert s.pid != first and s.restarts == 1
    finally:
        s.close()
