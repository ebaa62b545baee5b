"""Accounting service process: the events consumer (NATS) → ClickHouse (chdb or a server), the
GPU-time attribution loop, and a read-only admin query endpoint."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from llmlab_common.catalog import load_catalog
from llmlab_common.http import install_error_handlers
from llmlab_common.jsprobe import JetStreamProbe, run_probe
from llmlab_common.metrics import Metrics
from llmlab_common.natsio import connect_as, ensure_streams
from llmlab_common.runtime import ServiceState, cancel_and_wait, ops_router
from llmlab_common.subjects import Topology

from llmlab_accounting.admin_api import mount_admin_api
from llmlab_accounting.decode import Decoder, tune_gc
from llmlab_accounting.metrics import AccountingMetrics
from llmlab_accounting.ports import Store
from llmlab_accounting.service import AccountingService
from llmlab_accounting.settings import AccountingSettings
from llmlab_accounting.store import ClickHouseStore, StoreProcess
from llmlab_accounting.transport import AccountingTransport

log = logging.getLogger(__name__)


def create_app(settings: AccountingSettings) -> FastAPI:
    metrics = Metrics("llmlab")
    am = AccountingMetrics(metrics)
    state = ServiceState()
    catalog = load_catalog(settings.infra.catalog_path)
    # Opened here, not in the lifespan: a second process on the same chdb directory fails at
    # once (StoreLocked) instead of after binding its port. chdb runs in a child process (it
    # holds the GIL while it works); a server's client is cheap in-process.
    store: Store = ClickHouseStore.open(settings.store_dsn) if settings.store_dsn else StoreProcess(settings.data_dir)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            stack.callback(store.close)
            store.ensure_schema()
            service = AccountingService(store, catalog, am, settings.prefill_weight)
            topo = Topology(settings.infra.namespace)
            nc = await connect_as(settings.infra, "accounting")
            stack.push_async_callback(nc.drain)
            js = nc.jetstream()
            await ensure_streams(js, topo, settings.infra.events_max_bytes)
            decoder = Decoder(catalog, settings.infra.catalog_path, settings.decode_processes)
            stack.callback(decoder.close)
            transport = AccountingTransport(nc, js, topo, service, settings, decoder)
            await transport.start()
            stack.push_async_callback(transport.stop)
            probe = JetStreamProbe(js, topo.events_stream)

            async def probe_events() -> None:
                am.set_stream(await probe.stream_load(), await probe.consumers())

            prober = asyncio.create_task(
                run_probe(probe_events, settings.stream_probe_s, "events stream"), name="events-probe"
            )
            stack.push_async_callback(cancel_and_wait, prober)
            app.state.service = service
            app.state.transport = transport
            state.checks["nats"] = lambda: nc.is_connected
            state.checks["ingest"] = transport.ingest_healthy
            where = "a ClickHouse server" if settings.store_dsn else f"chdb at {settings.data_dir}"
            tune_gc()
            log.info("accounting up on %s:%d (namespace %s, %s)", settings.host, settings.port, topo.namespace, where)
            yield

    app = FastAPI(
        title="llm-inference-lab accounting service",
        description="Cost events in ClickHouse; read-only SQL for reports.",
        lifespan=lifespan,
    )
    app.state.service_state = state
    install_error_handlers(app, "accounting service")
    app.include_router(ops_router(state, metrics))

    def attribute(t0: float, t1: float) -> tuple[float, float]:
        # Requests are served only after the lifespan has set the service up.
        periods = app.state.service.attribute_period(t0, t1)
        return sum(p.period_usd for p in periods), sum(p.attributed_usd for p in periods)

    mount_admin_api(app, store, settings, attribute)
    return app
