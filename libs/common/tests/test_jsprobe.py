"""The JetStream probe against real NATS: the requests stream's backlog per pool (pool and
worker consumers, waiting and taken-not-acked), the events stream's size and durable consumers.
Each test has its own namespace, so its own stream names, deleted at the end."""

from __future__ import annotations

import asyncio
import time

import pytest
from llmlab_common.jsprobe import JetStreamProbe, PoolQueue, pending_by_durable, pending_by_pool
from llmlab_common.natsio import connect, delete_streams, ensure_streams
from llmlab_common.subjects import Topology
from llmlab_testkit.procs import unique_namespace
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

pytestmark = pytest.mark.integration
NATS_URL = "nats://127.0.0.1:4222"


def _durable(name: str, subject: str) -> ConsumerConfig:
    return ConsumerConfig(
        durable_name=name, filter_subject=subject, ack_policy=AckPolicy.EXPLICIT, deliver_policy=DeliverPolicy.ALL
    )


async def test_probe_reads_the_backlog_of_each_pool_from_its_pool_and_worker_consumers() -> None:
    """Catches: the probe reading the wrong figures of ConsumerInfo (pending vs ack pending), a
    worker's consumer left out of its pool, or a pool without messages missing from the result."""
    topo = Topology(unique_namespace())
    nc = await connect(NATS_URL, "jsprobe-test")
    js = nc.jetstream()
    await ensure_streams(js, topo)
    try:
        await js.add_consumer(topo.requests_stream, _durable(topo.pool_consumer("a"), topo.pool_subject("a")))
        await js.add_consumer(
            topo.requests_stream, _durable(topo.worker_consumer("w1"), topo.worker_subject("a", "w1"))
        )
        await js.add_consumer(topo.requests_stream, _durable(topo.pool_consumer("b"), topo.pool_subject("b")))
        for _ in range(3):
            await js.publish(topo.pool_subject("a"), b"{}")
        await js.publish(topo.worker_subject("a", "w1"), b"{}")
        await js.publish(topo.pool_subject("b"), b"{}")
        sub = await js.pull_subscribe_bind(topo.pool_consumer("a"), topo.requests_stream)
        taken = await sub.fetch(1, timeout=5)  # taken, not acked
        assert len(taken) == 1
        probe = JetStreamProbe(js, topo.requests_stream)
        deadline = time.monotonic() + 5
        while True:
            by_pool = pending_by_pool(topo, await probe.consumers(), ["a", "b", "c"])
            if by_pool["a"] == PoolQueue(3, 1) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        assert by_pool == {"a": PoolQueue(3, 1), "b": PoolQueue(1, 0), "c": PoolQueue(0, 0)}
        await sub.unsubscribe()
    finally:
        await delete_streams(js, topo)
        await nc.close()


async def test_probe_reads_the_events_stream_size_and_its_durable_consumers_only() -> None:
    """Catches: stream bytes/messages/limit read from the wrong fields, or an ephemeral consumer
    (a generated name) reported as a durable one."""
    topo = Topology(unique_namespace())
    nc = await connect(NATS_URL, "jsprobe-test")
    js = nc.jetstream()
    await ensure_streams(js, topo)
    try:
        for i in range(4):
            await js.publish(topo.attempt_event_subject, f'{{"n": {i}}}'.encode())
        # The two durables come with the stream (ensure_streams).
        ephemeral = await js.pull_subscribe(topo.events_wildcard, stream=topo.events_stream)
        probe = JetStreamProbe(js, topo.events_stream)
        stream = await probe.stream_load()
        assert stream.messages == 4 and stream.bytes > 0 and stream.max_bytes == 1024**3
        loads = await probe.consumers()
        assert len(loads) == 3  # the two durable ones and the ephemeral one
        assert pending_by_durable(loads) == {topo.ACCOUNTING_CONSUMER: 4, topo.BUDGET_SETTLE_CONSUMER: 4}
        await ephemeral.unsubscribe()
    finally:
        await delete_streams(js, topo)
        await nc.close()
