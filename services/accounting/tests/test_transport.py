"""The consumer against real NATS JetStream and chdb: batches inserted then acked, malformed events
dead-lettered without blocking, redelivered events counted once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from llmlab_accounting.decode import Decoder
from llmlab_accounting.metrics import AccountingMetrics
from llmlab_accounting.service import AccountingService
from llmlab_accounting.settings import AccountingSettings
from llmlab_accounting.store import ClickHouseStore
from llmlab_accounting.transport import AccountingTransport
from llmlab_common.catalog import Catalog
from llmlab_common.messages import AttemptEvent, RequestEvent
from llmlab_common.metrics import Metrics
from llmlab_common.natsio import connect, delete_streams, ensure_streams
from llmlab_common.settings import DEFAULT_CATALOG
from llmlab_common.subjects import Topology
from llmlab_testkit.procs import unique_namespace
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

pytestmark = pytest.mark.integration
NATS_URL = "nats://127.0.0.1:4222"


@pytest.fixture
async def nats_ns() -> AsyncIterator[tuple[NATS, Topology]]:
    topo = Topology(unique_namespace())
    nc = await connect(NATS_URL, "accounting-test")
    await ensure_streams(nc.jetstream(), topo)
    try:
        yield nc, topo
    finally:
        await delete_streams(nc.jetstream(), topo)
        await nc.close()


async def until(check: Callable[[], bool], timeout: float = 15, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("decode_processes", [0, 2])
async def test_consumer_inserts_acks_dead_letters_and_dedups_redeliveries(
    decode_processes: int,
    nats_ns: tuple[NATS, Topology],
    tmp_path: Path,
    catalog: Catalog,
    attempt_factory: Callable[..., AttemptEvent],
    refusal_factory: Callable[..., RequestEvent],
) -> None:
    nc, topo = nats_ns
    js = nc.jetstream()
    settings = AccountingSettings(batch_rows=7, flush_interval_s=0.2, attribution_period_s=3600)
    dead: list[bytes] = []

    async def on_dead(msg: Msg) -> None:
        dead.append(msg.data)

    sub = await nc.subscribe(topo.dead_letter_subject, cb=on_dead)

    events = [attempt_factory(f"r{i}", 1, "completed", prompt=10 + i, completion=5) for i in range(20)]
    for ev in events[:10]:
        await js.publish(topo.attempt_event_subject, ev.model_dump_json().encode())
    await js.publish(topo.attempt_event_subject, b'{"not": "an event"}')  # malformed: must not block
    await js.publish(topo.request_event_subject, refusal_factory("refused-1").model_dump_json().encode())
    for ev in events[10:]:
        await js.publish(topo.attempt_event_subject, ev.model_dump_json().encode())

    async def run_once(republish: bool) -> list[list[object]]:
        store = ClickHouseStore.open(data_dir=tmp_path / "chdb")
        store.ensure_schema()
        svc = AccountingService(store, catalog, AccountingMetrics(Metrics("t")))
        decoder = Decoder(catalog, DEFAULT_CATALOG, decode_processes, min_parallel=2)
        tr = AccountingTransport(nc, js, topo, svc, settings, decoder)
        await tr.start()
        try:
            if republish:  # redeliver on purpose: the same events again, as new stream messages
                for ev in events:
                    await js.publish(topo.attempt_event_subject, ev.model_dump_json().encode())

            # Every message delivered and acked (acks come only after the insert).
            deadline = time.monotonic() + 20
            while True:
                info = await js.consumer_info(topo.events_stream, topo.ACCOUNTING_CONSUMER)
                if info.num_pending == 0 and info.num_ack_pending == 0 and tr.last_flush_at > 0:
                    break
                assert time.monotonic() < deadline, info
                await asyncio.sleep(0.1)
            return store.query(
                "SELECT count(), uniqExact(request_id, attempt), sum(billed_tokens), sum(list_cost_usd) FROM attempts"
            ).rows
        finally:
            await tr.stop()
            decoder.close()
            store.close()

    first = await run_once(republish=False)
    assert first[0][:3] == [20, 20, sum(15 + i for i in range(20))]
    await until(lambda: len(dead) == 1, what="dead letter")
    assert dead == [b'{"not": "an event"}']
    second = await run_once(republish=True)
    assert second == first  # totals unchanged
    await sub.unsubscribe()
