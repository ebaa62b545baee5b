"""A router that just started answers no route before the workers could announce themselves."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any, cast

import httpx
import pytest
from llmlab_common.natsio import connect, delete_streams
from llmlab_common.settings import InfraSettings
from llmlab_common.subjects import Topology
from llmlab_router.app import create_app
from llmlab_router.settings import RouterSettings
from llmlab_router.transport import RouteResponder
from llmlab_testkit.procs import unique_namespace
from nats.errors import NoRespondersError

NATS_URL = "nats://127.0.0.1:4222"


@pytest.mark.integration
@pytest.mark.timeout(30)  # a router that answers too early once left the lifespan's exit hanging
async def test_a_starting_router_leaves_routing_to_the_gateways_until_its_discovery_grace_ends() -> None:
    """Catches: a router (restarted, or a new replica) answering "no live worker in pool ..." for
    every request before any heartbeat reached it: gateways trust the answer and make their clients
    wait for a worker (seconds, in the chaos suite's router restart). Until the grace ends it has no
    responder, so a gateway falls back to its embedded router at once; then it answers and is ready."""
    ns = unique_namespace()
    topo = Topology(ns)
    settings = RouterSettings(infra=InfraSettings(namespace=ns, nats_url=NATS_URL), decision_log=None)
    settings.discovery_grace_s = 1.0
    app = create_app(settings)
    nc = await connect(NATS_URL, "router-discovery-test")
    try:
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c,
        ):
            started = time.monotonic()
            with pytest.raises(NoRespondersError):
                await nc.request(topo.router_route_subject, b"{}", timeout=0.5)
            assert (await c.get("/ready")).status_code == 503
            while (await c.get("/ready")).status_code != 200:
                assert time.monotonic() - started < 5, "not ready 5 s after a 1 s grace"
                await asyncio.sleep(0.05)
            assert time.monotonic() - started >= settings.discovery_grace_s
            reply = await nc.request(topo.router_route_subject, b"{}", timeout=2)  # answered (an error reply)
            assert reply.data
    finally:
        await delete_streams(nc.jetstream(), topo)
        await nc.close()


@pytest.mark.unit
async def test_the_responder_starts_only_once_the_server_has_its_subscriptions() -> None:
    """Catches: readiness before the SUBs reach the server (nats-py's subscribe() only queues them):
    a request sent right after the router reported ready got "no responders" (CI of bf28e28)."""
    calls: list[str] = []

    class RecordingNats:
        async def subscribe(self, subject: str, queue: str = "", cb: Any = None) -> object:
            calls.append(f"sub {subject}")
            return SimpleNamespace()

        async def flush(self, timeout: float = 0) -> None:
            calls.append("flush")

    topo = Topology("t")
    await RouteResponder(cast(Any, RecordingNats()), topo, cast(Any, None), cast(Any, None)).start()
    assert calls == [f"sub {topo.router_route_subject}", f"sub {topo.router_route_batch_subject}", "flush"]
