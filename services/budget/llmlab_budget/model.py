"""Budget domain types (no Redis, no NATS, no FastAPI)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from llmlab_common.catalog import SCOPES, LimitSet, PlanBudget, ScopeName
from llmlab_common.messages import Principal

API_KEY_PREFIX = "sk-llm-"
REAP_BATCH = 500  # reservations released per reap call (one Lua call, kept short)
# Characters of a key shown in listings (never enough to use it: 43 random chars follow).
DISPLAY_PREFIX_LEN = len(API_KEY_PREFIX) + 6


def new_api_key() -> str:
    return API_KEY_PREFIX + secrets.token_urlsafe(32)


def new_id(kind: str) -> str:
    """Opaque random ids (``team_9f3a…``): not guessable, safe in Redis keys and logs."""
    return f"{kind}_{secrets.token_hex(8)}"


@dataclass(frozen=True, slots=True)
class Identity:
    """Who an API key belongs to, resolved from the directory."""

    tenant_id: str
    team_id: str
    user_id: str
    key_id: str
    plan: str
    revoked: bool = False

    def scope_id(self, scope: ScopeName) -> str:
        return {"key": self.key_id, "user": self.user_id, "team": self.team_id, "tenant": self.tenant_id}[scope]

    def scopes(self) -> list[tuple[ScopeName, str]]:
        return [(s, self.scope_id(s)) for s in SCOPES]

    def principal(self) -> Principal:
        return Principal(
            tenant_id=self.tenant_id, team_id=self.team_id, user_id=self.user_id, key_id=self.key_id, plan=self.plan
        )


def effective_limits(plan: PlanBudget, overrides: dict[ScopeName, LimitSet]) -> dict[ScopeName, LimitSet]:
    """Per scope: the plan's defaults for that scope level, with the scope's own overrides."""
    return {s: plan.limits(s).merged(overrides.get(s, LimitSet())) for s in SCOPES}


@dataclass(frozen=True, slots=True)
class Reservation:
    """What the reserve script answered. ``status`` ``ok``/``dup`` carry the allowance; any other
    status is a refusal: ``reason`` in input_cap, concurrency, rpm, tpm, quota, revoked,
    unknown_key; ``scope`` and ``limit`` say which limit; ``window`` (daily/monthly) for quota."""

    status: str
    output_tokens: int = 0
    reserved_tokens: int = 0
    scope: str = ""
    limit: int = 0
    window: str = ""
    available: int = 0

    @property
    def ok(self) -> bool:
        return self.status in ("ok", "dup")


@dataclass(frozen=True, slots=True)
class Closed:
    """What settling or releasing a reservation did: ``ok`` (closed now), ``late`` (a settle
    after the reservation was released, by the reaper or a failure event: charged now),
    ``resettled`` (a later attempt's settle replaced the charge: ``charged`` is the difference),
    ``dup`` (already closed: nothing changed) or ``missing`` (no such reservation)."""

    status: str
    charged: int = 0
    reserved: int = 0
