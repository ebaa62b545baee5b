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
