"""NATS side of the router service: the route responder (queue group shared by router replicas),
for one query per message and for a gateway's batch of queries (answered in order)."""

from __future__ import annotations

import logging

from llmlab_common.codes import Code
from llmlab_common.errors import InvalidRequest
from llmlab_common.messages import RouteBatch, RouteBatchReply, RouteQuery, RouteReply
from llmlab_common.subjects import Topology
from llmlab_routing.core import RouterCore
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from pydantic import ValidationError

from llmlab_router.metrics import RouterMetrics

log = logging.getLogger(__name__)


class RouteResponder:
    def __init__(self, nc: NATS, topo: Topology, core: RouterCore, metrics: RouterMetrics) -> None:
        self.nc, self.topo, self.core, self.m = nc, topo, core, metrics
        self._subs: list[Subscription] = []

    async def start(self) -> None:
        group = self.topo.ROUTER_QUEUE_GROUP
        self._subs = [
            await self.nc.subscribe(self.topo.router_route_subject, queue=group, cb=self._on_route),
            await self.nc.subscribe(self.topo.router_route_batch_subject, queue=group, cb=self._on_route_batch),
        ]
        # subscribe() only queues the SUBs: a PING/PONG round trip makes sure the server has them
        # before the router reports ready (a request sent right after got "no responders" in CI).
        await self.nc.flush(timeout=5)

    async def stop(self) -> None:
        subs, self._subs = self._subs, []
        for sub in subs:
            await sub.unsubscribe()

    async def _on_route(self, msg: Msg) -> None:
        try:
            q = RouteQuery.model_validate_json(msg.data)
        except ValidationError as exc:
            err = InvalidRequest(f"malformed route query: {exc.error_count()} error(s)", code=Code.INVALID_ROUTE_QUERY)
            await msg.respond(RouteReply(request_id="", error=err.to_info()).model_dump_json().encode())
            return
        await msg.respond(self._decide(q).model_dump_json(exclude_none=True).encode())

    async def _on_route_batch(self, msg: Msg) -> None:
        try:
            batch = RouteBatch.model_validate_json(msg.data)
        except ValidationError as exc:
            err = InvalidRequest(f"malformed route batch: {exc.error_count()} error(s)", code=Code.INVALID_ROUTE_QUERY)
            await msg.respond(RouteBatchReply(error=err.to_info()).model_dump_json().encode())
            return
        # Decided one after another, so each sees the pending work the previous ones added.
        replies = [self._decide(q) for q in batch.queries]
        await msg.respond(RouteBatchReply(replies=replies).model_dump_json(exclude_none=True).encode())

    def _decide(self, q: RouteQuery) -> RouteReply:
        with self.m.decision_seconds.time():
            reply, inp, _ = self.core.route(q)
        self.m.observe(reply, inp.policy if inp else "none")
        return reply
