"""Fixtures of the budget tests: a private Redis key prefix per test, deleted afterwards."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from llmlab_budget.layout import Layout
from redis.asyncio import BlockingConnectionPool, Redis


@pytest.fixture
async def redis_layout() -> AsyncIterator[tuple[Redis, Layout]]:
    redis = Redis(connection_pool=BlockingConnectionPool.from_url("redis://127.0.0.1:6379/0", max_connections=32))
    layout = Layout(f"test_{uuid.uuid4().hex[:12]}:bud")
    try:
        yield redis, layout
    finally:
        keys = [k async for k in redis.scan_iter(match=layout.all_keys, count=1000)]
        if keys:
            await redis.delete(*keys)
        await redis.aclose()
