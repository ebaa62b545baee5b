"""The consumer against real NATS JetStream and chdb: batches inserted then acked, malformed events
dead-lettered without blocking, redelivered events stored again in the raw table and counted once
through FINAL and the views."""

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
from llmlab_common.messages import AttemptEvent, Heartbeat, RequestEvent, Timings
from llmlab_common.metrics import Metrics
from llmlab_common.natsio import connect, delete_streams, ensure_streams
from llmlab_common.settings import DEFAULT_CATALOG
from llmlab_common.subjects import Topology
from llmlab_testkit.e2e import edited_json
from llmlab_testkit.procs import unique_namespace
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

pytestmark = pytest.mark.integration
NATS_URL = "nats://127.0.0.1:4222"
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
QWEN = "Qwen/Qwen3-32B"
LLAMA_IN, LLAMA_OUT = 0.10, 0.20  # configs/catalog.yaml, USD per 1M input / output tokens


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
    stop_merges: Callable[[ClickHouseStore], None],
) -> None:
    """Catches: a batch inserted twice or not at all (raw row counts are exact, merges stopped), an
    event acked before it is stored, a malformed event blocking the consumer, a republished event
    counted twice after FINAL, input and output prices swapped in the list cost."""
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
        stop_merges(store)  # raw counts below are rows inserted, not what a merge left
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
                "SELECT (SELECT count() FROM attempts_raw), (SELECT count() FROM requests_raw),"
                " (SELECT count() FROM attempts_raw FINAL), (SELECT count() FROM requests_raw FINAL),"
                " (SELECT count() FROM attempts), (SELECT sum(billed_tokens) FROM attempts),"
                " (SELECT sum(list_cost_usd) FROM attempts)"
            ).rows[0]
        finally:
            await tr.stop()
            decoder.close()
            store.close()

    # Hand calculation: event i bills 10 + i input tokens at $0.10 and 5 output tokens at $0.20 per 1M.
    billed = sum(15 + i for i in range(20))
    list_usd = sum((10 + i) * LLAMA_IN + 5 * LLAMA_OUT for i in range(20)) / 1e6
    first = await run_once(republish=False)
    # Each event published once, inserted once: raw = FINAL = 20 attempts and 1 refusal.
    assert first[:6] == [20, 1, 20, 1, 20, billed] and first[6] == pytest.approx(list_usd)
    await until(lambda: len(dead) == 1, what="dead letter")
    assert dead == [b'{"not": "an event"}']
    second = await run_once(republish=True)
    # The 20 republished attempts are stored again (raw 40: at least once), once each after FINAL.
    assert second[:6] == [40, 1, 20, 1, 20, billed] and second[6] == pytest.approx(list_usd)
    await sub.unsubscribe()


async def test_heartbeats_are_recorded_and_standby_workers_cost_their_deployment(
    nats_ns: tuple[NATS, Topology], tmp_path: Path, catalog: Catalog, attempt_factory: Callable[..., AttemptEvent]
) -> None:
    """A worker that beats but serves nothing in a period costs its deployment's requests of that
    period; one whose deployment served nothing stays unattributed. Heartbeats come over real NATS."""
    nc, topo = nats_ns
    js = nc.jetstream()
    t0 = float(int(time.time()) - 200)
    t1 = t0 + 100
    # w1 (gpu-vllm) serves one request in the period; w2 (gpu-vllm) beats for its first 40 s;
    # w3 (gpu-sglang, whose deployment serves nothing) beats all period long.
    served = attempt_factory(
        "r-served", timings=Timings(nats_queue_s=0.0, ttft_s=1.0, decode_s=9.0, e2e_s=10.0), ended_at=t0 + 20
    )
    await js.publish(topo.attempt_event_subject, served.model_dump_json().encode())

    def beat(worker: str, pool: str, model: str, at: float) -> bytes:
        return (
            Heartbeat(
                worker_id=worker,
                pool=pool,
                engine="vllm",
                models=[model],
                max_concurrency=4,
                in_flight=0,
                ready=True,
                interval_s=2.0,
                sent_at=at,
            )
            .model_dump_json()
            .encode()
        )

    store = ClickHouseStore.open(data_dir=tmp_path / "chdb")
    store.ensure_schema()
    svc = AccountingService(store, catalog, AccountingMetrics(Metrics("t")))
    settings = AccountingSettings(flush_interval_s=0.2, heartbeat_flush_s=0.2, attribution_period_s=3600)
    tr = AccountingTransport(nc, js, topo, svc, settings, Decoder(catalog, DEFAULT_CATALOG))
    await tr.start()
    try:
        for k in range(20):
            await nc.publish(topo.heartbeat_subject("gpu-vllm", "w2"), beat("w2", "gpu-vllm", LLAMA, t0 + 2 * k))
        for k in range(50):
            await nc.publish(topo.heartbeat_subject("gpu-sglang", "w3"), beat("w3", "gpu-sglang", QWEN, t0 + 2 * k))
        await nc.publish(topo.heartbeat_subject("gpu-vllm", "w2"), b"{not a heartbeat")  # dropped, counted
        await nc.flush()

        def recorded() -> bool:
            return (
                store.scalar("SELECT count() FROM worker_heartbeats") == 70
                and store.scalar("SELECT count() FROM attempts") == 1
            )

        await until(recorded, what="heartbeats and the attempt in chdb")
        periods = {wp.worker_id: wp for wp in await asyncio.to_thread(svc.attribute_period, t0, t1)}
    finally:
        await tr.stop()
    try:
        h100 = 2.99
        assert set(periods) == {"w1", "w2", "w3"}
        assert periods["w1"].period_usd == pytest.approx(h100 * 100 / 3600)
        w2, w3 = periods["w2"], periods["w3"]
        assert w2.period_s == pytest.approx(40) and w2.spread_usd == pytest.approx(h100 * 40 / 3600)
        assert w3.period_usd == pytest.approx(2 * h100 * 100 / 3600) and w3.attributed_usd == 0
        rows = store.query(
            "SELECT worker_id, attempts, period_s, period_usd, attributed_usd FROM gpu_periods FINAL ORDER BY worker_id"
        ).rows
        assert [r[:2] for r in rows] == [["w1", 1], ["w2", 0], ["w3", 0]]
        # The served request carries w1's whole period and w2's standby time.
        [[busy, idle, standby, total]] = store.query(
            "SELECT busy_usd, idle_usd, standby_usd, gpu_cost_usd FROM gpu_attribution FINAL"
        ).rows
        assert standby == pytest.approx(h100 * 40 / 3600) and busy + idle == pytest.approx(h100 * 100 / 3600)
        assert total == pytest.approx(busy + idle + standby)
        assert store.scalar("SELECT gpu_cost_usd FROM requests WHERE request_id = 'r-served'") == pytest.approx(total)
        events = svc.m.events
        assert events.labels("heartbeat")._value.get() == 70 and events.labels("heartbeat_malformed")._value.get() == 1
    finally:
        store.close()


