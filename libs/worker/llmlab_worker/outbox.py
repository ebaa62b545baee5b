"""The worker's one ordered queue of core-NATS publishes (token messages, terminal messages)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable

from llmlab_common.messages import join_batch
from nats.aio.client import Client as NATS

log = logging.getLogger(__name__)


class Outbox:
    """One ordered queue of core-NATS publishes drained by a single task: token messages from
    every attempt (and timer flushes) leave in the order they were made, at the cost of a deque
    append each instead of a task each.

    Each drain ends in one socket write (nats-py's flusher runs once the drain yields). Under load
    drains are spaced at least ``window_s`` apart, so many streams' messages share a write; a
    message after a quiet spell leaves at once (no added latency at low rates).

    With ``batch_subject`` (reply subject -> its gateway's batch subject, or None), the messages of
    one drain bound for the same gateway leave as one NATS message (up to ``max_batch_bytes``), in
    their order: one publish and one delivery per gateway instead of one per token message."""

    def __init__(
        self,
        window_s: float = 0.0,
        batch_subject: Callable[[str], str | None] | None = None,
        max_batch_bytes: int = 256 * 1024,
    ) -> None:
        self.window_s = window_s
        self.batch_subject = batch_subject
        self.max_batch_bytes = max_batch_bytes
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
                if self.batch_subject is None:
                    await self._publish(nc, *self._q.popleft())
                    continue
                for subject, payload in self.drain():
                    await self._publish(nc, subject, payload)
            self._idle.set()

    def drain(self) -> list[tuple[str, bytes]]:
        """Everything queued, as the publishes to make: a gateway's messages joined into batches
        (a lone message keeps its own subject), others as they are, each gateway's in order."""
        assert self.batch_subject is not None
        groups: dict[str, list[tuple[str, bytes]]] = {}
        out: list[tuple[str, bytes]] = []
        while self._q:
            subject, payload = self._q.popleft()
            key = self.batch_subject(subject)
            if key is None:
                out.append((subject, payload))
            else:
                groups.setdefault(key, []).append((subject, payload))
        for key, msgs in groups.items():
            if len(msgs) == 1:
                out.append(msgs[0])
                continue
            part: list[bytes] = []
            size = 0
            for _, payload in msgs:
                if part and size + len(payload) + 1 > self.max_batch_bytes:
                    out.append((key, join_batch(part)))
                    part, size = [], 0
                part.append(payload)
                size += len(payload) + 1
            out.append((key, join_batch(part)) if len(part) > 1 else (msgs[-1][0], part[0]))
        return out

    @staticmethod
    async def _publish(nc: NATS, subject: str, payload: bytes) -> None:
        try:
            await nc.publish(subject, payload)
        except Exception:
            log.exception("publish to %s failed", subject)

    async def flushed(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout)
