"""BudgetService (the domain rules) on a real Redis: refusal shapes, the charging rule, tools
policy and the injectable clock."""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
from pathlib import Path

import pytest
from llmlab_budget.directory import Directory
from llmlab_budget.ledger import Ledger
from llmlab_budget.metrics import BudgetMetrics
from llmlab_budget.service import BudgetService
from llmlab_budget.settings import BudgetSettings
from llmlab_common.catalog import load_catalog
from llmlab_common.messages import AttemptEvent, ErrorInfo, Principal, RequestEvent, ReserveRequest, Usage
from llmlab_common.metrics import Metrics

pytestmark = pytest.mark.integration
CATALOG = load_catalog(Path(__file__).resolve().parents[3] / "configs" / "catalog.yaml")
NOON = dt.datetime(2026, 12, 2, 12, 0, 10, tzinfo=dt.UTC).timestamp()


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def setup(redis_layout, plan: str = "pro", **limits: int):
    redis, layout = redis_layout
    directory = Directory(redis, layout, CATALOG)
    clock = Clock(NOON)
    svc = BudgetService(
        BudgetSettings(identity_cache_ttl_s=0),
        CATALOG,
        directory,
        Ledger(redis, layout, 3600),
        BudgetMetrics(Metrics("test")),
        clock=clock,
    )
    t = await directory.create_tenant("t", plan)
    team = await directory.create_team(t.id, "team")
    user = await directory.create_user(team.id, "u")
    key, plaintext = await directory.create_key(user.id, "k")
    if limits:
        await directory.set_overrides("key", key.id, limits)
    return svc, clock, directory, key, hashlib.sha256(plaintext.encode()).hexdigest()


def req(sha: str, rid: str = "r1", **kw) -> ReserveRequest:
    return ReserveRequest(request_id=rid, key_sha256=sha, input_tokens=kw.pop("input_tokens", 10), deadline=NOON, **kw)


def attempt(rid: str, outcome: str, source: str = "worker", usage: Usage | None = None, code: str | None = None):
    return AttemptEvent(
        request_id=rid, attempt=1, outcome=outcome, source=source, pool="p", deployment="d", model="m",  # type: ignore[arg-type]
        endpoint="chat", principal=Principal(), usage=usage, created_at=NOON, ended_at=NOON,
        error=ErrorInfo(status=499, type="client", code=code, message="x") if code else None,
    )  # fmt: skip


async def test_unknown_and_revoked_keys_are_401(redis_layout) -> None:
    svc, _, directory, key, sha = await setup(redis_layout)
    r = await svc.reserve(req("0" * 64))
    assert r.error is not None and (r.error.status, r.error.code) == (401, "invalid_api_key")
    await directory.revoke_key(key.id)
    r = await svc.reserve(req(sha))
    assert r.error is not None and (r.error.status, r.error.code) == (401, "api_key_revoked")
    r = await svc.reserve(req(sha, reserve=False))  # listing models with a revoked key
    assert r.error is not None and r.error.code == "api_key_revoked"


async def test_default_max_tokens_from_plan_and_principal(redis_layout) -> None:
    svc, _, _, key, sha = await setup(redis_layout, "free")
    r = await svc.reserve(req(sha))
    assert r.error is None and r.max_tokens == CATALOG.plans["free"].default_max_tokens
    assert r.principal is not None and (r.principal.key_id, r.principal.plan) == (key.id, "free")


async def test_quota_refusal_has_retry_after_to_the_configured_midnight(redis_layout) -> None:
    svc, _, _, _, sha = await setup(redis_layout, daily_tokens=100)
    r = await svc.reserve(req(sha))
    assert r.error is not None
    assert (r.error.status, r.error.type, r.error.code) == (429, "insufficient_quota", "insufficient_quota")
    assert "daily token budget" in r.error.message
    assert r.retry_after_s == pytest.approx(12 * 3600 - 10)
    assert r.retry_after_s is not None


