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
from llmlab_testkit.e2e import samples

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


class FailingSettle:
    """A store that refuses every settle (a bug, a poisoned key)."""

    def __init__(self) -> None:
        self.metrics = Metrics("t")
        self.m = BudgetMetrics(self.metrics)

    async def settle_attempt(self, ev: object) -> None:
        raise RuntimeError("WRONGTYPE Operation against a key holding the wrong kind of value")


class EventMsg:
    def __init__(self, subject: str, delivered: int) -> None:
        from llmlab_common.messages import AttemptEvent, Principal

        self.subject = subject
        self.data = AttemptEvent(
            request_id="r1", attempt=1, outcome="completed", source="worker", pool="p", deployment="d",
            model="m", endpoint="chat", principal=Principal(), created_at=0.0, ended_at=0.0,
        ).model_dump_json().encode()  # fmt: skip
        self.metadata = type("Meta", (), {"num_delivered": delivered})()
        self.log: list[str] = []

    async def ack(self) -> None:
        self.log.append("ack")

    async def nak(self, delay: float = 0) -> None:
        self.log.append("nak")


class RecordingJS:
    def __init__(self) -> None:
        self.published: list[tuple[str, dict[str, str]]] = []

    async def publish(self, subject: str, payload: bytes, headers: dict[str, str] | None = None, **_: Any) -> None:
        self.published.append((subject, headers or {}))


async def test_an_event_that_never_settles_is_dead_lettered_on_its_last_delivery_not_dropped() -> None:
    """Catches: a settle that failed on every delivery being dropped once JetStream stopped
    redelivering it (dd4f538: nak'd ten times, then never seen again; the reaper released the
    reservation, so the request was never charged, silently)."""
    svc, js, topo = FailingSettle(), RecordingJS(), Topology("t")
    settings = BudgetSettings(settle_max_deliver=3)
    t = BudgetTransport(None, js, topo, svc, settings)  # type: ignore[arg-type]
    early = EventMsg(topo.attempt_event_subject, delivered=2)
    await t._settle(early)  # type: ignore[arg-type]
    assert early.log == ["nak"] and js.published == []  # redelivered: nothing given up yet
    last = EventMsg(topo.attempt_event_subject, delivered=3)
    await t._settle(last)  # type: ignore[arg-type]
    assert last.log == ["ack"]
    assert [s for s, _ in js.published] == [topo.dead_letter_subject]
    assert "settlement failed 3 times" in js.published[0][1]["Llmlab-Reason"]
    dead = samples(svc.metrics, "t_budget_settle_dead_letters").get("t_budget_settle_dead_letters_total")
    assert dead == 1, dead
