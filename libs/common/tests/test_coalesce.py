"""The coalescer: calls of one loop turn go as one batch, answers reach their own callers."""

from __future__ import annotations

import asyncio

import pytest
from llmlab_common.coalesce import Coalescer

pytestmark = pytest.mark.unit


class Recorder:
    def __init__(self, gate: asyncio.Event | None = None) -> None:
        self.batches: list[list[int]] = []
        self.gate = gate

    async def run(self, items: list[int]) -> list[int | BaseException]:
        self.batches.append(list(items))
        if self.gate is not None:
            await self.gate.wait()
        return [ValueError(f"odd {i}") if i % 2 else i * 10 for i in items]


async def test_one_turn_is_one_batch_and_each_caller_gets_its_own_answer() -> None:
    rec = Recorder()
    c: Coalescer[int, int] = Coalescer(rec.run, max_batch=100)
    results = await asyncio.gather(*(c.submit(i) for i in range(6)), return_exceptions=True)
    assert rec.batches == [[0, 1, 2, 3, 4, 5]]
    assert results[0::2] == [0, 20, 40]
    assert [str(e) for e in results[1::2]] == ["odd 1", "odd 3", "odd 5"]


async def test_a_lone_call_goes_at_once() -> None:
    rec = Recorder()
    c: Coalescer[int, int] = Coalescer(rec.run)
    assert await asyncio.wait_for(c.submit(4), 0.5) == 40
    assert await c.submit(2) == 20
    assert rec.batches == [[4], [2]]


async def test_batches_are_bounded_and_queue_while_in_flight_is_full() -> None:
    gate = asyncio.Event()
    rec = Recorder(gate)
    c: Coalescer[int, int] = Coalescer(rec.run, max_batch=2, max_in_flight=2)
    first = [asyncio.create_task(c.submit(i)) for i in (0, 2, 4, 6, 8)]
    await asyncio.sleep(0.01)
    assert rec.batches == [[0, 2], [4, 6]]  # two in flight; 8 waits for one of them
    late = [asyncio.create_task(c.submit(i)) for i in (10, 12)]
    await asyncio.sleep(0.01)
    assert len(rec.batches) == 2
    gate.set()
    assert await asyncio.gather(*first, *late) == [0, 20, 40, 60, 80, 100, 120]
    assert rec.batches[2:] == [[8, 10], [12]]


async def test_a_failed_batch_fails_each_caller_and_a_short_answer_is_a_failure() -> None:
    async def broken(items: list[int]) -> list[int]:
        raise ConnectionError("down")

    async def short(items: list[int]) -> list[int]:
        return items[:-1]

    c: Coalescer[int, int] = Coalescer(broken)
    rs = await asyncio.gather(c.submit(1), c.submit(2), return_exceptions=True)
    assert all(isinstance(r, ConnectionError) for r in rs)
    c2: Coalescer[int, int] = Coalescer(short)
    rs = await asyncio.gather(c2.submit(1), c2.submit(2), return_exceptions=True)
    assert all(isinstance(r, RuntimeError) for r in rs)


async def test_a_caller_that_gives_up_does_not_disturb_the_others() -> None:
    gate = asyncio.Event()
    rec = Recorder(gate)
    c: Coalescer[int, int] = Coalescer(rec.run)
    gone = asyncio.create_task(c.submit(2))
    kept = asyncio.create_task(c.submit(4))
    await asyncio.sleep(0.01)
    gone.cancel()
    gate.set()
    assert await kept == 40
    with pytest.raises(asyncio.CancelledError):
        await gone
    await c.aclose()
