"""Fixtures of the budget tests: a private Redis key prefix per test, deleted afterwards."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from llmlab_budget.app import open_redis
from llmlab_budget.layout import Layout
from redis.asyncio import Redis


@pytest.fixture
async def redis_layout() -> AsyncIterator[tuple[Redis, Layout]]:
    # The service's own client (commands packed in C, llmlab_budget.redis_pack): every ledger test runs on it.
    redis = open_redis("redis://127.0.0.1:6379/0", 32, socket_timeout_s=5.0)
    layout = Layout(f"test_{uuid.uuid4().hex[:12]}:bud")
    try:
        yield redis, layout
    finally:
        keys = [k async for k in redis.scan_iter(match=layout.all_keys, count=1000)]
        if keys:
            await redis.delete(*keys)
        await redis.aclose()
