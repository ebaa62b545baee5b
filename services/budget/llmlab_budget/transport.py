"""NATS side of the budget service: the reserve responders (one request per message, or a gateway's
batch answered in order; queue group shared by replicas), the settlement consumer (one durable
consumer shared by replicas) and the reaper loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from typing import Any

from llmlab_common.codes import Code
from llmlab_common.errors import InvalidRequest, RateLimited, ServiceUnavailable
from llmlab_common.messages import (
    AttemptEvent,
    RequestEvent,
    ReserveBatch,
    ReserveBatchReply,
    ReserveReply,
    ReserveRequest,
)
from llmlab_common.natsio import ensure_consumer, event_consumer_config
from llmlab_common.pull import BatchPuller
from llmlab_common.subjects import Topology
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from pydantic import ValidationError

from llmlab_budget.service import BudgetService
from llmlab_budget.settings import BudgetSettings

log = logging.getLogger(__name__)


class BudgetTransport:
    def __init__(
        self, nc: NATS, js: JetStreamContext, topo: Topology, service: BudgetService, settings: BudgetSettings
    ) -> None:
        self.nc, self.js, self.topo = nc, js, topo
        self.service = service
        self.settings = settings
        self._reserve_subs: list[Subscription] = []
        self._puller: BatchPuller | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._inflight: set[asyncio.Task[None]] = set()
        self._pending_reserves = 0  # requests in flight, batches counted by their size
        service.m.pending_reserves.set_function(lambda: self._pending_reserves)
        # At most pool-size reserves talk to Redis at once; the rest wait here, up to a bound.
        self._redis_slots = asyncio.Semaphore(settings.redis_pool_size)
        self._stopping = False

    async def start(self) -> None:
        # Settlement first: events of requests reserved from now on must find the consumer there.
        s = self.settings
        # The contract's consumer (ensure_streams made it with the stream, so no event published
        # before this process started is missed), with this service's ack wait and redelivery.
        await ensure_consumer(
            self.js,
            self.topo.events_stream,
            event_consumer_config(
                self.topo,
                self.topo.BUDGET_SETTLE_CONSUMER,
                ack_wait=s.settle_ack_wait_s,
                max_deliver=s.settle_max_deliver,
            ),
        )
        puller = self._puller = BatchPuller(self.nc, self.topo.events_stream, self.topo.BUDGET_SETTLE_CONSUMER)
        await puller.start()
        self._tasks.append(asyncio.create_task(self._settle_loop(puller), name="budget-settle"))
        self._tasks.append(asyncio.create_task(self._reap_loop(), name="budget-reaper"))
        group = self.topo.BUDGET_QUEUE_GROUP
        self._reserve_subs = [
            await self.nc.subscribe(self.topo.budget_reserve_subject, queue=group, cb=self._on_reserve),
            await self.nc.subscribe(self.topo.budget_reserve_batch_subject, queue=group, cb=self._on_reserve_batch),
        ]
        await self.nc.flush(timeout=5)  # the server has the SUBs before the service reports ready

    async def stop(self) -> None:
        """Stop taking reserves, finish the ones in flight, then stop settling."""
        self._stopping = True
        for sub in self._reserve_subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        if self._inflight:
            await asyncio.wait(self._inflight, timeout=5)
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        if self._puller is not None:
            await self._puller.close()

    # -- reserve -------------------------------------------------------------------------------
    # nats-py runs a subscription's callbacks one at a time: each message gets its own task so
    # reserves overlap (a semaphore the size of the Redis pool bounds the messages talking to
    # Redis; the ledger pipelines the scripts of reserves made together).
    def _admit(self, n: int) -> bool:
        if self._pending_reserves + n > self.settings.max_pending_reserves:
            self.service.m.refusals.labels("overloaded").inc(n)
            return False
        return True

    @staticmethod
    def _overloaded() -> RateLimited:
        return RateLimited("The budget service is overloaded; retry shortly.", retry_after_s=1, code=Code.OVERLOADED)

    def _spawn(self, n: int, work: Coroutine[Any, Any, None]) -> None:
        self._pending_reserves += n
        task = asyncio.create_task(work)
        self._inflight.add(task)

        def done(t: asyncio.Task[None]) -> None:
            self._inflight.discard(t)
            self._pending_reserves -= n

        task.add_done_callback(done)

    async def _on_reserve(self, msg: Msg) -> None:
        if not self._admit(1):
            reply = ReserveReply(request_id="", error=self._overloaded().to_info(), retry_after_s=1)
            await _respond(msg, reply.model_dump_json(exclude_none=True).encode())
            return
        self._spawn(1, self._reserve(msg))

    async def _on_reserve_batch(self, msg: Msg) -> None:
        try:
            batch = ReserveBatch.model_validate_json(msg.data)
        except ValidationError as exc:
            bad = InvalidRequest(str(exc)[:300], code=Code.BAD_RESERVE)
            await _respond(msg, ReserveBatchReply(error=bad.to_info()).model_dump_json(exclude_none=True).encode())
            return
        n = len(batch.requests)
        if not self._admit(n):
            reply = ReserveBatchReply(error=self._overloaded().to_info(), retry_after_s=1)
            await _respond(msg, reply.model_dump_json(exclude_none=True).encode())
            return
        self._spawn(n, self._reserve_batch(msg, batch.requests))

    async def _reserve(self, msg: Msg) -> None:
        try:
            req = ReserveRequest.model_validate_json(msg.data)
        except ValidationError as exc:
            bad = InvalidRequest(str(exc)[:300], code=Code.BAD_RESERVE)
            reply = ReserveReply(request_id="", error=bad.to_info())
        else:
            async with self._redis_slots:
                reply = await self._reserve_one(req)
        await _respond(msg, reply.model_dump_json(exclude_none=True).encode())

    async def _reserve_batch(self, msg: Msg, reqs: list[ReserveRequest]) -> None:
        async with self._redis_slots:
            replies = await asyncio.gather(*(self._reserve_one(r) for r in reqs))
        await _respond(msg, ReserveBatchReply(replies=list(replies)).model_dump_json(exclude_none=True).encode())

    async def _reserve_one(self, req: ReserveRequest) -> ReserveReply:
        try:
            return await self.service.reserve(req)
        except Exception:
            log.exception("reserve failed")
            err = ServiceUnavailable("The budget service cannot reach its store.", code=Code.BUDGET_UNAVAILABLE)
            return ReserveReply(request_id=req.request_id, error=err.to_info())

    # -- settle --------------------------------------------------------------------------------
    async def _settle_loop(self, puller: BatchPuller) -> None:
        while not self._stopping:
            try:
                msgs = await puller.pull(self.settings.settle_batch, 0.5)
            except Exception as exc:
                log.warning("settlement fetch failed: %s", exc)
                await asyncio.sleep(1)
                continue
            await asyncio.gather(*(self._settle(m) for m in msgs))

    async def _settle(self, msg: Msg) -> None:
        subject = msg.subject
        try:
            # Settles share the Redis slots with reserves: a batch of them cannot take the pool.
            async with self._redis_slots:
                if subject == self.topo.attempt_event_subject:
                    await self.service.settle_attempt(AttemptEvent.model_validate_json(msg.data))
                elif subject == self.topo.request_event_subject:
                    await self.service.settle_request(RequestEvent.model_validate_json(msg.data))
        except ValidationError as exc:
            # Not ours to retry: keep it for inspection. The reaper releases its reservation.
            log.error("malformed event on %s dead-lettered: %s", subject, str(exc)[:300])
            with contextlib.suppress(Exception):
                await self.js.publish(
                    self.topo.dead_letter_subject, msg.data, headers={"Llmlab-Reason": str(exc)[:200]}
                )
        except Exception as exc:
            self.service.m.settle_errors.inc()
            if msg.metadata.num_delivered >= self.settings.settle_max_deliver:
                # JetStream's last delivery: never drop a charge silently. Dead-letter it with why
                # (to be replayed once the cause is fixed) and count it (an alert fires).
                await self._give_up(msg, exc)
                return
            log.exception("settlement failed; event will be redelivered")
            with contextlib.suppress(Exception):
                await msg.nak(delay=1.0)
            return
        with contextlib.suppress(Exception):
            await msg.ack()

    async def _give_up(self, msg: Msg, exc: Exception) -> None:
        why = f"settlement failed {msg.metadata.num_delivered} times: {exc}"[:200]
        try:
            await self.js.publish(self.topo.dead_letter_subject, msg.data, headers={"Llmlab-Reason": why})
        except Exception:
            # Unacked, it stays in the events stream (interest retention) for an admin to find.
            log.critical("an event that could not be settled could not be dead-lettered either: %s", why)
            return
        self.service.m.settle_dead_letters.inc()
        log.error("event dead-lettered: %s", why)
        with contextlib.suppress(Exception):
            await msg.ack()

    async def _reap_loop(self) -> None:
        while not self._stopping:
            await asyncio.sleep(self.settings.reaper_interval_s)
            try:
                await self.service.reap()
            except Exception:
                log.exception("reaper failed")


async def _respond(msg: Msg, data: bytes) -> None:
    # The asker may be gone (timed out, disconnected): nothing to answer then.
    with contextlib.suppress(Exception):
        await msg.respond(data)
