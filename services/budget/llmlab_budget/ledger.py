"""Redis adapter for the ledgers: one Lua call per reserve, settle or reap (``lua/``). Reserves
made in the same event-loop turn (a gateway's batch, a burst) go to Redis as one pipeline, and so do
settles (a fetched batch of events)."""

from __future__ import annotations

import math
from importlib import resources
from typing import Any, Literal

from llmlab_common.catalog import LimitSet, PlanBudget, ScopeName
from llmlab_common.coalesce import Coalescer
from redis.asyncio import Redis
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError

from llmlab_budget.layout import Layout
from llmlab_budget.model import REAP_BATCH, Closed, Identity, Reservation
from llmlab_budget.windows import Windows

DAY_TTL_S = 40 * 86400
MONTH_TTL_S = 400 * 86400
MINUTE_TTL_S = 180


def _lua(name: str) -> str:
    return resources.files("llmlab_budget").joinpath("lua", name).read_text()


def _limit(v: int | None) -> int:
    return -1 if v is None else v


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class Ledger:
    def __init__(self, redis: Redis, layout: Layout, settled_ttl_s: int) -> None:
        self.redis = redis
        self.layout = layout
        self.settled_ttl_s = settled_ttl_s
        common = _lua("common.lua")
        self._reserve = redis.register_script(_lua("reserve.lua"))
        self._settle = redis.register_script(common + "\n" + _lua("settle.lua"))
        self._reap = redis.register_script(common + "\n" + _lua("reap.lua"))
        self._reserves: Coalescer[tuple[list[str], list[Any]], Any] = Coalescer(
            lambda calls: self._run_many(self._reserve, calls), max_batch=256
        )
        self._settles: Coalescer[tuple[list[str], list[Any]], Any] = Coalescer(
            lambda calls: self._run_many(self._settle, calls), max_batch=256
        )

    async def _run_many(self, script: AsyncScript, calls: list[tuple[list[str], list[Any]]]) -> list[Any]:
        """Run the script once per call in one round trip. Each script is atomic on its own, as
        with separate calls; nothing else about them changes. A call's Redis error is its own."""
        if len(calls) == 1:
            keys, args = calls[0]
            return [await script(keys=keys, args=args)]
        async with self.redis.pipeline(transaction=False) as pipe:
            for keys, args in calls:
                pipe.evalsha(script.sha, len(keys), *keys, *args)
            results: list[Any] = await pipe.execute(raise_on_error=False)
        for i, r in enumerate(results):
            if isinstance(r, NoScriptError):  # a restarted or flushed Redis: load it and retry that one
                keys, args = calls[i]
                results[i] = await script(keys=keys, args=args)
        return results

    async def reserve(
        self,
        request_id: str,
        identity: Identity,
        limits: dict[ScopeName, LimitSet],
        policy: PlanBudget,
        *,
        input_tokens: int,
        output_tokens: int,
        tools_exempt: int,
        now: float,
        windows: Windows,
        hold_s: float,
    ) -> Reservation:
        """``hold_s``: how long the reservation may stay open before the reaper releases it,
        counted on Redis's clock (the expiry is Redis TIME + hold_s)."""
        argv: list[Any] = [
            request_id,
            repr(now),
            repr(hold_s),
            windows.day,
            windows.month,
            windows.minute,
            input_tokens,
            output_tokens,
            policy.reserve_tokens,
            policy.min_output_tokens,
            policy.on_short,
            tools_exempt,
            DAY_TTL_S,
            MONTH_TTL_S,
            MINUTE_TTL_S,
            max(60, math.ceil(hold_s)) + self.settled_ttl_s,
        ]
        for scope, scope_id in identity.scopes():
            lim = limits[scope]
            argv += [
                self.layout.usage(scope, scope_id),
                _limit(lim.daily_tokens),
                _limit(lim.monthly_tokens),
                _limit(lim.max_input_tokens),
                _limit(lim.max_output_tokens),
                _limit(lim.rpm),
                _limit(lim.tpm),
                _limit(lim.max_concurrent),
                scope,
            ]
        keys = [
            self.layout.reservation(request_id),
            self.layout.reservation_expiry,
            self.layout.key(identity.key_id),
        ]
        r = await self._reserves.submit((keys, argv))
        status = _s(r[0])
        if status in ("ok", "dup"):
            return Reservation(status, int(r[1]), int(r[2]))
        detail = _s(r[3]) if len(r) > 3 else ""
        window, _, available = detail.partition(":")
        return Reservation(
            status, scope=_s(r[1]), limit=int(r[2]), window=window, available=int(available) if available else 0
        )

    async def close(
        self,
        request_id: str,
        state: Literal["settled", "released"],
        *,
        input_tokens: int = -1,
        output_tokens: int = 0,
        now: float,
        tombstone: bool = False,
        attempt: int = 0,
    ) -> Closed:
        """Settle (charge the given tokens, -1 input = the reserved estimate) or release (charge
        nothing). Idempotent: only the first close of a reservation changes anything (a settle
        after a release is charged once, ``late``), except a settle of a later ``attempt`` of the
        request, whose charge replaces the earlier one (``resettled``; ``charged`` is then the
        difference). ``tombstone``: a release that finds no reservation leaves a closed record, so
        a reserve arriving after it takes nothing."""
        r = await self._settles.submit(
            (
                [self.layout.reservation(request_id), self.layout.reservation_expiry],
                [
                    request_id,
                    state,
                    input_tokens,
                    output_tokens,
                    repr(now),
                    self.settled_ttl_s,
                    int(tombstone),
                    attempt,
                ],
            )
        )
        return Closed(_s(r[0]), int(r[1]), int(r[2]))

    async def reap(self, limit: int = REAP_BATCH) -> list[str]:
        """Release reservations past their expiry (by Redis's clock); returns their request ids."""
        ids = await self._reap(
            keys=[self.layout.reservation_expiry],
            args=[limit, self.layout.reservation(""), self.settled_ttl_s],
        )
        return [_s(i) for i in ids]

    async def reservation(self, request_id: str) -> dict[str, str]:
        raw = await self.redis.hgetall(self.layout.reservation(request_id))
        return {_s(k): _s(v) for k, v in raw.items()}
