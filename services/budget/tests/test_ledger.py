"""The Lua ledger against real Redis: reserve/settle/release/reap, every limit, idempotence."""

from __future__ import annotations

import asyncio
import datetime as dt
from zoneinfo import ZoneInfo

import pytest
from llmlab_budget.layout import Layout
from llmlab_budget.ledger import Ledger
from llmlab_budget.model import Identity
from llmlab_budget.windows import Windows
from llmlab_common.catalog import SCOPES, LimitSet, PlanBudget
from redis.asyncio import Redis

pytestmark = pytest.mark.integration

NOW = dt.datetime(2026, 12, 2, 12, 0, 30, tzinfo=dt.UTC).timestamp()
UTC = ZoneInfo("UTC")
IDENT = Identity(tenant_id="ten_a", team_id="team_a", user_id="usr_a", key_id="key_a", plan="pro")


def limits(**user: int | None) -> dict:
    return {s: LimitSet(**user) if s == "user" else LimitSet() for s in SCOPES}


async def setup(redis: Redis, layout: Layout) -> Ledger:
    await redis.hset(layout.key(IDENT.key_id), mapping={"revoked_at": ""})
    return Ledger(redis, layout, settled_ttl_s=3600)


async def reserve(
    ledger: Ledger, rid: str, lim: dict, *, inp: int = 100, out: int = 500, now: float = NOW, hold: float = 60, **pol
):
    return await ledger.reserve(
        rid,
        IDENT,
        lim,
        PlanBudget(**pol),
        input_tokens=inp,
        output_tokens=out,
        tools_exempt=0,
        now=now,
        windows=Windows.at(now, UTC),
        hold_s=hold,
    )


async def day_used(redis: Redis, layout: Layout, scope: str = "user", sid: str = "usr_a", now: float = NOW):
    h = await redis.hgetall(layout.day(scope, sid, Windows.at(now, UTC).day))  # type: ignore[arg-type]
    return {k.decode(): int(v) for k, v in h.items()}


async def test_reserve_settle_charges_actual_and_releases_rest(redis_layout):
    redis, layout = redis_layout
    ledger = await setup(redis, layout)
    r = await reserve(ledger, "r1", limits(daily_tokens=10_000), reserve_tokens=0)
    assert (r.status, r.output_tokens, r.reserved_tokens) == ("ok", 500, 600)
    assert await day_used(redis, layout) == {"reserved": 600}
    for scope in SCOPES:  # every scope carries the reservation, limited or not
        assert (await day_used(redis, layout, scope, IDENT.scope_id(scope)))["reserved"] == 600
    w = Windows.at(NOW, UTC)
    # Window keys expire on their own (40 days, 400 days, 3 minutes); the concurrency counter does not.
    assert 39 * 86400 < await redis.ttl(layout.day("user", "usr_a", w.day)) <= 40 * 86400
    assert 399 * 86400 < await redis.ttl(layout.month("user", "usr_a", w.month)) <= 400 * 86400
    assert 0 < await redis.ttl(layout.minute("user", "usr_a", w.minute)) <= 180
    closed = await ledger.close("r1", "settled", input_tokens=90, output_tokens=40, now=NOW)
    assert (closed.status, closed.charged, closed.reserved) == ("ok", 130, 600)
    assert await day_used(redis, layout) == {"reserved": 0, "used": 130}
    assert int(await redis.get(layout.concurrent("user", "usr_a"))) == 0


async def test_settlement_is_idempotent(redis_layout):
    redis, layout = redis_layout
    ledger = await setup(redis, layout)
    await reserve(ledger, "r1", limits(daily_tokens=10_000))
    results = [await ledger.close("r1", "settled", input_tokens=100, output_tokens=50, now=NOW) for _ in range(3)]
    assert [c.status for c in results] == ["ok", "dup", "dup"]
    assert await day_used(redis, layout) == {"reserved": 0, "used": 150}
    # A release after the settlement changes nothing either.
    assert (await ledger.close("r1", "released", now=NOW)).status == "dup"
    assert await day_used(redis, layout) == {"reserved": 0, "used": 150}


