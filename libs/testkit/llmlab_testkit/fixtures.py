"""Pytest fixtures (registered from the root conftest)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from llmlab_common.natsio import connect, delete_streams
from llmlab_common.subjects import Topology
from redis.asyncio import Redis

from llmlab_testkit.procs import Stack, unique_namespace

DEV_KEY = "sk-llmlab-dev"


async def _cleanup(namespace: str, nats_url: str, redis_url: str) -> None:
    nc = await connect(nats_url, "test-cleanup")
    try:
        await delete_streams(nc.jetstream(), Topology(namespace))
    finally:
        await nc.close()
    redis = Redis.from_url(redis_url)
    try:  # every Redis key of a namespace starts with it (budget: "<ns>:bud:...")
        keys = [k async for k in redis.scan_iter(match=f"{namespace}:*", count=1000)]
        for i in range(0, len(keys), 1000):
            await redis.delete(*keys[i : i + 1000])
    finally:
        await redis.aclose()


@pytest.fixture
def stack() -> Iterator[Stack]:
    """A fresh namespace (streams, subjects, consumers) per test, deleted afterwards. A process of
    the stack that exited without being stopped or killed by the test fails it (a crash that the
    test's own assertions happened not to notice)."""
    s = Stack(namespace=unique_namespace())
    try:
        yield s
    finally:
        crashed = [p for p in s.procs if p.crashed()]
        report = [f"{p.name} exited {p.proc.returncode if p.proc else '?'}; log tail:\n{p.tail()}" for p in crashed]
        s.close()
        asyncio.run(_cleanup(s.namespace, s.nats_url, s.redis_url))
    if report:
        pytest.fail("a process of the stack crashed during the test:\n" + "\n".join(report), pytrace=False)
