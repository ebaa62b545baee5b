"""Coalesce calls made in one event-loop turn into one batch call.

Under a burst, a hundred requests reach the same admission step (budget reserve, route, a Redis
script) within one loop turn; one NATS round trip or one Redis pipeline for all of them costs a
fraction of a hundred. Idle, a call is sent at once (the flush is scheduled with ``call_soon``,
so nothing waits on a timer). While ``max_in_flight`` batches are out, new calls queue and go
with the next batch, so the batch grows with the load instead of the number of round trips.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

log = logging.getLogger(__name__)

# What a batch function returns per item: its result, or the exception that item raises.
BatchFn = Callable[[list[T]], Awaitable[Sequence[R | BaseException]]]


class Coalescer(Generic[T, R]):
    def __init__(self, run: BatchFn[T, R], *, max_batch: int = 128, max_in_flight: int = 4) -> None:
        if max_batch < 1 or max_in_flight < 1:
            raise ValueError("max_batch and max_in_flight must be at least 1")
        self._run = run
        self.max_batch = max_batch
        self.max_in_flight = max_in_flight
        self._pending: list[tuple[T, asyncio.Future[R]]] = []
        self._scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()

    async def submit(self, item: T) -> R:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[R] = loop.create_future()
        self._pending.append((item, fut))
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._flush)
        return await fut

    def _flush(self) -> None:
        self._scheduled = False
        while self._pending and len(self._tasks) < self.max_in_flight:
            batch, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch :]
            task = asyncio.get_running_loop().create_task(self._send(batch))
            self._tasks.add(task)
            task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if self._pending and not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    async def _send(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        try:
            results = await self._run([item for item, _ in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"batch of {len(batch)} answered with {len(results)} results")
        except Exception as exc:  # every caller of the batch sees its failure
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(exc)
            return
        except asyncio.CancelledError:
            for _, fut in batch:
                if not fut.done():
                    fut.cancel()
            raise
        for (_, fut), res in zip(batch, results, strict=True):
            if fut.done():  # the caller gave up (cancelled); its result goes nowhere
                continue
            if isinstance(res, BaseException):
                fut.set_exception(res)
            else:
                fut.set_result(res)

    async def aclose(self) -> None:
        """Wait for the batches in flight (callers already waiting get their answers)."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=5)