async def test_tpm_and_input_cap_refusals(redis_layout) -> None:
    svc, _, _, _, sha = await setup(redis_layout, tpm=270, max_input_tokens=50)  # 270 - 10 - 256 < 16
    r = await svc.reserve(req(sha, input_tokens=60))
    assert r.error is not None and (r.error.status, r.error.code) == (400, "input_tokens_exceeded")
    r = await svc.reserve(req(sha, "r2", requested_max_tokens=20))
    assert r.error is not None and (r.error.status, r.error.code) == (429, "tokens_per_minute_exceeded")
    assert r.retry_after_s == pytest.approx(50)  # to the next minute


async def test_charging_rule(redis_layout) -> None:
    svc, _, _, _, sha = await setup(redis_layout)
    for rid in ("done", "cancel", "failed", "retry"):
        assert (await svc.reserve(req(sha, rid, requested_max_tokens=100))).error is None
    # Completed: the engine's counts.
    c = await svc.settle_attempt(attempt("done", "completed", usage=Usage(prompt_tokens=7, completion_tokens=30)))
    assert c is not None and c.charged == 37
    # A worker's cancelled attempt (a retry, a gateway abort) does not end the request...
    assert await svc.settle_attempt(attempt("cancel", "cancelled", usage=Usage(completion_tokens=3))) is None
    # ...the gateway's client_disconnected does: estimated input (10) + delivered (4).
    c = await svc.settle_attempt(
        attempt("cancel", "cancelled", "gateway", Usage(completion_tokens=4), "client_disconnected")
    )
    assert c is not None and c.charged == 14
    # Failed entirely: nothing.
    ev = RequestEvent(
        request_id="failed", status=502, error=ErrorInfo(status=502, type="server_error", message="x"),
        created_at=NOON, ended_at=NOON,
    )  # fmt: skip
    assert (await svc.settle_request(ev)).charged == 0
    # A failed attempt burns tokens that are not charged; the answering one is.
    assert await svc.settle_attempt(attempt("retry", "engine_error", usage=Usage(completion_tokens=9))) is None
    c = await svc.settle_attempt(attempt("retry", "completed", usage=Usage(prompt_tokens=7, completion_tokens=5)))
    assert c is not None and c.charged == 12


async def test_tool_tokens_not_charged_when_the_plan_says_so(redis_layout, monkeypatch) -> None:
    svc, _, _, _, sha = await setup(redis_layout)
    policy = CATALOG.plans["pro"].budget.model_copy(update={"count_tools": False})
    plans = {**CATALOG.plans, "pro": CATALOG.plans["pro"].model_copy(update={"budget": policy})}
    monkeypatch.setattr(svc, "catalog", CATALOG.model_copy(update={"plans": plans}))
    r = await svc.reserve(req(sha, tool_tokens=40, requested_max_tokens=10))
    assert r.reserved_tokens == 10 + 40 + 10  # reserved: tools may still be sent to the engine
    c = await svc.settle_attempt(attempt("r1", "completed", usage=Usage(prompt_tokens=55, completion_tokens=10)))
    assert c is not None and c.charged == 55 - 40 + 10


class CountingDirectory:
    """The real directory, counting the hot-path lookups that reach Redis."""

    def __init__(self, inner: Directory) -> None:
        self.inner, self.lookups = inner, 0

    async def identity_for_key_hash(self, sha256: str):  # type: ignore[no-untyped-def]
        self.lookups += 1
        return await self.inner.identity_for_key_hash(sha256)

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self.inner, name)