async def test_a_later_attempt_s_charge_replaces_an_earlier_one_in_either_order(redis_layout):
    """Catches: a request charged twice, or for the wrong attempt, when an attempt the gateway gave
    up (its worker cut off by a NATS outage, say) still completed and reported while a later
    attempt answered the client: the request pays for its highest billing attempt, whichever
    event settles first; and the same attempt's event again changes nothing."""
    redis, layout = redis_layout
    ledger = await setup(redis, layout)
    await reserve(ledger, "r1", limits(daily_tokens=10_000))
    first = await ledger.close("r1", "settled", input_tokens=10, output_tokens=40, now=NOW, attempt=1)
    assert (first.status, first.charged) == ("ok", 50)
    later = await ledger.close("r1", "settled", input_tokens=10, output_tokens=30, now=NOW, attempt=2)
    assert (later.status, later.charged) == ("resettled", -10)
    assert await day_used(redis, layout) == {"reserved": 0, "used": 40}
    for attempt in (2, 1):  # the same attempt again, or the earlier one late: nothing changes
        again = await ledger.close("r1", "settled", input_tokens=10, output_tokens=40, now=NOW, attempt=attempt)
        assert again.status == "dup"
    assert await day_used(redis, layout) == {"reserved": 0, "used": 40}
    # The later attempt's event first: the earlier one's, arriving after, charges nothing.
    await reserve(ledger, "r2", limits(daily_tokens=10_000))
    assert (await ledger.close("r2", "settled", input_tokens=10, output_tokens=30, now=NOW, attempt=2)).status == "ok"
    assert (await ledger.close("r2", "settled", input_tokens=10, output_tokens=40, now=NOW, attempt=1)).status == "dup"
    assert await day_used(redis, layout) == {"reserved": 0, "used": 80}


async def test_reserve_is_idempotent_per_request_id(redis_layout):
    redis, layout = redis_layout
    ledger = await setup(redis, layout)
    a = await reserve(ledger, "r1", limits(daily_tokens=10_000))
    b = await reserve(ledger, "r1", limits(daily_tokens=10_000))
    assert (a.status, b.status, b.output_tokens) == ("ok", "dup", a.output_tokens)
    assert (await day_used(redis, layout))["reserved"] == a.reserved_tokens


async def test_output_clamped_to_budget_then_refused_below_minimum(redis_layout):
    redis, layout = redis_layout
    ledger = await setup(redis, layout)
    lim = limits(daily_tokens=1000)
    # 1000 - 100 input - 256 margin = 644 < 700 wanted: clamped.
    r = await reserve(ledger, "r1", lim, out=700)
    assert (r.status, r.output_tokens) == ("ok", 644)
    # Now 744 reserved: 1000 - 744 - 100 - 256 < 0: refused, quota on the user's daily budget.
    r2 = await reserve(ledger, "r2", lim, out=700)
    assert (r2.status, r2.scope, r2.window, r2.limit, r2.available) == ("quota", "user", "daily", 1000, 0)
    # Releasing r1 frees the room again.
    await ledger.close("r1", "released", now=NOW)
    assert (await reserve(ledger, "r3", lim, out=700)).output_tokens == 644


async def test_refuse_mode_and_min_output(redis_layout):
    redis, layout = redis_layout
    ledger = await setup(redis, layout)
    lim = limits(daily_tokens=1000)
    r = await reserve(ledger, "r1", lim, out=700, on_short="refuse")
    assert r.status == "quota"
    r = await reserve(ledger, "r2", lim, inp=900, out=700, reserve_tokens=0, min_output_tokens=101)
    assert (r.status, r.available) == ("quota", 100)
    r = await reserve(ledger, "r3", lim, inp=900, out=700, reserve_tokens=0, min_output_tokens=100)
    assert (r.status, r.output_tokens) == ("ok", 100)


async def test_tightest_scope_and_window_wins(redis_layout):
    redis, layout = redis_layout
    ledger = await setup(redis, layout)
    lim = {s: LimitSet() for s in SCOPES}
    lim["user"] = LimitSet(daily_tokens=5000, monthly_tokens=2000)
    lim["team"] = LimitSet(daily_tokens=1500)
    r = await reserve(ledger, "r1", lim, out=5000, reserve_tokens=0)
    assert r.output_tokens == 1400  # team daily 1500 - 100
    r = await reserve(ledger, "r2", lim, out=5000, reserve_tokens=0)
    assert (r.status, r.scope, r.window) == ("quota", "team", "daily")


