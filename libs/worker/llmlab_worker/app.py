"""Worker transport: a small FastAPI app for /health, /ready, /metrics whose lifespan runs the
worker; SIGTERM drains it (stop pulling, finish in-flight attempts)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

from fastapi import FastAPI
from llmlab_common.catalog import load_catalog
from llmlab_common.metrics import Metrics
from llmlab_common.runtime import ServiceState, ops_router, run_service

from llmlab_worker.engine import EngineAdapter, OpenAIEngineAdapter
from llmlab_worker.lifecycle import Worker
from llmlab_worker.settings import WorkerSettings

S = TypeVar("S", bound=WorkerSettings)


def create_worker_app(settings: S, adapter_factory: Callable[[S], EngineAdapter]) -> FastAPI:
    metrics = Metrics("llmlab")
    state = ServiceState()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        catalog = load_catalog(settings.infra.catalog_path)
        adapter = adapter_factory(settings)
        for collector in adapter.collectors():
            metrics.registry.register(collector)
        worker = Worker(settings, adapter, catalog, metrics)
        app.state.worker = worker
        state.checks["worker"] = worker.ready
        await worker.start()
        try:
            yield
        finally:
            await worker.drain(settings.drain_timeout_s)

    app = FastAPI(title="llmlab worker", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.service_state = state
    app.include_router(ops_router(state, metrics))
    return app


def http_adapter(adapter_cls: type[OpenAIEngineAdapter]) -> Callable[[WorkerSettings], EngineAdapter]:
    """The factory of an adapter that reaches its engine server at ``engine_url``."""
    return lambda s: adapter_cls(s.engine_url, s.max_concurrency, s.engine_connect_timeout_s)


def run_worker(adapter_factory: Callable[[S], EngineAdapter], service: str, settings_cls: type[S], engine: str) -> None:
    """Entry point shared by the engine workers: ``--help`` lists the settings; otherwise read them
    from the environment and serve until SIGTERM."""

    def make_app(settings: S) -> FastAPI:
        return create_worker_app(settings, adapter_factory)

    run_service(service, settings_cls, make_app, description=f"A worker in front of a {engine} engine.")
