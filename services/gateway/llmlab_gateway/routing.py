"""Routing seam. Until the router service lands, the gateway resolves a model name or alias
to its catalog deployments in catalog order and skips deployments with no live worker."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from llmlab_common.catalog import Catalog, Deployment


@dataclass(frozen=True)
class RouteDecision:
    deployment: Deployment
    subject_kind: str  # "pool" (any worker of the pool) or "worker" (a chosen one)
    worker_id: str | None
    reason: str


class Router(Protocol):
    def route(self, model: str) -> list[RouteDecision]: ...


class StaticRouter:
    def __init__(self, catalog: Catalog, live_workers: Callable[[str], int]) -> None:
        self.catalog = catalog
        self.live_workers = live_workers

    def route(self, model: str) -> list[RouteDecision]:
        deployments = self.catalog.require(model)
        live = [d for d in deployments if self.live_workers(d.pool) > 0]
        # Deployments with live workers first; the rest stay so a 503 can name the pool.
        ordered = live + [d for d in deployments if d not in live]
        return [
            RouteDecision(d, "pool", None, f"static: {model!r} -> {d.id} (catalog order, live first)") for d in ordered
        ]