async def test_per_request_caps(redis_layout):
    redis, layout = redis_layout
    ledger = await setup(redis, layout)
    lim = {s: LimitSet() for s in SCOPES}
    lim["key"] = LimitSet(max_input_tokens=50)
    assert (await reserve(ledger, "r1", lim)).status == "input_cap"
    lim["key"] = LimitSet(max_output_tokens=64)
    r = await reserve(ledger, "r2", lim, out=500)
    assert (r.status, r.output_tokens) == ("ok", 64)


async def test_concurrency_rpm_tpm(redis_layout):
    redis, layout = redis_layout
    ledger = await setup(redis, layout)
    r = [await reserve(ledger, f"c{i}", limits(max_concurrent=2)) for i in range(3)]
    assert [x.status for x in r] == ["ok", "ok", "concurrency"]
    await ledger.close("c0", "settled", input_tokens=1, output_tokens=1, now=NOW)
    assert (await reserve(ledger, "c3", limits(max_concurrent=2))).status == "ok"

    r = [await reserve(ledger, f"m{i}", limits(rpm=5)) for i in range(3)]
    # c0, c1 and c3 count this minute (the refused c2 does not): two more fit under 5.
    assert [x.status for x in r] == ["ok", "ok", "rpm"]
    # The next minute has a fresh RPM window.
    assert (await reserve(ledger, "m9", limits(rpm=5), now=NOW + 60)).status == "ok"


async def test_tpm_counts_actual_after_settle(redis_layout):
    redis, layout = redis_layout
    ledger = await setup(redis, layout)
    lim = limits(tpm=2000)
    r1 = await reserve(ledger, "t1", lim, out=1500, reserve_tokens=0)
    assert r1.output_tokens == 1500
    # 2000 - 1600 reserved - 100 input leaves 300: clamped, or refused when 500 is the minimum.
    assert (await reserve(ledger, "t2", lim, out=1500, reserve_tokens=0, min_output_tokens=500)).status == "tpm"
    assert (await reserve(ledger, "t2", lim, out=1500, reserve_tokens=0)).output_tokens == 300
    await ledger.close("t2", "released", now=NOW)
    await ledger.close("t1", "settled", input_tokens=100, output_tokens=100, now=NOW)
    r3 = await reserve(ledger, "t3", lim, out=1500, reserve_tokens=0)
    assert (r3.status, r3.output_tokens) == ("ok", 1500)  # 2000 - 200 used - 100 input = 1700 >= 1500


async def test_reaper_releases_expired(redis_layout):
    redis, layout = redis_layout
    ledger = await setup(redis, layout)
    await reserve(ledger, "r1", limits(daily_tokens=10_000), hold=60)
    assert await ledger.reap() == []
    sec, usec = await redis.time()  # the expiry is on Redis's clock, whatever the caller's `now`
    expires_at = float((await ledger.reservation("r1"))["expires_at"])
    assert sec + usec / 1e6 + 59 < expires_at <= sec + usec / 1e6 + 60
    await reserve(ledger, "r2", limits(daily_tokens=10_000), hold=0)
    assert await ledger.reap() == ["r2"]
    await ledger.close("r1", "released", now=NOW)
    assert await day_used(redis, layout) == {"reserved": 0, "used": 0}


