"""Routing adapters: the gateway asks for a target chain (first choice + fallbacks) for each request
(the :class:`~llmlab_gateway.service.Router` port).

* :class:`RemoteRouter` asks the router service over NATS (``<ns>.router.route``; requests arriving
  together as one ``<ns>.router.route_batch`` message); when it does not answer in time the gateway
  decides itself with its embedded router (degraded, logged and counted) rather than failing the
  request.
* :class:`EmbeddedRouter` runs the same router core in the gateway's process (one hop less; each
  gateway then keeps its own view of pending work and prefix affinity).
* :class:`SharedRouter` decides in the gateway too, and publishes each choice
  (``<ns>.router.commit.<gateway>``, no answer awaited) so every gateway's and the router service's
  view of pending work and prefix affinity holds the decisions of all of them
  (:class:`~llmlab_routing.feed.LiveFeed` applies the others').
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from llmlab_common.coalesce import Coalescer
from llmlab_common.messages import RouteBatch, RouteBatchReply, RouteCommit, RouteQuery, RouteReply
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


class SharedRouter:
    def __init__(self, core: RouterCore, nc: NATS, subject: str) -> None:
        self.core, self.nc, self.subject = core, nc, subject

    async def route(self, query: RouteQuery) -> RouteReply:
        reply = self.core.route(query)[0]
        if reply.targets:  # the first target is the one committed (what the core counted as pending)
            t = reply.targets[0]
            commit = RouteCommit(
                deployment=t.deployment, worker_id=t.worker_id, prefix_hashes=query.prefix_hashes, policy=reply.policy
            )
            try:
                await self.nc.publish(self.subject, commit.model_dump_json(exclude_defaults=True).encode())
            except Exception as exc:  # NATS closed or its buffer full: the decision stands, the others miss it
                log.warning("route commit not published (%s): other gateways will not count it", type(exc).__name__)
        return reply


class RemoteRouter:
    def __init__(
        self,
        nc: NATS,
        topo: Topology,
        timeout_s: float,
        fallback: EmbeddedRouter,
        degraded: Counter,
        batch_max: int = 1,
    ) -> None:
        self.nc, self.topo, self.timeout_s = nc, topo, timeout_s
        self.fallback = fallback
        self.degraded = degraded
        self._batcher: Coalescer[RouteQuery, RouteReply] = Coalescer(self._send, max_batch=batch_max)

    async def route(self, query: RouteQuery) -> RouteReply:
        try:
            return await self._batcher.submit(query)
        except (NatsTimeout, NoRespondersError, ValidationError, BatchIncomplete) as exc:
            self.degraded.labels(type(exc).__name__).inc()
            log.warning("router service unavailable (%s): deciding in the gateway", type(exc).__name__)
            return await self.fallback.route(query)

    async def _send(self, queries: list[RouteQuery]) -> Sequence[RouteReply]:
        if len(queries) == 1:
            payload = queries[0].model_dump_json(exclude_none=True).encode()
            msg = await self.nc.request(self.topo.router_route_subject, payload, timeout=self.timeout_s)
            return [RouteReply.model_validate_json(msg.data)]
        payload = RouteBatch(queries=queries).model_dump_json(exclude_defaults=True).encode()
        msg = await self.nc.request(self.topo.router_route_batch_subject, payload, timeout=self.timeout_s)
        batch = RouteBatchReply.model_validate_json(msg.data)
        if batch.error is not None or len(batch.replies) != len(queries):
            raise BatchIncomplete(batch.error.message if batch.error else "short batch")
        return batch.replies


class BatchIncomplete(Exception):
    """The router service answered a batch with an error or fewer replies than queries."""
