"""NATS adapter feeding :class:`LiveState`: worker heartbeats (core NATS) and attempt events (an
ephemeral ordered consumer on the events stream from now on: live figures need no history)."""

from __future__ import annotations

import logging

from llmlab_common.messages import AttemptEvent, Heartbeat
from llmlab_common.subjects import Topology
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.api import DeliverPolicy
from pydantic import ValidationError

from llmlab_routing.state import LiveState

log = logging.getLogger(__name__)


def parse_heartbeat(topo: Topology, subject: str, data: bytes) -> Heartbeat | None:
    """A heartbeat as the registries take it: valid, and on its own worker's subject (one that
    names another worker or pool would speak for someone else); None (logged) otherwise."""
    try:
        hb = Heartbeat.model_validate_json(data)
    except ValidationError:
        log.warning("malformed heartbeat dropped from %s", subject)
        return None
    if not topo.heartbeat_matches(subject, hb.pool, hb.worker_id):
        log.warning("heartbeat of %s/%s on %s dropped: not its subject", hb.pool[:64], hb.worker_id[:64], subject)
        return None
    return hb


class LiveFeed:
    def __init__(
        self, nc: NATS, js: JetStreamContext, topo: Topology, state: LiveState, heartbeats: bool = True
    ) -> None:
        self.nc, self.js, self.topo, self.state = nc, js, topo, state
        # False where the process already parses heartbeats and hands them to state.on_heartbeat.
        self.heartbeats = heartbeats
        self._subs: list[Subscription] = []

    async def start(self) -> None:
        if self.heartbeats:
            self._subs.append(await self.nc.subscribe(self.topo.heartbeat_wildcard, cb=self._on_heartbeat))
        self._subs.append(
            await self.js.subscribe(
                self.topo.attempt_event_subject,
                stream=self.topo.events_stream,
                cb=self._on_event,
                ordered_consumer=True,
                deliver_policy=DeliverPolicy.NEW,
            )
        )

    async def stop(self) -> None:
        for sub in self._subs:
            try:
                await sub.unsubscribe()
            except Exception:  # connection already closing: nothing left to stop
                log.debug("unsubscribe failed", exc_info=True)
        self._subs.clear()

    async def _on_heartbeat(self, msg: Msg) -> None:
        hb = parse_heartbeat(self.topo, msg.subject, msg.data)
        if hb is not None:
            self.state.on_heartbeat(hb)

    async def _on_event(self, msg: Msg) -> None:
        try:
            self.state.on_attempt(AttemptEvent.model_validate_json(msg.data))
        except ValidationError:
            log.warning("malformed attempt event ignored by the router")