async def test_a_poison_event_is_dead_lettered_and_ingest_goes_on(
    nats_ns: tuple[NATS, Topology],
    tmp_path: Path,
    catalog: Catalog,
    attempt_factory: Callable[..., AttemptEvent],
) -> None:
    """Catches: an event with a value no column holds (prompt_tokens past int64) killing the
    commit loop while /ready stayed green (dd4f538): every event after it waited forever."""

    nc, topo = nats_ns
    js = nc.jetstream()
    dead: list[tuple[bytes, str]] = []

    async def on_dead(msg: Msg) -> None:
        dead.append((msg.data, (msg.headers or {}).get("Llmlab-Reason", "")))

    sub = await nc.subscribe(topo.dead_letter_subject, cb=on_dead)
    poison = edited_json(attempt_factory("poison").model_dump_json(), usage__prompt_tokens=10**20)
    await js.publish(topo.attempt_event_subject, attempt_factory("before").model_dump_json().encode())
    await js.publish(topo.attempt_event_subject, poison)
    for i in range(5):
        await js.publish(topo.attempt_event_subject, attempt_factory(f"after{i}").model_dump_json().encode())
    store = ClickHouseStore.open(data_dir=tmp_path / "chdb")
    store.ensure_schema()
    svc = AccountingService(store, catalog, AccountingMetrics(Metrics("t")))
    decoder = Decoder(catalog, DEFAULT_CATALOG, 0)
    settings = AccountingSettings(flush_interval_s=0.2, ingest_unhealthy_after_s=1.0, drain_timeout_s=5)
    tr = AccountingTransport(nc, js, topo, svc, settings, decoder)
    await tr.start()
    try:
        await until(
            lambda: store.query("SELECT count() FROM attempts_raw").rows == [[6]], what="the six good events stored"
        )
        await until(lambda: len(dead) == 1, what="the poison event dead-lettered")
        assert b"poison" in dead[0][0] and "out of range" in dead[0][1]
        assert tr.ingest_healthy()
        # Ingest goes on after it.
        await js.publish(topo.attempt_event_subject, attempt_factory("later").model_dump_json().encode())
        await until(lambda: store.query("SELECT count() FROM attempts_raw").rows == [[7]], what="a later event")
        # A store that refuses everything is not poison: nothing is dead-lettered, the batch is
        # kept and retried, and /ready turns false after ingest_unhealthy_after_s.
        store.close()
        await js.publish(topo.attempt_event_subject, attempt_factory("while-down").model_dump_json().encode())
        await until(lambda: not tr.ingest_healthy(), what="/ready's ingest check to fail")
        assert len(dead) == 1
        t0 = time.monotonic()
        await tr.stop()  # SIGTERM while inserts fail: prompt, and nothing acked
        assert time.monotonic() - t0 < 12
        info = await js.consumer_info(topo.events_stream, topo.ACCOUNTING_CONSUMER)
        assert info.num_ack_pending + info.num_pending >= 1
    finally:
        await tr.stop()
        decoder.close()
        store.close()
        await sub.unsubscribe()
