"""Budget service process: the request-control (admin) API over HTTP, the reserve responder and
the settlement consumer over NATS, all on one Redis."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from llmlab_common.catalog import load_catalog
from llmlab_common.http import install_error_handlers
from llmlab_common.metrics import Metrics
from llmlab_common.natsio import connect_as, ensure_streams
from llmlab_common.runtime import ServiceState, ops_router
from llmlab_common.subjects import Topology
from redis.asyncio import BlockingConnectionPool, Redis

from llmlab_budget.admin import AdminContext, mount_admin_api
from llmlab_budget.directory import Directory
from llmlab_budget.layout import Layout
from llmlab_budget.ledger import Ledger
from llmlab_budget.metrics import BudgetMetrics
from llmlab_budget.redis_pack import pack_in_c
from llmlab_budget.service import BudgetService
from llmlab_budget.settings import BudgetSettings
from llmlab_budget.transport import BudgetTransport

log = logging.getLogger(__name__)


def open_redis(url: str, pool_size: int, socket_timeout_s: float) -> Redis:
    # A blocking pool: past pool_size callers wait (up to 5 s) for a connection instead of failing.
    pool = BlockingConnectionPool.from_url(
        url,
        max_connections=pool_size,
        timeout=5,
        socket_timeout=socket_timeout_s,
        socket_connect_timeout=socket_timeout_s,
    )
    return Redis(connection_pool=pack_in_c(pool))


def create_app(settings: BudgetSettings) -> FastAPI:
    metrics = Metrics("llmlab")
    bm = BudgetMetrics(metrics)
    state = ServiceState()
    catalog = load_catalog(settings.infra.catalog_path)
    layout = Layout.for_namespace(settings.infra.namespace)
    redis = open_redis(settings.infra.redis_url, settings.redis_pool_size, settings.redis_socket_timeout_s)
    directory = Directory(redis, layout, catalog)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            stack.push_async_callback(redis.aclose)
            await redis.ping()
            ledger = Ledger(redis, layout, settings.settled_ttl_s)
            service = BudgetService(settings, catalog, directory, ledger, bm)
            topo = Topology(settings.infra.namespace)
            nc = await connect_as(settings.infra, "budget")
            stack.push_async_callback(nc.drain)
            js = nc.jetstream()
            await ensure_streams(js, topo, settings.infra.events_max_bytes)
            transport = BudgetTransport(nc, js, topo, service, settings)
            await transport.start()
            stack.push_async_callback(transport.stop)
            app.state.service = service
            state.checks["nats"] = lambda: nc.is_connected
            log.info("budget service up on %s:%d (namespace %s)", settings.host, settings.port, topo.namespace)
            yield

    app = FastAPI(
        title="llm-inference-lab budget service",
        description="Request-control API: tenants, teams, users, API keys, limits and usage.",
        lifespan=lifespan,
    )
    app.state.service_state = state
    install_error_handlers(app, "budget service")
    app.include_router(ops_router(state, metrics))
    mount_admin_api(app, AdminContext(directory, catalog, settings, redis, layout))
    return app
