"""Routing adapters: the gateway asks for a target chain (first choice + fallbacks) for each request
(the :class:`~llmlab_gateway.service.Router` port).

* :class:`RemoteRouter` asks the router service over NATS (``<ns>.router.route``); when it does not
  answer in time the gateway decides itself with its embedded router (degraded, logged and counted)
  rather than failing the request.
* :class:`EmbeddedRouter` runs the same router core in the gateway's process (one hop less; each
  gateway then keeps its own view of pending work and prefix affinity).
"""

from __future__ import annotations

import logging

from llmlab_common.messages import RouteQuery, RouteReply
from llmlab_common.subjects import Topology
from llmlab_routing.core import RouterCore
from nats.aio.client import Client as NATS
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from prometheus_client import Counter
from pydantic import ValidationError

log = logging.getLogger(__name__)


class EmbeddedRouter:
    def __init__(self, core: RouterCore) -> None:
        self.core = core

    async def route(self, query: RouteQuery) -> RouteReply:
        return self.core.route(query)[0]


class RemoteRouter:
    def __init__(self, nc: NATS, topo: Topology, timeout_s: float, fallback: EmbeddedRouter, degraded: Counter) -> None:
        self.nc, self.topo, self.timeout_s = nc, topo, timeout_s
        self.fallback = fallback
        self.degraded = degraded

    async def route(self, query: RouteQuery) -> RouteReply:
        payload = query.model_dump_json(exclude_none=True).encode()
        try:
            msg = await self.nc.request(self.topo.router_route_subject, payload, timeout=self.timeout_s)
            return RouteReply.model_validate_json(msg.data)
        except (NatsTimeout, NoRespondersError, ValidationError) as exc:
            self.degraded.labels(type(exc).__name__).inc()
            log.warning("router service unavailable (%s): deciding in the gateway", type(exc).__name__)
            return await self.fallback.route(query)
