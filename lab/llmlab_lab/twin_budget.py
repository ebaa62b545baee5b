"""The budget rules in the engine twin's replay: every replayed request goes through the budget
service's own ledger (its Lua scripts on a real Redis), reserved when it arrives and settled when
it ends, each tenant of the trace on its catalog plan's limits. What comes out is what the twin
cannot say alone: the requests the budget would refuse (by reason), the ones whose ``max_tokens``
it would clamp, and the **overspend**, the tokens charged beyond any scope's daily or monthly limit
(and their list price). With the rules as shipped it is 0: a reservation covers the prompt and
the output allowance before anything runs, and the engine stops at the clamped ``max_tokens``; a
change to those rules that lets a tenant spend past its budget shows up here, in the twin gate.

Virtual time: the trace's seconds are laid on a fixed day (``EPOCH``), so windows, RPM and TPM
count as they would have. Each replay uses its own Redis key prefix and deletes it afterwards.
"""

from __future__ import annotations

import asyncio
import secrets
from collections import Counter
from collections.abc import Sequence
from typing import Any
from zoneinfo import ZoneInfo

from llmlab_budget.layout import Layout
from llmlab_budget.ledger import Ledger
from llmlab_budget.model import Identity, effective_limits
from llmlab_budget.windows import Windows
from llmlab_common.catalog import SCOPES, Catalog, LimitSet, ScopeName
from llmlab_twin.replay import OverspendHook
from llmlab_twin.sched import SeqState, TwinSeq
from redis.asyncio import Redis

EPOCH = 1_796_000_400.0  # a fixed midday (UTC): a one-day replay stays in one day window
UTC = ZoneInfo("UTC")
HOLD_S = 86_400.0  # a replayed request settles in the replay, never by the reaper


Overrides = dict[str, dict[ScopeName, LimitSet]]  # plan -> scope -> limits over the plan's


def budget_hook(
    catalog: Catalog, redis_url: str, output_usd_per_mtok: float, overrides: Overrides | None = None
) -> OverspendHook:
    """An overspend hook for :func:`llmlab_twin.replay.replay_trace` (synchronous: it runs its own
    loop). ``overrides``: per plan, limits that replace the plan's (as an admin sets them on a
    scope), e.g. daily budgets small enough to bind within a short trace."""

    def hook(seqs: Sequence[TwinSeq]) -> dict[str, Any]:
        return asyncio.run(replay_budget(seqs, catalog, redis_url, output_usd_per_mtok, overrides or {}))

    return hook


def parse_overrides(raw: dict[str, Any] | None) -> Overrides:
    return {
        plan: {scope: LimitSet.model_validate(v) for scope, v in scopes.items()} for plan, scopes in (raw or {}).items()
    }


def _identity(tenant: str) -> Identity:
    # One key per tenant of the trace (its tenants are plan names): the tightest case, where every
    # request of a plan counts against one user's, team's and tenant's limits.
    return Identity(
        tenant_id=f"ten_{tenant}",
        team_id=f"team_{tenant}",
        user_id=f"usr_{tenant}",
        key_id=f"key_{tenant}",
        plan=tenant,
    )


async def replay_budget(
    seqs: Sequence[TwinSeq], catalog: Catalog, redis_url: str, output_usd_per_mtok: float, overrides: Overrides
) -> dict[str, Any]:
    redis = Redis.from_url(redis_url)
    layout = Layout.for_namespace("twin-" + secrets.token_hex(4))
    ledger = Ledger(redis, layout, settled_ttl_s=3600)
    refused: Counter[str] = Counter()
    allowed: dict[str, int] = {}  # request id -> output allowance (the clamped max_tokens)
    clamped = charged = 0
    try:
        tenants = {s.tenant or "free" for s in seqs}
        unknown = sorted(t for t in tenants if t not in catalog.plans)
        if unknown:
            raise ValueError(f"trace tenants {unknown} are no catalog plan ({', '.join(catalog.plans)})")
        for tenant in tenants:
            await redis.hset(layout.key(f"key_{tenant}"), mapping={"revoked_at": ""})
        # Arrivals reserve, ends settle, in time order (an end before an arrival at the same instant).
        events: list[tuple[float, int, TwinSeq]] = [((s.arrival or 0.0), 1, s) for s in seqs]
        events += [(s.finished_at, 0, s) for s in seqs if s.state is SeqState.DONE and s.finished_at is not None]
        for at, kind, s in sorted(events, key=lambda e: (e[0], e[1])):
            now = EPOCH + at
            plan = catalog.plans[s.tenant or "free"]
            if kind == 1:
                r = await ledger.reserve(
                    s.id,
                    _identity(s.tenant or "free"),
                    effective_limits(plan.budget, overrides.get(s.tenant or "free", {})),
                    plan.budget,
                    input_tokens=s.prompt,
                    output_tokens=s.output,
                    tools_exempt=0,
                    now=now,
                    windows=Windows.at(now, UTC),
                    hold_s=HOLD_S,
                )
                if not r.ok:
                    refused[f"{r.status}:{r.scope}" if r.scope else r.status] += 1
                    continue
                allowed[s.id] = r.output_tokens
                clamped += r.output_tokens < s.output
            elif s.id in allowed:
                # The engine stops at the clamped max_tokens.
                out = min(s.generated, allowed.pop(s.id))
                closed = await ledger.close(s.id, "settled", input_tokens=s.prompt, output_tokens=out, now=now)
                charged += closed.charged
        for rid in allowed:  # never finished in the replay: released, nothing charged
            await ledger.close(rid, "released", now=EPOCH)
        over = 0
        w = Windows.at(EPOCH, UTC)
        for t in tenants:
            limits = effective_limits(catalog.plans[t].budget, overrides.get(t, {}))
            for scope, sid in _identity(t).scopes():
                day = await redis.hget(layout.day(scope, sid, w.day), "used")
                month = await redis.hget(layout.month(scope, sid, w.month), "used")
                lim = limits[scope]
                if lim.daily_tokens is not None:
                    over = max(over, int(day or 0) - lim.daily_tokens)
                if lim.monthly_tokens is not None:
                    over = max(over, int(month or 0) - lim.monthly_tokens)
        return {
            "overspend_usd": round(over * output_usd_per_mtok / 1e6, 6),
            "overspend_tokens": over,
            "requests": len(seqs),
            "refused": dict(sorted(refused.items())),
            "clamped": clamped,
            "charged_tokens": charged,
            "scopes": list(SCOPES),
            "rules": "the budget service's Lua ledger on Redis, the catalog plans' limits, one key per tenant",
        }
    finally:
        keys = [k async for k in redis.scan_iter(match=f"{layout.prefix}:*", count=1000)]
        if keys:
            await redis.delete(*keys)
        await redis.aclose()
