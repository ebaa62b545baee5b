"""NATS adapter feeding :class:`LiveState`: worker heartbeats (core NATS), attempt events (an
ephemeral ordered consumer on the events stream from now on: live figures need no history) and,
where asked, the decisions gateways in ``shared`` router mode made themselves (core NATS)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from llmlab_common.messages import AttemptEvent, Heartbeat, RouteCommit
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
        self,
        nc: NATS,
        js: JetStreamContext,
        topo: Topology,
        state: LiveState,
        heartbeats: bool = True,
        commits_except: str | None = None,
        on_commit: Callable[[RouteCommit], None] | None = None,
    ) -> None:
        self.nc, self.js, self.topo, self.state = nc, js, topo, state
        # False where the process already parses heartbeats and hands them to state.on_heartbeat.
        self.heartbeats = heartbeats
        # Not None: apply the gateways' shared decisions, except those on this subject (its own:
        # already applied when it decided).
        self.commits_except = commits_except
        self.on_commit = on_commit  # told of each one applied (the router service counts them)
        self._subs: list[Subscription] = []

    async def start(self) -> None:
        if self.heartbeats:
            self._subs.append(await self.nc.subscribe(self.topo.heartbeat_wildcard, cb=self._on_heartbeat))
        if self.commits_except is not None:
            self._subs.append(await self.nc.subscribe(self.topo.router_commit_wildcard, cb=self._on_commit))
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

    async def _on_commit(self, msg: Msg) -> None:
        if msg.subject == self.commits_except:
            return
        try:
            c = RouteCommit.model_validate_json(msg.data)
        except ValidationError:
            log.warning("malformed route commit dropped from %s", msg.subject)
            return
        self.state.commit(c.deployment, c.worker_id, c.prefix_hashes)
        if self.on_commit is not None:
            self.on_commit(c)
