"""NATS side of the gateway: publishes attempts to JetStream, owns one wildcard subscription
for every request's tokens, answers workers' "still wanted?" probes, feeds worker heartbeats to
the gateway's one worker registry (the routing library's :class:`LiveState`, which the embedded
router decides on too) and turns a vanished worker into :class:`WorkerLost` for the attempt it
held."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any

from llmlab_common.codes import Code
from llmlab_common.errors import PayloadTooLarge
from llmlab_common.messages import (
    STREAM_MESSAGE,
    AliveProbe,
    AliveReply,
    AttemptEvent,
    CancelRequest,
    InferenceRequest,
    RequestEvent,
    RouteTarget,
    StreamEnd,
    StreamError,
    StreamStarted,
    TokenChunk,
    split_batch,
)
from llmlab_common.metrics import Metrics
from llmlab_common.natsio import TOKEN_SUB_PENDING_BYTES, TOKEN_SUB_PENDING_MSGS
from llmlab_common.subjects import (
    PRIORITY_LEVELS,
    Topology,
    attempt_event_msg_id,
    attempt_msg_id,
    request_event_msg_id,
)
from llmlab_routing.feed import parse_heartbeat
from llmlab_routing.state import LiveState
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from pydantic import ValidationError

from llmlab_gateway.service import AttemptMessage, StreamGap, WorkerLost

log = logging.getLogger(__name__)

RECANCEL_EVERY_S = 1.0  # a stream nobody reads is cancelled again at most this often
RECANCEL_TABLE = 4096  # streams remembered for that; more at once are not cancelled again


@dataclass
class _Inflight:
    attempt: int
    queue: asyncio.Queue[AttemptMessage] = field(default_factory=asyncio.Queue)
    next_seq: int = 0
    worker_id: str | None = None  # the worker that took it (StreamStarted)
    worker_instance: str = ""  # and which process of it
    target_worker: str | None = None  # the worker it was addressed to, before one took it
    lost_reported: bool = False
    done: bool = False
    last_msg_at: float = field(default_factory=time.monotonic)
    queued: _Queue | None = None  # its queue's count while no worker has taken it yet
    # While the request's reader waits on a sweeper-enforced timeout: when it expires (monotonic).
    deadline: float = math.inf


# Put in a waiting reader's queue by the sweeper when its deadline passed: "nothing came in time".
_EXPIRED: Any = object()


class _Queue:
    """Attempts this gateway published to one (pool, priority) that no worker has taken yet: the
    gauge, and the count admission adds to the heartbeats' (which lag by up to an interval)."""

    __slots__ = ("gauge", "n")

    def __init__(self, gauge: Any) -> None:
        self.gauge, self.n = gauge, 0

    def add(self) -> None:
        self.n += 1
        self.gauge.inc()

    def take(self) -> None:
        self.n -= 1
        self.gauge.dec()


def _taken(inf: _Inflight) -> None:
    """The attempt left the queue (a worker took it, or the gateway gave up on it): count it once."""
    if inf.queued is not None:
        inf.queued.take()
        inf.queued = None


class _Handle:
    def __init__(self, inflight: _Inflight, sweep_interval_s: float) -> None:
        self._inf = inflight
        self.attempt = inflight.attempt
        # Waits at least this long are timed by the sweeper, which walks every request each
        # interval anyway (late by at most one interval, a tenth of the wait or less): a stream's
        # idle timeout is waited for once per token, and a timer per wait costs more than the
        # message itself (asyncio.timeout: about 4 us a wait).
        self._swept_from = 10 * sweep_interval_s

    @property
    def taken(self) -> bool:
        """A worker has taken the attempt (it sent a stream message)."""
        return self._inf.next_seq > 0

    def next_nowait(self) -> AttemptMessage | None:
        q = self._inf.queue
        m = q.get_nowait() if not q.empty() else None
        return None if m is _EXPIRED else m  # a sentinel left by a reader that was cancelled

    async def next(self, timeout: float) -> AttemptMessage | None:
        inf = self._inf
        q = inf.queue
        while not q.empty():
            m = q.get_nowait()
            if m is not _EXPIRED:  # left over from an earlier wait that ended otherwise
                return m
        if timeout >= self._swept_from:
            inf.deadline = time.monotonic() + timeout
            try:
                m = await q.get()
            finally:
                inf.deadline = math.inf
            return None if m is _EXPIRED else m
        try:
            # asyncio.timeout() wraps the current task; wait_for would create one per message.
            async with asyncio.timeout(timeout):
                return await q.get()
        except TimeoutError:
            return None


