"""Router service process: the route responder over NATS, the live feed, catalog reloads."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from llmlab_common.jsprobe import JetStreamProbe, pending_by_pool, run_probe
from llmlab_common.messages import RouteCommit
from llmlab_common.metrics import Metrics
from llmlab_common.natsio import connect_as, ensure_streams
from llmlab_common.runtime import ServiceState, cancel_and_wait, ops_router
from llmlab_common.subjects import Topology
from llmlab_routing.config import CatalogHolder, watch_catalog
from llmlab_routing.core import RouterCore
from llmlab_routing.feed import LiveFeed
from llmlab_routing.records import DecisionLog
from llmlab_routing.state import LiveState

from llmlab_router.metrics import RouterMetrics
from llmlab_router.settings import RouterSettings
from llmlab_router.transport import RouteResponder

log = logging.getLogger(__name__)


def create_app(settings: RouterSettings) -> FastAPI:
    metrics = Metrics("llmlab")
    rm = RouterMetrics(metrics)
    state = ServiceState()
    holder = CatalogHolder(settings.infra.catalog_path)  # refuses to start on an invalid catalog

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            dlog = None
            if settings.decision_log is not None:
                dlog = DecisionLog(settings.decision_log, settings.decision_log_max_bytes)
                stack.callback(dlog.close)
            live = LiveState()
            core = RouterCore(holder, live, dlog)
            topo = Topology(settings.infra.namespace)
            nc = await connect_as(settings.infra, "router")
            stack.push_async_callback(nc.drain)
            js = nc.jetstream()
            await ensure_streams(js, topo, settings.infra.events_max_bytes)

            # Gateways in shared mode decide themselves: their decisions keep this state whole.
            def count_shared(c: RouteCommit) -> None:
                cur = holder.current
                rm.observe_shared(c, cur.routing.policies, {d.id for d in cur.catalog.deployments})

            feed = LiveFeed(nc, js, topo, live, commits_except="", on_commit=count_shared)
            await feed.start()
            stack.push_async_callback(feed.stop)
            responder = RouteResponder(nc, topo, core, rm)
            answering = asyncio.Event()

            async def answer_after_discovery() -> None:
                # A router that just started has heard no heartbeat and would answer "no live worker"
                # for every pool (a restarted one delayed requests by seconds in the chaos suite).
                # Until the workers had time to announce themselves it does not subscribe: gateways
                # get no responder and decide with their embedded router at once.
                await asyncio.sleep(settings.discovery_grace_s)
                await responder.start()
                answering.set()

            starter = asyncio.create_task(answer_after_discovery(), name="answer-after-discovery")
            stack.push_async_callback(responder.stop)
            stack.push_async_callback(cancel_and_wait, starter)
            reloader = asyncio.create_task(
                watch_catalog(holder, settings.reload_interval_s, rm.reloaded), name="catalog-reload"
            )
            stack.push_async_callback(cancel_and_wait, reloader)
            probe = JetStreamProbe(js, topo.requests_stream)

            async def probe_queues() -> None:
                pools = sorted(holder.current.catalog.deployment_pools)
                rm.set_queues(pending_by_pool(topo, await probe.consumers(), pools, alive=live.alive))

            prober = asyncio.create_task(
                run_probe(probe_queues, settings.queue_probe_s, "requests queue"), name="queue-probe"
            )
            stack.push_async_callback(cancel_and_wait, prober)
            state.checks["nats"] = lambda: nc.is_connected
            state.checks["workers_discovered"] = answering.is_set
            app.state.core = core
            log.info(
                "router up (namespace %s, catalog version %s, decisions -> %s)",
                topo.namespace,
                holder.current.version,
                settings.decision_log,
            )
            yield

    app = FastAPI(title="llm-inference-lab router", lifespan=lifespan)
    app.state.service_state = state
    app.include_router(ops_router(state, metrics))

    @app.get("/admin/catalog")
    async def catalog_status() -> dict[str, Any]:
        cur = holder.current
        return {
            "version": cur.version,
            "source": cur.source,
            "policies": sorted(cur.routing.policies),
            "default_policy": cur.routing.default_policy,
            "reloads": holder.reloads,
            "failed_reloads": holder.failed_reloads,
            "last_error": holder.last_error,
        }

    return app
