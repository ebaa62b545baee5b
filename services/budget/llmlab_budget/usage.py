"""Read-only view of a scope's ledgers (written only by the reserve/settle scripts).

One MULTI/EXEC round trip, so ``used`` and ``reserved`` come from one instant: a settle moving
tokens from reserved to used between two reads would otherwise be counted twice or not at all.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from llmlab_common.catalog import LimitSet, ScopeName
from redis.asyncio import Redis

from llmlab_budget.layout import Layout
from llmlab_budget.windows import Windows


def _num(value: Any) -> int:
    """A ledger counter; absent = 0. The scripts write integers, but a counter touched by
    HINCRBYFLOAT reads as "12.0", hence the float step."""
    if value is None or value == b"" or value == "":
        return 0
    text = value.decode() if isinstance(value, bytes) else str(value)
    try:
        return int(text)
    except ValueError:
        return int(float(text))


def _iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat().replace("+00:00", "Z")


def _budget(window: str, ends_at: float, used: int, reserved: int, limit: int | None) -> dict[str, Any]:
    return {
        "window": window,
        "ends_at": _iso(ends_at),
        "used": used,
        "reserved": reserved,
        "limit": limit,
        "remaining": None if limit is None else max(0, limit - used - reserved),
    }


async def read_usage(
    redis: Redis, layout: Layout, scope: ScopeName, scope_id: str, limits: LimitSet, windows: Windows
) -> dict[str, Any]:
    """Usage of one scope in the current day, month and minute, against ``limits`` (the scope's
    effective limits; None = unlimited). Times are ISO 8601 in UTC."""
    async with redis.pipeline(transaction=True) as p:
        p.hmget(layout.day(scope, scope_id, windows.day), ["used", "reserved"])
        p.hmget(layout.month(scope, scope_id, windows.month), ["used", "reserved"])
        p.hmget(layout.minute(scope, scope_id, windows.minute), ["req", "tok"])
        p.get(layout.concurrent(scope, scope_id))
        day, month, minute, conc = await p.execute()
    return {
        "scope": scope,
        "scope_id": scope_id,
        "day": _budget(windows.day, windows.day_ends_at, _num(day[0]), _num(day[1]), limits.daily_tokens),
        "month": _budget(windows.month, windows.month_ends_at, _num(month[0]), _num(month[1]), limits.monthly_tokens),
        "minute": {
            "window": windows.minute,
            "ends_at": _iso(windows.minute_ends_at),
            "requests": _num(minute[0]),
            "tokens": _num(minute[1]),
            "rpm_limit": limits.rpm,
            "tpm_limit": limits.tpm,
        },
        "concurrent": {"current": _num(conc), "limit": limits.max_concurrent},
    }
