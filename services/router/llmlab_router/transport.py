"""NATS side of the router service: the route responder (queue group shared by router replicas)."""

from __future__ import annotations

import logging

from llmlab_common.codes import Code
from llmlab_common.errors import InvalidRequest
from llmlab_common.messages import RouteQuery, RouteReply
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
        self._sub: Subscription | None = None

    async def start(self) -> None:
        self._sub = await self.nc.subscribe(
            self.topo.router_route_subject, queue=self.topo.ROUTER_QUEUE_GROUP, cb=self._on_route
        )

    async def stop(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None

    async def _on_route(self, msg: Msg) -> None:
        try:
            q = RouteQuery.model_validate_json(msg.data)
        except ValidationError as exc:
            err = InvalidRequest(f"malformed route query: {exc.error_count()} error(s)", code=Code.INVALID_ROUTE_QUERY)
            await msg.respond(RouteReply(request_id="", error=err.to_info()).model_dump_json().encode())
            return
        with self.m.decision_seconds.time():
            reply, inp, _ = self.core.route(q)
        self.m.observe(reply, inp.policy if inp else "none")
        await msg.respond(reply.model_dump_json(exclude_none=True).encode())