async def test_an_unknown_key_is_remembered_briefly_and_the_memory_is_bounded(redis_layout, monkeypatch) -> None:
    """Catches: every request with a bad key costing a Redis round trip (dd4f538 never cached
    unknown keys, so one client hammering a wrong key competed with real users for the pool), a
    negative entry that never expires (a key created later refused for good), and an unbounded map."""
    redis, layout = redis_layout
    svc, _, directory, _key, sha = await setup(redis_layout)
    counting = CountingDirectory(directory)
    now = [1000.0]
    monkeypatch.setattr("llmlab_budget.service.time.monotonic", lambda: now[0])
    svc = BudgetService(
        BudgetSettings(identity_cache_ttl_s=0, unknown_key_cache_ttl_s=2.0, unknown_key_cache_size=3),
        CATALOG,
        counting,  # type: ignore[arg-type]
        Ledger(redis, layout, 3600),
        BudgetMetrics(Metrics("test")),
        clock=Clock(NOON),
    )
    bad = "f" * 64
    for _ in range(5):
        r = await svc.reserve(req(bad))
        assert r.error is not None and r.error.code == "invalid_api_key"
    assert counting.lookups == 1
    now[0] += 2.5  # past the TTL: asked again
    await svc.reserve(req(bad))
    assert counting.lookups == 2
    # Bounded: three more unknown keys push the first out (size 3), so it is looked up again.
    for other in ("a" * 64, "b" * 64, "c" * 64):
        await svc.reserve(req(other))
    assert counting.lookups == 5
    await svc.reserve(req(bad))
    assert counting.lookups == 6
    # A known key is never answered from the negative map.
    assert (await svc.reserve(req(sha, rid="ok"))).error is None


async def test_the_gateways_give_up_on_a_slow_reserve_frees_the_slot_it_would_take(redis_layout) -> None:
    """The gateway answers 503 budget_unavailable after its reserve timeout and records the
    request's event; settled before the slow reserve runs, it must leave nothing to hold."""
    svc, _, _, _, sha = await setup(redis_layout, max_concurrent=1)
    gave_up = RequestEvent(
        request_id="slow", status=503, error=ErrorInfo(status=503, type="server_error", code="budget_unavailable",
        message="x"), model="m", principal=Principal(), created_at=NOON, ended_at=NOON,
    )  # fmt: skip
    assert (await svc.settle_request(gave_up)).status == "missing"
    await svc.reserve(req(sha, rid="slow"))  # the late reserve: a duplicate of a closed request
    assert (await svc.reserve(req(sha, rid="next"))).error is None  # the one slot is free


async def test_expiry_is_on_one_clock_whatever_the_replicas_and_gateways_clocks_say(redis_layout) -> None:
    """Catches: the reaper comparing the gateway's deadline with each budget replica's wall clock
    (dd4f538). Here replica A's clock is days behind, replica B's an hour ahead, and the
    gateway's deadline is on a clock days behind: B must not release A's live reservation, and a
    reservation must still expire when its timeout (a duration) has passed on Redis's clock."""
    svc_a, _, directory, _, sha = await setup(redis_layout)
    redis, layout = redis_layout
    wall = float((await redis.time())[0])

    def replica(clock: float, grace_s: float) -> BudgetService:
        return BudgetService(
            BudgetSettings(identity_cache_ttl_s=0, reservation_grace_s=grace_s), CATALOG, directory,
            Ledger(redis, layout, 3600), BudgetMetrics(Metrics("test")), clock=Clock(clock),
        )  # fmt: skip

    svc_b = replica(wall + 3600, 30)
    # The gateway's clock is an hour behind replica A's: its deadline (60 s away by its clock)
    # is already past by A's, so only the duration says how long the reservation lives.
    behind = req(sha, rid="live", timeout_s=60).model_copy(update={"deadline": NOON - 3600 + 60})
    assert (await svc_a.reserve(behind)).error is None
    sec, usec = await redis.time()
    expires_at = float((await svc_a.ledger.reservation("live"))["expires_at"])  # type: ignore[attr-defined]
    assert sec + usec / 1e6 + 89 < expires_at <= sec + usec / 1e6 + 90  # 60 s timeout + 30 s grace
    assert await svc_b.reap() == []
    assert (await svc_a.ledger.reservation("live"))["state"] == "reserved"  # type: ignore[attr-defined]
    svc_short = replica(NOON, 0)  # a replica days behind, no grace
    assert (await svc_short.reserve(req(sha, rid="short", timeout_s=0.05))).error is None
    await asyncio.sleep(0.2)
    assert await svc_short.reap() == ["short"]
    assert (await svc_a.ledger.reservation("live"))["state"] == "reserved"  # type: ignore[attr-defined]
