"""Pytest fixtures (registered from the root conftest)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import pytest
from llmlab_common.natsio import connect, delete_streams
from llmlab_common.subjects import Topology
from redis.asyncio import Redis

from llmlab_testkit.procs import Stack, unique_namespace

DEV_KEY = "sk-llmlab-dev"
log = logging.getLogger(__name__)


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
    """A fresh namespace (streams, subjects, consumers) per test, deleted afterwards."""
    s = Stack(namespace=unique_namespace())
    try:
        yield s
    finally:
        failed = [p for p in s.procs if p.proc is not None and p.proc.poll() not in (None, 0, -15)]
        s.close()
        for p in failed:
            log.warning("%s exited %s; log tail:\n%s", p.name, p.proc.returncode if p.proc else "?", p.tail())
        asyncio.run(_cleanup(s.namespace, s.nats_url, s.redis_url))