async def test_a_settle_after_the_release_still_charges_once(redis_layout):
    """Catches: a charge lost because its event came late (dd4f538: a settle after the reaper
    released the reservation, or after the request's failure event closed it first, charged
    nothing), and a late charge applied twice."""
    redis, layout = redis_layout
    ledger = await setup(redis, layout)
    await reserve(ledger, "r1", limits(daily_tokens=10_000), hold=0)
    assert await ledger.reap() == ["r1"]
    late = await ledger.close("r1", "settled", input_tokens=5, output_tokens=7, now=NOW + 70)
    assert (late.status, late.charged) == ("late", 12)
    assert await day_used(redis, layout) == {"reserved": 0, "used": 12}
    assert (await ledger.close("r1", "settled", input_tokens=5, output_tokens=7, now=NOW + 71)).status == "dup"
    assert await day_used(redis, layout) == {"reserved": 0, "used": 12}
    # Order does not decide the bill: the failure event first, then the attempt's charge.
    await reserve(ledger, "r2", limits(daily_tokens=10_000))
    assert (await ledger.close("r2", "released", now=NOW)).status == "ok"
    assert (await ledger.close("r2", "settled", input_tokens=3, output_tokens=4, now=NOW)).status == "late"
    assert await day_used(redis, layout) == {"reserved": 0, "used": 19}
    # A release after the charge changes nothing.
    assert (await ledger.close("r2", "released", now=NOW)).status == "dup"
    assert await day_used(redis, layout) == {"reserved": 0, "used": 19}


async def test_revoked_and_unknown_key(redis_layout):
    redis, layout = redis_layout
    ledger = await setup(redis, layout)
    await redis.hset(layout.key(IDENT.key_id), "revoked_at", "2026-12-02T00:00:00Z")
    assert (await reserve(ledger, "r1", limits())).status == "revoked"
    await redis.delete(layout.key(IDENT.key_id))
    assert (await reserve(ledger, "r2", limits())).status == "unknown_key"


async def test_window_rolls_over_at_configured_midnight(redis_layout):
    redis, layout = redis_layout
    ledger = await setup(redis, layout)
    seoul = ZoneInfo("Asia/Seoul")
    before = dt.datetime(2026, 12, 2, 23, 59, 50, tzinfo=seoul).timestamp()
    after = before + 20
    lim = limits(daily_tokens=1000)

    async def res(rid: str, now: float):
        return await ledger.reserve(
            rid, IDENT, lim, PlanBudget(reserve_tokens=0), input_tokens=100, output_tokens=900,
            tools_exempt=0, now=now, windows=Windows.at(now, seoul), hold_s=60,
        )  # fmt: skip

    assert (await res("a", before)).output_tokens == 900
    assert (await res("b", before + 5)).status == "quota"
    # 00:00:10 in Seoul is 15:00:10 UTC the same day: a new day in the configured zone only.
    assert Windows.at(after, seoul).day == "2026-12-03" and Windows.at(after, UTC).day == "2026-12-02"
    assert (await res("c", after)).output_tokens == 900


async def test_concurrent_reserves_never_overcommit(redis_layout):
    redis, layout = redis_layout
    ledger = await setup(redis, layout)
    lim = limits(daily_tokens=10_000)
    rs = await asyncio.gather(
        *(reserve(ledger, f"x{i}", lim, inp=50, out=200, reserve_tokens=0, min_output_tokens=200) for i in range(200))
    )
    ok = [r for r in rs if r.status == "ok"]
    assert len(ok) == 40  # 10_000 / 250 exactly
    assert (await day_used(redis, layout))["reserved"] == 10_000


async def test_a_reserve_that_arrives_after_its_release_takes_no_slot(redis_layout):
    """Catches: a reserve answered after the gateway gave up waiting for it (2 s) holding a
    concurrency slot until the reaper (~10 minutes, dd4f538): the gateway's 503 releases the
    request first, and that release must leave a record the late reserve finds."""
    redis, layout = redis_layout
    ledger = await setup(redis, layout)
    lim = limits(max_concurrent=1)
    # Without the tombstone (a refusal before any reserve), nothing is written.
    assert (await ledger.close("r0", "released", now=NOW)).status == "missing"
    assert await redis.exists(layout.reservation("r0")) == 0
    assert (await ledger.close("r1", "released", now=NOW, tombstone=True)).status == "missing"
    late = await reserve(ledger, "r1", lim)
    assert late.status == "dup"
    # The slot is free: another request of the same key gets it.
    assert (await reserve(ledger, "r2", lim)).status == "ok"
    assert (await reserve(ledger, "r3", lim)).status == "concurrency"
    # A late settle of the tombstoned request changes nothing (nothing was served).
    assert (await ledger.close("r1", "settled", input_tokens=5, output_tokens=5, now=NOW)).status == "dup"