class NatsDispatcher:
    def __init__(
        self,
        nc: NATS,
        js: JetStreamContext,
        topo: Topology,
        gateway_id: str,
        registry: LiveState,
        metrics: Metrics,
        discovery_grace_s: float,
        sweep_interval_s: float,
        configured_pools: Callable[[], Iterable[str]] = tuple,
    ) -> None:
        self.nc = nc
        self.js = js
        self.topo = topo
        self.gateway_id = gateway_id
        self.registry = registry
        self.inflight: dict[str, _Inflight] = {}
        self._started_at = time.monotonic()  # of the process, then of its last NATS reconnection
        self._was_connected = True
        self._grace = discovery_grace_s
        self._sweep_interval = sweep_interval_s
        self._tasks: set[asyncio.Task[None]] = set()
        self._sweeper: asyncio.Task[None] | None = None
        # The catalog's pools get a live-workers series from the start (0 until a heartbeat), or a
        # gateway restarted while a pool is down would have none and the no-ready-worker alert
        # could never fire for it.
        self._configured_pools = configured_pools
        self.stale = metrics.counter(
            "gateway_stale_messages_total", "Token messages dropped: unknown request or an old attempt"
        )
        self.workers_gauge = metrics.gauge("gateway_live_workers", "Ready workers seen by heartbeat", ("pool",))
        self.wait_gauge = metrics.gauge(
            "gateway_predicted_wait_seconds",
            "Predicted wait for a worker of the pool, for a request of the plan priority sent now (admission's "
            "input); NaN while unknown",
            ("pool", "priority"),
        )
        # JetStream's pending count (the router's gauge) cannot tell priorities apart: the subjects
        # are per pool. Each gateway knows the priority of what it published and no worker took yet.
        self._queued = metrics.gauge(
            "gateway_queued_attempts",
            "Attempts this gateway published that no worker has taken yet, by pool and priority",
            ("pool", "priority"),
        )
        self._queues: dict[tuple[str, int], _Queue] = {}
        # The attempt table's size, set by the sweeper: it must come back to 0 when traffic stops
        # (an entry left behind by a refused request was a leak, and the sweeper walks them all).
        self._event_failures = metrics.counter(
            "gateway_event_publish_failures_total",
            "Attempt and request events JetStream did not confirm (a full events stream, NATS down)",
        )
        self._table_size = metrics.gauge(
            "gateway_dispatch_table_entries", "Requests with an attempt this gateway dispatched and has not released"
        )
        self._batch_subject = topo.token_batch_subject(gateway_id)
        # Streams nobody reads, cancelled again: (request, attempt) -> when the next cancel may go.
        self._recancel_at: dict[tuple[str, int | None], float] = {}

    async def start(self) -> None:
        await self.nc.subscribe(
            self.topo.token_wildcard(self.gateway_id),
            cb=self._on_token,
            pending_msgs_limit=TOKEN_SUB_PENDING_MSGS,
            pending_bytes_limit=TOKEN_SUB_PENDING_BYTES,
        )
        await self.nc.subscribe(self.topo.alive_subject(self.gateway_id), cb=self._on_alive)
        await self.nc.subscribe(self.topo.heartbeat_wildcard, cb=self._on_heartbeat)
        # The server has the SUBs before the gateway serves (subscribe() only queues them): a
        # worker's first tokens, on another connection, could otherwise reach it first.
        await self.nc.flush(timeout=5)
        self._set_workers_gauge(time.monotonic())
        self._sweeper = asyncio.create_task(self._sweep_loop(), name="worker-sweeper")

    async def stop(self) -> None:
        if self._sweeper:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5)

    def discovery_done(self) -> bool:
        return time.monotonic() - self._started_at >= self._grace

    def _note_reconnection(self, now: float) -> None:
        """Back from a NATS outage, this gateway heard no heartbeat while it was cut off and its
        workers aged out: discovery starts again, so that a request routed to "no live worker"
        waits for their next heartbeats instead of a 503 (the chaos suite's NATS restart)."""
        connected = self.nc.is_connected
        if connected and not self._was_connected:
            self._started_at = now
            log.info("reconnected to NATS: waiting %.1f s for the workers' heartbeats before a 503", self._grace)
        self._was_connected = connected

    # -- Dispatcher protocol -------------------------------------------------------------------
    def live_workers(self, pool: str, excluding: str | None = None) -> int:
        return self.registry.live_ready(pool, excluding=excluding)

    def predicted_wait(self, pool: str, priority: int = 0) -> float | None:
        est = self.registry.predicted_wait(pool, priority, local_queued=self._queued_from(pool, priority))
        return est.seconds if est is not None else None

    def _queued_from(self, pool: str, priority: int) -> int:
        """Attempts this gateway published to ``pool`` at ``priority`` or above that no worker took yet."""
        return sum(q.n for (p, prio), q in self._queues.items() if p == pool and prio >= priority)

    async def wait_discovery(self) -> None:
        self._note_reconnection(time.monotonic())  # the sweeper may not have seen it yet
        remaining = self._grace - (time.monotonic() - self._started_at)
        if remaining > 0:
            await asyncio.sleep(remaining)

    async def dispatch(self, req: InferenceRequest, target: RouteTarget) -> _Handle:
        inf = _Inflight(attempt=req.attempt, target_worker=target.worker_id)
        previous = self.inflight.get(req.request_id)
        if previous is not None:
            _taken(previous)  # a fallback replaces an attempt nobody took
        # Register before publishing: the first token can beat the publish ack.
        self.inflight[req.request_id] = inf
        req.reply_subject = self.topo.token_subject(self.gateway_id, req.request_id)
        subject = (
            self.topo.worker_subject(target.pool, target.worker_id, req.priority)
            if target.worker_id
            else self.topo.pool_subject(target.pool, req.priority)
        )
        payload = req.model_dump_json(exclude_none=True).encode()
        if len(payload) > self.nc.max_payload:
            self.inflight.pop(req.request_id, None)
            raise PayloadTooLarge(
                f"Request of {len(payload)} bytes exceeds the message bus limit of {self.nc.max_payload} bytes "
                "(NATS max_payload)."
            )
        key = (req.pool, req.priority)
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = _Queue(self._queued.labels(req.pool, str(req.priority)))
        if inf.next_seq == 0:  # not taken while we were registering it
            inf.queued = queue
            queue.add()
        try:
            await self.js.publish(
                subject,
                payload,
                headers={"Nats-Msg-Id": attempt_msg_id(req.request_id, req.attempt)},
                timeout=5,
            )
        except BaseException:
            _taken(inf)
            raise
        return _Handle(inf, self._sweep_interval)

    def cancel(self, request_id: str, attempt: int | None, reason: str) -> None:
        msg = CancelRequest(request_id=request_id, attempt=attempt, reason=reason)
        self._spawn(self.nc.publish(self.topo.cancel_subject, msg.model_dump_json().encode()))

    def release(self, request_id: str) -> None:
        inf = self.inflight.pop(request_id, None)
        if inf is not None:
            inf.done = True
            _taken(inf)

    def record_attempt(self, event: AttemptEvent) -> None:
        self._spawn(
            self._publish_event(
                self.topo.attempt_event_subject,
                event,
                attempt_event_msg_id(event.request_id, event.attempt, event.source),
            )
        )

    def record_request(self, event: RequestEvent) -> None:
        self._spawn(self._publish_event(self.topo.request_event_subject, event, request_event_msg_id(event.request_id)))

    # -- internals -------------------------------------------------------------------------------
    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _publish_event(self, subject: str, event: AttemptEvent | RequestEvent, msg_id: str) -> None:
        try:
            await self.js.publish(
                subject, event.model_dump_json(exclude_none=True).encode(), headers={"Nats-Msg-Id": msg_id}, timeout=5
            )
        except Exception:
            # A full events stream refuses new events (discard new): counted, never silent.
            self._event_failures.inc()
            log.exception("could not publish event", extra={"request_id": event.request_id})

    async def _on_token(self, msg: Msg) -> None:
        if msg.subject == self._batch_subject:
            for line in split_batch(msg.data):
                try:
                    m = STREAM_MESSAGE.validate_json(line)
                except ValidationError:
                    log.error("malformed message in a token batch dropped")
                    continue
                inf = self.inflight.get(m.request_id)
                if inf is None:
                    self._unread(m.request_id, m.attempt, m)
                    continue
                self._deliver(inf, m)
            return
        request_id = msg.subject.rsplit(".", 1)[-1]
        inf = self.inflight.get(request_id)
        if inf is None:
            self._unread(request_id, None, None)
            return
        try:
            m = STREAM_MESSAGE.validate_json(msg.data)
        except ValidationError:
            log.error("malformed token message dropped", extra={"request_id": request_id})
            return
        self._deliver(inf, m)

    def _deliver(self, inf: _Inflight, m: StreamStarted | TokenChunk | StreamEnd | StreamError) -> None:
        """Fence (attempt), order (sequence) and queue one stream message for its request."""
        if m.attempt != inf.attempt:
            self._unread(m.request_id, m.attempt, m)  # a stale attempt never writes into the client's stream
            return
        _taken(inf)  # any message of the attempt: a worker has it
        if m.seq != inf.next_seq:
            if m.seq < inf.next_seq:
                return  # duplicate
            inf.queue.put_nowait(StreamGap(inf.attempt, inf.next_seq, m.seq))
            inf.next_seq = m.seq + 1
            return
        inf.next_seq += 1
        inf.last_msg_at = time.monotonic()
        if isinstance(m, StreamStarted):
            inf.worker_id = m.worker_id
            inf.worker_instance = m.instance_id
        inf.queue.put_nowait(m)
        if isinstance(m, StreamEnd | StreamError):
            inf.done = True

    def _unread(self, request_id: str, attempt: int | None, m: AttemptMessage | None) -> None:
        """A stream message nobody will read (the request ended here, or an older attempt). While
        it still generates, cancel it again, at most once a second: a cancel is a core NATS
        message, at most once, and one lost (a reconnect, a slow consumer cut off) would leave the
        engine generating for nobody until the answer's end."""
        self.stale.inc()
        if isinstance(m, StreamEnd | StreamError):
            return  # it ended
        now = time.monotonic()
        key = (request_id, attempt)
        if self._recancel_at.get(key, 0.0) > now:
            return
        if len(self._recancel_at) >= RECANCEL_TABLE:
            self._recancel_at = {k: t for k, t in self._recancel_at.items() if t > now}
            if len(self._recancel_at) >= RECANCEL_TABLE:
                return  # a flood of them: the ones already cancelled again are enough
        self._recancel_at[key] = now + RECANCEL_EVERY_S
        self.cancel(request_id, attempt, Code.STALE_STREAM)

    async def _on_alive(self, msg: Msg) -> None:
        try:
            probe = AliveProbe.model_validate_json(msg.data)
        except ValidationError:
            # Answered, not left to time out: "not wanted" is the safe answer to a probe nobody
            # can read (the asker drops the attempt instead of waiting its timeout).
            with contextlib.suppress(Exception):
                await msg.respond(AliveReply(request_id="", attempt=0, wanted=False).model_dump_json().encode())
            return
        inf = self.inflight.get(probe.request_id)
        wanted = inf is not None and not inf.done and inf.attempt == probe.attempt and inf.worker_id is None
        reply = AliveReply(request_id=probe.request_id, attempt=probe.attempt, wanted=wanted)
        with contextlib.suppress(Exception):
            await msg.respond(reply.model_dump_json().encode())

    async def _on_heartbeat(self, msg: Msg) -> None:
        hb = parse_heartbeat(self.topo, msg.subject, msg.data)
        if hb is not None:
            self.registry.on_heartbeat(hb)

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(self._sweep_interval)
            now = time.monotonic()
            self._note_reconnection(now)
            for inf in list(self.inflight.values()):
                if inf.deadline <= now and inf.queue.empty():
                    inf.queue.put_nowait(_EXPIRED)  # its reader's wait timed out
                # A worker addressed directly that dies before taking the attempt is lost too:
                # its consumer would hold the message until the queue timeout otherwise.
                wid = inf.worker_id or inf.target_worker
                if not wid or inf.done or inf.lost_reported:
                    continue
                # Addressed to a worker that drains, or whose engine is down, and not taken: it
                # pulls nothing (a drain ends, an engine may restart in seconds or never), so it is
                # lost now, not when the drain ends plus the TTL or after the queue timeout (make
                # local-demo: a request queued for a killed llama.cpp answered 429 after 30 s).
                untakeable = inf.worker_id is None and self.registry.takes_nothing(wid)
                if not untakeable and self.registry.alive(wid, inf.worker_instance):
                    continue
                # Tokens still arriving prove the worker alive even when its heartbeats lag (an
                # overloaded event loop); lost means silent on both for the heartbeat TTL.
                if untakeable or now - inf.last_msg_at > self.registry.ttl(wid):
                    inf.lost_reported = True
                    inf.queue.put_nowait(WorkerLost(inf.attempt, wid))
            self._table_size.set(len(self.inflight))
            self._set_workers_gauge(now)
            self.registry.prune(now)

    def _set_workers_gauge(self, now: float) -> None:
        for pool in {*self.registry.pools(), *self._configured_pools()}:
            self.workers_gauge.labels(pool).set(self.registry.live_ready(pool, now))
            for p in range(PRIORITY_LEVELS):
                est = self.registry.predicted_wait(pool, p, now, self._queued_from(pool, p))
                self.wait_gauge.labels(pool, str(p)).set(est.seconds if est is not None else math.nan)
