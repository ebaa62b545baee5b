"""Pulling from a JetStream consumer through our own inbox, with nats-py's public API only.

A pull request is a publish to ``$JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer>`` whose reply is
our inbox: the server delivers up to ``batch`` messages there, then, unless the batch was filled,
ends the pull with a status message (408 expired; 404/409 too; 100 is an idle heartbeat). nats-py's
own ``fetch`` creates a task and a wait per message and, with ``batch > 1``, holds the first
message of a trickle until the batch fills or the timeout passes.

:class:`InboxPull` is the mechanism (one inbox subscription, pull requests, status handling);
:class:`BatchPuller` is "up to ``n`` messages or the expiry", which the budget's settlement and
accounting's ingest use. The worker's capacity-driven feeder (``llmlab_worker.pull``) is an
``InboxPull`` too, one lingering pull sized to its free slots.
"""

from __future__ import annotations

import asyncio
import contextlib
import json

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

STATUS_HEADER = "Status"
IDLE_HEARTBEAT = "100"


class InboxPull:
    """One consumer read through our own inbox. Subclasses take delivered messages in
    :meth:`on_message` and hear in :meth:`on_end` that the server ended the outstanding pull."""

    def __init__(self, nc: NATS, stream: str, consumer: str, api_prefix: str = "$JS.API") -> None:
        self.nc = nc
        self.next_subject = f"{api_prefix}.CONSUMER.MSG.NEXT.{stream}.{consumer}"
        self.inbox = nc.new_inbox()
        self._sub: Subscription | None = None

    async def start(self) -> None:
        await self._subscribe()

    async def _subscribe(self) -> None:
        self._sub = await self.nc.subscribe(self.inbox, cb=self._on_msg)

    async def close(self) -> None:
        """Stop listening. A pull still open delivers into nothing: those messages wait out their
        ``ack_wait`` and are redelivered, so callers let their last pull end first when they can."""
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None

    async def renew_inbox(self) -> None:
        """Listen on a fresh inbox, dropping the outstanding pull: the server serves a waiting
        pull only while its inbox has a subscriber, so it ends that pull instead of delivering
        into it (a message already on its way is lost to this pull and redelivered after its
        ``ack_wait``: a window of microseconds against the pull's whole expiry)."""
        await self.close()
        self.inbox = self.nc.new_inbox()
        await self._subscribe()

    async def request(self, batch: int, expires_s: float) -> None:
        """Ask for up to ``batch`` messages, the pull ending after ``expires_s`` at the latest."""
        req = {"batch": batch, "expires": int(max(expires_s, 0.01) * 1e9)}
        await self.nc.publish(self.next_subject, json.dumps(req).encode(), reply=self.inbox)

    async def _on_msg(self, msg: Msg) -> None:
        status = msg.headers.get(STATUS_HEADER) if msg.headers else None
        if status is None:
            await self.on_message(msg)
        elif status != IDLE_HEARTBEAT:
            self.on_end(status)

    async def on_message(self, msg: Msg) -> None:
        raise NotImplementedError

    def on_end(self, status: str) -> None:
        raise NotImplementedError


class BatchPuller(InboxPull):
    """:meth:`pull` returns up to ``n`` messages: as soon as ``n`` have arrived, or when the pull
    expires with fewer. A message of an earlier pull that arrives late lands in the next batch."""

    def __init__(self, nc: NATS, stream: str, consumer: str, api_prefix: str = "$JS.API") -> None:
        super().__init__(nc, stream, consumer, api_prefix)
        self._buf: list[Msg] = []
        self._want = 0
        self._done = asyncio.Event()

    async def pull(self, n: int, expires_s: float) -> list[Msg]:
        self._want = n
        self._done.clear()
        await self.request(n, expires_s)
        with contextlib.suppress(TimeoutError):
            # The server ends an unfilled pull with a status; the margin covers a lost one.
            await asyncio.wait_for(self._done.wait(), expires_s + 2.0)
        out, self._buf = self._buf, []
        return out

    async def on_message(self, msg: Msg) -> None:
        self._buf.append(msg)
        if len(self._buf) >= self._want:
            self._done.set()

    def on_end(self, status: str) -> None:
        self._done.set()
