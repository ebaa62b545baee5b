"""The NATS connection against a real server: a subscription that falls behind drops messages
(nats-py's slow consumer), and each drop is counted, not lost silently."""

from __future__ import annotations

import asyncio

import pytest
from llmlab_common.metrics import Metrics
from llmlab_common.natsio import connect
from llmlab_testkit.e2e import samples
from llmlab_testkit.procs import unique_namespace
from nats.aio.msg import Msg

pytestmark = pytest.mark.integration
NATS_URL = "nats://127.0.0.1:4222"


async def test_a_slow_consumer_drop_is_counted() -> None:
    """Catches: messages a full subscription drops with no trace (nats-py only calls the error
    callback): every published message is either received or counted as a drop."""
    m = Metrics("llmlab")
    nc = await connect(NATS_URL, "slow-consumer-test", metrics=m)
    pub = await connect(NATS_URL, "slow-consumer-pub")
    subject = f"{unique_namespace()}.slow"
    release, received = asyncio.Event(), []

    async def stuck(msg: Msg) -> None:
        await release.wait()
        received.append(msg.data)

    try:
        await nc.subscribe(subject, cb=stuck, pending_msgs_limit=2)
        await nc.flush()
        for i in range(10):
            await pub.publish(subject, str(i).encode())
        await pub.flush()
        await asyncio.sleep(0.5)  # all ten reached the subscriber: held, queued or dropped
        release.set()
        await asyncio.sleep(0.3)
        drops = samples(m, "llmlab_nats_slow_consumer_drops").get("llmlab_nats_slow_consumer_drops_total", 0)
        assert drops >= 7, (drops, received)  # at most one in the callback and two queued
        assert len(received) + drops == 10, (drops, received)
    finally:
        await nc.close()
        await pub.close()


async def test_billing_events_wait_for_both_consumers_and_a_full_stream_refuses_new_ones() -> None:
    """Catches: the events stream dropping unread billing events (dd4f538: limits retention,
    discard old, so a lagging budget or accounting consumer silently lost the oldest), events
    published before the consumers existed being lost, and dead letters taking billing space."""
    from llmlab_common.natsio import delete_streams, ensure_streams
    from llmlab_common.subjects import Topology
    from nats.js.errors import APIError

    topo = Topology(unique_namespace())
    nc = await connect(NATS_URL, "events-stream-test")
    js = nc.jetstream()
    try:
        await ensure_streams(js, topo, events_max_bytes=1024**2)  # 1 MiB: the smallest allowed
        # Both durables exist before any service started: an event published now waits for them.
        consumers = {c.name for c in await js.consumers_info(topo.events_stream)}
        assert consumers == {topo.BUDGET_SETTLE_CONSUMER, topo.ACCOUNTING_CONSUMER}, consumers
        first = await js.publish(topo.attempt_event_subject, b'{"first": true}')
        await js.publish(topo.dead_letter_subject, b"x" * 100_000)  # its own stream
        assert (await js.stream_info(topo.events_stream)).state.messages == 1
        assert (await js.stream_info(topo.dead_letter_stream)).state.messages == 1
        # Fill it: past 1 MiB the publisher is refused, and the first event is still there.
        refused = 0
        for i in range(40):
            try:
                await js.publish(topo.attempt_event_subject, b"e" * 50_000 + str(i).encode())
            except APIError:
                refused += 1
        assert refused > 0, "a full events stream accepted every event (it must refuse new ones)"
        assert (await js.get_msg(topo.events_stream, first.seq)).data == b'{"first": true}'
        held = (await js.stream_info(topo.events_stream)).state.messages

        async def ack_first(durable: str) -> None:
            sub = await js.pull_subscribe_bind(durable=durable, stream=topo.events_stream)
            (msg,) = await sub.fetch(1, timeout=5)
            assert msg.data == b'{"first": true}'
            await msg.ack_sync()

        # Acked by one of the two consumers: kept; by both: gone.
        await ack_first(topo.BUDGET_SETTLE_CONSUMER)
        assert (await js.stream_info(topo.events_stream)).state.messages == held
        await ack_first(topo.ACCOUNTING_CONSUMER)
        assert (await js.stream_info(topo.events_stream)).state.messages == held - 1
    finally:
        await delete_streams(js, topo)
        await nc.close()


async def test_a_consumer_made_by_an_older_version_is_kept_not_fatal() -> None:
    """Catches: a service that will not start because its durable consumer was made by an older
    version with a deliver policy JetStream cannot change (budget-settle used DeliverPolicy.NEW)."""
    from llmlab_common.natsio import delete_streams, ensure_consumer, ensure_streams, event_consumer_config
    from llmlab_common.subjects import Topology
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    topo = Topology(unique_namespace())
    nc = await connect(NATS_URL, "consumer-upgrade-test")
    js = nc.jetstream()
    try:
        await ensure_streams(js, topo)
        await js.delete_consumer(topo.events_stream, topo.BUDGET_SETTLE_CONSUMER)
        old = ConsumerConfig(
            durable_name=topo.BUDGET_SETTLE_CONSUMER,
            filter_subject=topo.events_wildcard,
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.NEW,
        )
        await js.add_consumer(topo.events_stream, old)
        cfg = event_consumer_config(topo, topo.BUDGET_SETTLE_CONSUMER, ack_wait=30.0)
        await ensure_consumer(js, topo.events_stream, cfg)  # no exception: kept as it is
        info = await js.consumer_info(topo.events_stream, topo.BUDGET_SETTLE_CONSUMER)
        assert info.config.deliver_policy == DeliverPolicy.NEW
    finally:
        await delete_streams(js, topo)
        await nc.close()
