"""The gateway process: the FastAPI app and the lifespan that opens (and, in reverse order,
closes) what the routes need. A start-up that fails half way closes what it had opened."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from llmlab_common.authguard import AuthFailures
from llmlab_common.http import install_error_handlers, unexpected_error
from llmlab_common.metrics import Metrics
from llmlab_common.natsio import connect_as, ensure_streams
from llmlab_common.runtime import ServiceState, cancel_and_wait, ops_router
from llmlab_common.subjects import Topology
from llmlab_routing.config import CatalogHolder, watch_catalog
from llmlab_routing.core import RouterCore
from llmlab_routing.feed import LiveFeed
from llmlab_routing.records import DecisionLog
from llmlab_routing.state import LiveState
from nats.aio.client import Client as NATS

from llmlab_gateway.auth import Admitter, StaticKeyAuthenticator
from llmlab_gateway.budget_client import BudgetAdmitter
from llmlab_gateway.deps import Gateway
from llmlab_gateway.dispatch import NatsDispatcher
from llmlab_gateway.metrics import GatewayMetrics
from llmlab_gateway.routes import fast_routes
from llmlab_gateway.routes import router as openai_routes
from llmlab_gateway.routing import EmbeddedRouter, RemoteRouter, SharedRouter
from llmlab_gateway.service import CompletionService, Router
from llmlab_gateway.settings import GatewaySettings
from llmlab_gateway.sse import RawSendApp

log = logging.getLogger(__name__)


def create_app(settings: GatewaySettings) -> RawSendApp:
    metrics = Metrics("llmlab")
    gm = GatewayMetrics(metrics)
    state = ServiceState()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            holder = CatalogHolder(settings.infra.catalog_path)
            gm.zero(holder.current.catalog)
            topo = Topology(settings.infra.namespace)
            nc = await connect_as(settings.infra, f"gateway-{settings.gateway_id}", metrics=metrics)
            stack.push_async_callback(_drain, nc)
            js = nc.jetstream()
            await ensure_streams(js, topo, settings.infra.events_max_bytes)
            # One worker registry: heartbeats decide both liveness (here) and routing (the core).
            live = LiveState()
            dispatcher = NatsDispatcher(
                nc,
                js,
                topo,
                settings.gateway_id,
                live,
                metrics,
                settings.worker_discovery_grace_s,
                settings.worker_sweep_interval_s,
                lambda: holder.current.catalog.deployment_pools,
            )
            await dispatcher.start()
            stack.push_async_callback(dispatcher.stop)
            own_commits = topo.router_commit_subject(settings.gateway_id)
            shared = settings.router == "shared"
            # The dispatcher feeds heartbeats; in shared mode the other gateways' decisions come too.
            feed = LiveFeed(nc, js, topo, live, heartbeats=False, commits_except=own_commits if shared else None)
            await feed.start()
            stack.push_async_callback(feed.stop)
            dlog_path = settings.decision_log_path()
            dlog = DecisionLog(dlog_path) if dlog_path is not None else None
            if dlog is not None:
                stack.callback(dlog.close)
            core = RouterCore(holder, live, dlog)
            embedded = EmbeddedRouter(core)
            router: Router
            if settings.router == "embedded":
                router = embedded
            elif shared:
                router = SharedRouter(core, nc, own_commits)
            else:
                router = RemoteRouter(
                    nc, topo, settings.router_timeout_s, embedded, gm.router_degraded, settings.admission_batch_max
                )
            reloader = asyncio.create_task(
                watch_catalog(holder, settings.catalog_reload_interval_s), name="catalog-reload"
            )
            stack.push_async_callback(cancel_and_wait, reloader)
            admitter: Admitter = (
                StaticKeyAuthenticator(settings.api_key_sha256, settings.dev_plan, settings.auth_enabled)
                if settings.auth == "static"
                else BudgetAdmitter(nc, topo, settings.budget_timeout_s, settings.admission_batch_max)
            )
            app.state.gateway = Gateway(
                settings,
                holder,
                admitter,
                CompletionService(settings, holder, router, dispatcher),
                gm,
                auth_failures=AuthFailures(settings.auth_max_failures, settings.auth_failure_window_s),
            )
            state.checks["nats"] = lambda: nc.is_connected
            state.checks["workers_discovered"] = dispatcher.discovery_done
            log.info(
                "gateway %s up on %s:%d (namespace %s)",
                settings.gateway_id,
                settings.host,
                settings.port,
                settings.infra.namespace,
            )
            yield

    app = RawSendApp(title="llm-inference-lab gateway", lifespan=lifespan)
    app.state.service_state = state
    install_error_handlers(app, "gateway", request_ids=True)
    app.include_router(ops_router(state, metrics))
    app.include_router(openai_routes)
    app.fast_routes = fast_routes()
    app.unexpected = functools.partial(unexpected_error, "gateway", request_ids=True)
    return app


async def _drain(nc: NATS) -> None:
    with contextlib.suppress(Exception):
        await nc.drain()
