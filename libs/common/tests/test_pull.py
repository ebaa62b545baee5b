"""The batch puller against real NATS JetStream: every message once and in order, pulls that end
on expiry, ack-all."""

from __future__ import annotations

import asyncio
import time

import pytest
from llmlab_common.natsio import connect, delete_streams, ensure_streams
from llmlab_common.pull import BatchPuller
from llmlab_common.subjects import Topology
from llmlab_testkit.procs import unique_namespace
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

pytestmark = pytest.mark.integration
NATS_URL = "nats://127.0.0.1:4222"


async def test_puller_delivers_every_event_once_and_ack_all_clears_them() -> None:
    topo = Topology(unique_namespace())
    nc = await connect(NATS_URL, "pull-test")
    js = nc.jetstream()
    await ensure_streams(js, topo)
    try:
        # A header-carrying event too: stored headers come back with the message, not as a status.
        for i in range(25):
            headers = {"Nats-Msg-Id": f"m{i}"} if i == 3 else None
            await js.publish(topo.attempt_event_subject, f'{{"n": {i}}}'.encode(), headers=headers)
        await js.publish(topo.request_event_subject, b'{"n": "refused"}')
        await js.add_consumer(
            topo.events_stream,
            ConsumerConfig(
                durable_name="fetch-test",
                ack_policy=AckPolicy.ALL,
                deliver_policy=DeliverPolicy.ALL,
                filter_subject=topo.events_wildcard,
            ),
        )
        puller = BatchPuller(nc, topo.events_stream, "fetch-test")
        await puller.start()
        first = await puller.pull(10, 2.0)
        rest = await puller.pull(100, 0.5)  # fewer than asked: returns when the pull expires
        t0 = time.monotonic()
        empty = await puller.pull(100, 0.3)
        assert empty == [] and time.monotonic() - t0 < 2.0
        got = first + rest
        assert len(first) == 10
        assert [m.data for m in got] == [f'{{"n": {i}}}'.encode() for i in range(25)] + [b'{"n": "refused"}']
        assert {m.subject for m in got} == {topo.attempt_event_subject, topo.request_event_subject}
        await got[-1].ack()  # ack-all: the last one acks every earlier one
        deadline = time.monotonic() + 5  # the consumer applies acks asynchronously
        while (info := await js.consumer_info(topo.events_stream, "fetch-test")).num_ack_pending:
            assert time.monotonic() < deadline, info
            await asyncio.sleep(0.05)
        assert info.num_pending == 0
        await puller.close()
    finally:
        await delete_streams(js, topo)
        await nc.close()
