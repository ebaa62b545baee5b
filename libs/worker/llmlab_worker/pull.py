"""Capacity-driven JetStream pulling.

nats-py's ``fetch(batch>1)`` keeps collecting until the batch is full or the timeout passes,
which would hold the first message of a trickle for the whole timeout. We instead keep one
lingering pull request per consumer on our own inbox (the common library's
:class:`~llmlab_common.pull.InboxPull`), sized to the free capacity, and hand each message to the
worker the moment it arrives. Slots are reserved when a pull is issued and the unfilled part is
returned when the server ends the pull (status 408/409) or it is satisfied, so a worker never
holds more messages than it can run.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from llmlab_common.pull import InboxPull
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

log = logging.getLogger(__name__)


class Capacity:
    """Free slots of a worker, shared by its feeders and its running attempts.

    A message that arrived without a reserved slot waits for one at a ``level``; when a slot
    frees, the highest level waiting takes it, and the pool feeder (which reserves slots for its
    plain pull, ``level`` None) only reserves what no waiter needs. The worker's levels:
    ``2 × priority`` for a plan priority's pool queue, ``2 × priority + 1`` for a message addressed
    to this very worker (ahead of the pool's of its own priority, never of a higher one).
    """

    def __init__(self, slots: int) -> None:
        self.total = slots
        self.free = slots
        self._waiting: dict[int, int] = {}  # level -> messages waiting for a slot
        self._held: list[tuple[int, Callable[[], int]]] = []  # level, count of prefetched messages
        self._cond = asyncio.Condition()

    @property
    def priority_waiting(self) -> int:
        return sum(self._waiting.values())

    def watch_held(self, level: int, count: Callable[[], int]) -> None:
        """A queue of ``level`` prefetches: ``count()`` is how many of its messages arrived and
        have not asked for a slot yet. They go before lower levels as much as the waiting ones do
        (else a lower waiter takes every slot that frees before the next one asks)."""
        self._held.append((level, count))

    def waiting_by_level(self) -> dict[int, int]:
        """Messages here that wait for a slot or will (prefetched), per level."""
        out = dict(self._waiting)
        for lv, count in self._held:
            out[lv] = out.get(lv, 0) + count()
        return out

    def _ahead(self, level: int | None) -> int:
        """Messages that go before a taker at ``level`` (None: the pool feeder, after all of them)."""
        return sum(n for lv, n in self.waiting_by_level().items() if level is None or lv > level)

    async def take_up_to(self, n: int, level: int | None = None) -> int:
        """Take up to ``n`` free slots (at least one, waiting for it): the pool feeder's reservation
        (``level`` None), or one message's slot at its level."""
        async with self._cond:
            if level is not None:
                self._waiting[level] = self._waiting.get(level, 0) + 1
                try:
                    await self._cond.wait_for(lambda: self.free - self._ahead(level) > 0)
                finally:
                    self._waiting[level] -= 1
                    if not self._waiting[level]:
                        del self._waiting[level]
            else:
                await self._cond.wait_for(lambda: self.free - self._ahead(None) > 0)
            k = min(n, self.free - self._ahead(level))
            self.free -= k
            if level is not None:
                self._cond.notify_all()  # a lower waiter may now be first in line
            return k

    def try_take(self, level: int | None = None) -> bool:
        if self.free - self._ahead(level) > 0:
            self.free -= 1
            return True
        return False

    async def release(self, n: int = 1) -> None:
        if n <= 0:
            return
        async with self._cond:
            self.free = min(self.total, self.free + n)
            self._cond.notify_all()

    async def recheck(self) -> None:
        """Wake the waiters to look again: a held count fell without a slot changing hands."""
        async with self._cond:
            self._cond.notify_all()


class PullFeeder(InboxPull):
    """One consumer's lingering pull, refilled as capacity frees.

    ``reserve_slots`` False (the priority queues and the per-worker ones): pull up to ``max_batch``
    messages without reserving; the handler finds each a slot itself, one after the other (see
    :meth:`steal_reserved`), so at most ``max_batch`` messages of the queue wait here.
    """

    def __init__(
        self,
        nc: NATS,
        stream: str,
        consumer: str,
        capacity: Capacity,
        handler: Callable[[Msg, bool], Awaitable[None]],
        *,
        max_batch: int,
        expires_s: float,
        reserve_slots: bool = True,
        api_prefix: str = "$JS.API",
    ) -> None:
        super().__init__(nc, stream, consumer, api_prefix)
        self.capacity = capacity
        self.handler = handler
        self.max_batch = max_batch
        self.expires_s = expires_s
        self.reserve_slots = reserve_slots
        self._remaining = 0
        self._done = asyncio.Event()
        self._open_left = 0  # messages the server may still deliver on the outstanding pull
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self.gate = asyncio.Event()  # cleared while the engine is down or the worker drains
        self.gate.set()

    async def start(self) -> None:
        await super().start()
        self._task = asyncio.create_task(self._loop(), name=f"pull:{self.next_subject}")

    async def stop_pulling(self) -> None:
        """No new pulls. The outstanding one may still deliver: keep listening (the handler hands
        such messages back with a NAK) until :meth:`close_after_pull`."""
        self._stopping = True
        self.gate.clear()
        self._done.set()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def pause(self) -> None:
        """Take nothing more until the gate opens again, the outstanding pull included. Left open,
        it would keep delivering what this worker can only NAK, and the server redelivers a NAKed
        message to the first pull in line, often this one again: three deliveries (max_deliver)
        and the message was gone, unanswered (a stream's continuation, seen by the chaos suite)."""
        self.gate.clear()
        await self.renew_inbox()
        self._open_left = 0
        self._done.set()  # the loop's pull has ended: it returns the unfilled slots and waits at the gate

    async def close_after_pull(self, timeout: float) -> None:
        """Wait (up to ``timeout``) for the outstanding pull to end, then stop listening, so no
        message is delivered to a dead inbox and left to wait out its ack_wait."""
        await self.stop_pulling()
        deadline = asyncio.get_running_loop().time() + timeout
        while self._open_left > 0 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        await super().close()

    async def _loop(self) -> None:
        while not self._stopping:
            await self.gate.wait()
            k = await self.capacity.take_up_to(self.max_batch) if self.reserve_slots else self.max_batch
            self._remaining = self._open_left = k
            self._done.clear()
            try:
                log.debug("pull %s batch=%d", self.next_subject, k)
                await self.request(k, self.expires_s)
                # The server ends the pull with a status (408 on expiry) after its messages.
                await asyncio.wait_for(self._done.wait(), self.expires_s + 2.0)
            except TimeoutError:
                log.debug("pull on %s ended without status; re-issuing", self.next_subject)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("pull request failed on %s", self.next_subject)
                await asyncio.sleep(0.5)
            finally:
                if self.reserve_slots and self._remaining > 0:
                    await self.capacity.release(self._remaining)
                self._remaining = 0

    def held(self) -> int:
        """Messages delivered to this feeder that its handler has not taken up yet."""
        return self._sub.pending_msgs if self._sub is not None else 0

    def steal_reserved(self) -> bool:
        """Hand one slot reserved by this feeder's outstanding pull to someone else (a targeted
        message must not wait for an idle pool's pull to expire). If the server later fills the
        whole pull anyway, the extra message finds no reservation and waits for a slot: the worker
        still never runs more than its capacity."""
        if self.reserve_slots and self._remaining > 0:
            self._remaining -= 1
            return True
        return False

    async def _on_msg(self, msg: Msg) -> None:
        try:
            await super()._on_msg(msg)
        finally:
            if not self.reserve_slots:
                # What this feeder held counted ahead of lower takers (Capacity.watch_held) until
                # its callback ran; a status message (a pull's 408) or a message handed back takes
                # no slot, so nobody else would wake: an idle worker's pool feeder then waited
                # for a release that never came while its queue filled (CI of 2026-12-06).
                await self.capacity.recheck()

    def on_end(self, status: str) -> None:
        log.debug("pull status %s on %s (remaining %d)", status, self.next_subject, self._remaining)
        self._open_left = 0
        self._done.set()

    async def on_message(self, msg: Msg) -> None:
        self._open_left = max(0, self._open_left - 1)
        held_slot = self.reserve_slots and self._remaining > 0
        # The handler returns once the message owns a slot (it waits for one when none was
        # reserved), so the next pull is issued only after that: nothing piles up here.
        await self.handler(msg, held_slot)
        if self._remaining > 0:
            self._remaining -= 1
            if self._remaining == 0:
                self._done.set()
