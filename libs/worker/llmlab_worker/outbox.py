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
    append each instead of a task each.

    Each drain ends in one socket write (nats-py's flusher runs once the drain yields). Under load
    drains are spaced at least ``window_s`` apart, so many streams' messages share a write; a
    message after a quiet spell leaves at once (no added latency at low rates)."""

    def __init__(self, window_s: float = 0.0) -> None:
        self.window_s = window_s
        self._q: deque[tuple[str, bytes]] = deque()
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._last_drain = 0.0

    def put(self, subject: str, payload: bytes) -> None:
        self._q.append((subject, payload))
        self._idle.clear()
        self._wake.set()

    async def run(self, nc: NATS) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            wait = self._last_drain + self.window_s - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            self._last_drain = loop.time()
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
