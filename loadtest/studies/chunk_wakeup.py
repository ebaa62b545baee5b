"""What the worker paid per engine chunk to wake the attempt's task (issue 34's per-token figure).

The attempt read the engine's body through three async generators (the attempt's loop, the
adapter's stream, the response's chunks) and a future per network read; the push path hands each
read to a callback instead (``llmlab_worker.http1.EngineResponse.push_chunks``). This isolates that
difference on uvloop, as the worker runs: a producer scheduled once per loop turn delivers N
chunks (one per turn, as paced socket reads arrive), either into a buffer whose waiter it wakes
(the chain) or straight into a callback (push). No sockets and no parsing: both sides pay the same
per-turn scheduling, so the difference is the wake-up and the generator chain alone.

    python loadtest/studies/chunk_wakeup.py [--n 200000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import time
from collections.abc import AsyncIterator, Callable

import uvloop


class _Conn:
    def __init__(self) -> None:
        self.chunks: collections.deque[bytes] = collections.deque()
        self.waiter: asyncio.Future[None] | None = None
        self.done = False

    def wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def feed(self, b: bytes) -> None:
        self.chunks.append(b)
        self.wake()

    async def wait(self) -> None:
        self.waiter = asyncio.get_running_loop().create_future()
        try:
            await self.waiter
        finally:
            self.waiter = None


async def _iter_chunks(c: _Conn) -> AsyncIterator[bytes]:
    while True:
        if c.chunks:
            yield c.chunks.popleft()
        elif c.done:
            return
        else:
            await c.wait()


async def _stream(c: _Conn) -> AsyncIterator[bytes]:
    async for part in _iter_chunks(c):
        yield part


def _producer(n: int, deliver: Callable[[bytes], None], end: Callable[[], None]) -> None:
    loop = asyncio.get_running_loop()

    def step(left: int) -> None:
        if left == 0:
            end()
            return
        deliver(b"x")
        loop.call_soon(step, left - 1)

    loop.call_soon(step, n)


async def chain(n: int) -> float:
    """µs of CPU per chunk through the three generators and a future per read."""
    c, out = _Conn(), []

    def end() -> None:
        c.done = True
        c.wake()

    _producer(n, c.feed, end)
    t = time.process_time()
    async for ev in _stream(c):
        out.append(ev)
    return (time.process_time() - t) / n * 1e6


async def push(n: int) -> float:
    """µs of CPU per chunk handed to a callback; the task waits once, for the end."""
    out: list[bytes] = []
    finished = asyncio.get_running_loop().create_future()
    _producer(n, out.append, lambda: finished.set_result(None))
    t = time.process_time()
    await finished
    return (time.process_time() - t) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    rows: dict[str, list[float]] = {"chain": [], "push": []}
    for _ in range(args.repeats):  # interleaved
        rows["chain"].append(uvloop.run(chain(args.n)))
        rows["push"].append(uvloop.run(push(args.n)))
    for name, xs in rows.items():
        print(f"{name:6s} µs per chunk: " + ", ".join(f"{x:.2f}" for x in xs))
    diff = [a - b for a, b in zip(rows["chain"], rows["push"], strict=True)]
    print("chain - push, µs per chunk: " + ", ".join(f"{d:.2f}" for d in diff))


if __name__ == "__main__":
    main()
