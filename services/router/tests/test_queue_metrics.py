"""The router's queue gauges (llmlab_router_queue_pending_messages / _ack_pending_messages): one
series per catalog pool, read from JetStream by the service's probe."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from llmlab_common.jsprobe import PoolQueue
from llmlab_common.metrics import Metrics
from llmlab_common.natsio import connect, delete_streams
from llmlab_common.settings import InfraSettings
from llmlab_common.subjects import Topology
from llmlab_router.app import create_app
from llmlab_router.metrics import RouterMetrics
from llmlab_router.settings import RouterSettings
from llmlab_testkit.procs import unique_namespace
from nats.js.api import AckPolicy, ConsumerConfig

NATS_URL = "nats://127.0.0.1:4222"


def _lines(text: str, prefix: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(prefix + "{"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


@pytest.mark.unit
def test_queue_gauges_follow_the_pools_of_the_last_probe() -> None:
    """Catches: a pool removed from the catalog keeping its last figure forever."""
    m = Metrics("llmlab")
    rm = RouterMetrics(m)
    rm.set_queues({"a": PoolQueue(3, 1), "b": PoolQueue(0, 0)})
    rm.set_queues({"a": PoolQueue(2, 0)})
    text = m.render()[0].decode()
    assert _lines(text, "llmlab_router_queue_pending_messages") == {'llmlab_router_queue_pending_messages{pool="a"}': 2}
    assert _lines(text, "llmlab_router_queue_ack_pending_messages") == {
        'llmlab_router_queue_ack_pending_messages{pool="a"}': 0
    }


@pytest.mark.integration
async def test_the_router_service_exports_each_catalog_pools_backlog() -> None:
    """Catches: the probe not started by the service, reading another stream, or leaving out the
    catalog's pools that have no consumer (no zero series for the alert rules)."""
    ns = unique_namespace()
    topo = Topology(ns)
    infra = InfraSettings(namespace=ns, nats_url=NATS_URL)
    settings = RouterSettings(infra=infra, decision_log=None, queue_probe_s=0.05)
    app = create_app(settings)
    nc = await connect(NATS_URL, "router-queue-test")
    js = nc.jetstream()
    try:
        async with app.router.lifespan_context(app):  # creates the streams
            await js.add_consumer(
                topo.requests_stream,
                ConsumerConfig(
                    durable_name=topo.pool_consumer("gpu-vllm"),
                    filter_subject=topo.pool_subject("gpu-vllm"),
                    ack_policy=AckPolicy.EXPLICIT,
                ),
            )
            for _ in range(2):
                await js.publish(topo.pool_subject("gpu-vllm"), b"{}")
            want = 'llmlab_router_queue_pending_messages{pool="gpu-vllm"}'
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
                deadline = time.monotonic() + 10
                while True:
                    text = (await c.get("/metrics")).text
                    pending = _lines(text, "llmlab_router_queue_pending_messages")
                    if pending.get(want) == 2 or time.monotonic() > deadline:
                        break
                    await asyncio.sleep(0.05)
        assert pending == {
            want: 2,
            'llmlab_router_queue_pending_messages{pool="gpu-sglang"}': 0,
            'llmlab_router_queue_pending_messages{pool="cpu-vllm"}': 0,
        }
    finally:
        await delete_streams(js, topo)
        await nc.close()
