"""The reserve responder sheds load past its bound instead of queueing without limit."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from llmlab_budget.metrics import BudgetMetrics
from llmlab_budget.settings import BudgetSettings
from llmlab_budget.transport import BudgetTransport
from llmlab_common.messages import ReserveReply, ReserveRequest
from llmlab_common.metrics import Metrics
from llmlab_common.subjects import Topology

pytestmark = pytest.mark.unit


class SlowService:
    def __init__(self) -> None:
        self.m = BudgetMetrics(Metrics("t"))
        self.release = asyncio.Event()
        self.calls = 0

    async def reserve(self, req: ReserveRequest) -> ReserveReply:
        self.calls += 1
        await self.release.wait()
        return ReserveReply(request_id=req.request_id, max_tokens=1)


class Msg:
    def __init__(self, rid: str) -> None:
        self.data = ReserveRequest(request_id=rid, key_sha256="0" * 64).model_dump_json().encode()
        self.replies: list[ReserveReply] = []

    async def respond(self, data: bytes) -> None:
        self.replies.append(ReserveReply.model_validate_json(data))


async def test_reserves_past_the_bound_get_429_at_once_the_rest_complete() -> None:
    svc = SlowService()
    settings = BudgetSettings(redis_pool_size=2, max_pending_reserves=4)
    t = BudgetTransport(None, None, Topology("t"), svc, settings)  # type: ignore[arg-type]
    msgs = [Msg(f"r{i}") for i in range(6)]
    for m in msgs:
        await t._on_reserve(m)  # type: ignore[arg-type]
    await asyncio.sleep(0.05)
    assert svc.calls == 2  # only pool-size reserves reach the store at once
    shed = [m for m in msgs if m.replies]
    assert len(shed) == 2 and all(m.replies[0].error and m.replies[0].error.code == "overloaded" for m in shed)
    assert all(m.replies[0].retry_after_s == 1 for m in shed)
    svc.release.set()
    await asyncio.wait(t._inflight)
    done: list[Any] = [m.replies[0] for m in msgs[:4]]
    assert all(r.error is None and r.max_tokens == 1 for r in done)
