"""Budget windows at a given instant: the day and month (in the configured time zone) and the
UTC minute of the RPM/TPM counters. Computed here, passed to the Lua scripts as arguments, so
tests can move the clock without touching Redis time."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from zoneinfo import ZoneInfo


@dataclass(frozen=True, slots=True)
class Windows:
    day: str  # YYYY-MM-DD in the zone
    month: str  # YYYY-MM in the zone
    minute: int  # Unix minute (UTC; a minute is a minute in every zone)
    day_ends_at: float  # Unix time of the next local midnight
    month_ends_at: float
    minute_ends_at: float

    @classmethod
    def at(cls, now: float, tz: ZoneInfo) -> Windows:
        local = dt.datetime.fromtimestamp(now, tz)
        midnight = dt.datetime.combine(local.date() + dt.timedelta(days=1), dt.time(), tz)
        first = local.date().replace(day=1)
        next_first = (first + dt.timedelta(days=32)).replace(day=1)
        month_end = dt.datetime.combine(next_first, dt.time(), tz)
        minute = int(now // 60)
        return cls(
            day=local.strftime("%Y-%m-%d"),
            month=local.strftime("%Y-%m"),
            minute=minute,
            day_ends_at=midnight.timestamp(),
            month_ends_at=month_end.timestamp(),
            minute_ends_at=(minute + 1) * 60.0,
        )
