"""The worker's one ordered queue of core-NATS publishes (token messages, terminal messages)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque

from nats.aio.client import Client as NATS

log = logging.getLogger(__name__)


class Outbox:
    """One ordered queue of core-NATS publishes drained by a single task: token messages from
    every attempt (and timer flushes) leave in the order they were made, at the cost of a deque
    append each instead of a task each."""

    def __init__(self) -> None:
        self._q: deque[tuple[str, bytes]] = deque()
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()

    def put(self, subject: str, payload: bytes) -> None:
        self._q.append((subject, payload))
        self._idle.clear()
        self._wake.set()

    async def run(self, nc: NATS) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._q:
                subject, payload = self._q.popleft()
                try:
                    await nc.publish(subject, payload)
                except Exception:
                    log.exception("publish to %s failed", subject)
            self._idle.set()

    async def flushed(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout)
