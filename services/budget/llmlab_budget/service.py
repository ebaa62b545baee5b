"""Budget domain logic: authenticate and reserve, settle by the charging rule, reap.

Imports neither NATS nor FastAPI; Redis is behind :class:`Ledger` and :class:`DirectoryPort`.

Settlement applies the charging rule of :func:`llmlab_common.rules.charge_for` (one definition,
which accounting bills by too). Every attempt reuses the one reservation of its request.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol
from zoneinfo import ZoneInfo

from llmlab_common import rules
from llmlab_common.catalog import Catalog, LimitSet, PlanBudget, ScopeName
from llmlab_common.codes import Code
from llmlab_common.errors import (
    AuthenticationFailed,
    InsufficientQuota,
    InvalidRequest,
    LLMLabError,
    RateLimited,
)
from llmlab_common.expiring import ExpiringSet
from llmlab_common.messages import AttemptEvent, RequestEvent, ReserveReply, ReserveRequest

from llmlab_budget.metrics import BudgetMetrics
from llmlab_budget.model import REAP_BATCH, Closed, Identity, Reservation, effective_limits
from llmlab_budget.settings import BudgetSettings
from llmlab_budget.windows import Windows

log = logging.getLogger(__name__)


class LedgerPort(Protocol):
    """The Redis ledger (:class:`llmlab_budget.ledger.Ledger`): one atomic script per call."""

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
    ) -> Reservation: ...

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
    ) -> Closed: ...

    async def reap(self, limit: int = REAP_BATCH) -> list[str]: ...


class DirectoryPort(Protocol):
    async def identity_for_key_hash(self, sha256: str) -> Identity | None: ...

    async def overrides_for(self, identity: Identity) -> dict[ScopeName, LimitSet]: ...


@dataclass(frozen=True, slots=True)
class Resolved:
    identity: Identity
    limits: dict[ScopeName, LimitSet]
    policy: PlanBudget
    default_max_tokens: int
    expires: float


class BudgetService:
    def __init__(
        self,
        settings: BudgetSettings,
        catalog: Catalog,
        directory: DirectoryPort,
        ledger: LedgerPort,
        metrics: BudgetMetrics,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.catalog = catalog
        self.directory = directory
        self.ledger = ledger
        self.m = metrics
        self.clock = clock
        self.tz = ZoneInfo(settings.timezone)
        self._cache: dict[str, Resolved] = {}
        self._unknown = ExpiringSet(settings.unknown_key_cache_ttl_s, settings.unknown_key_cache_size)

    # -- authentication ------------------------------------------------------------------------
    async def resolve(self, key_sha256: str) -> Resolved | None:
        """Identity and effective limits of a key, cached ``identity_cache_ttl_s`` (the bound on
        how long a limit change takes to apply). An unknown key is remembered as unknown for
        ``unknown_key_cache_ttl_s`` (a bounded map, oldest dropped first)."""
        now = time.monotonic()
        hit = self._cache.get(key_sha256)
        if hit is not None and hit.expires > now:
            return hit
        if key_sha256 in self._unknown:
            self.m.unknown_key_cache_hits.inc()
            return None
        identity = await self.directory.identity_for_key_hash(key_sha256)
        if identity is None:
            self._cache.pop(key_sha256, None)
            self._unknown.add(key_sha256)
            return None
        plan = self.catalog.plans.get(identity.plan)
        if plan is None:
            log.error("key %s is on unknown plan %r", identity.key_id, identity.plan)
            return None
        overrides = await self.directory.overrides_for(identity)
        resolved = Resolved(
            identity,
            effective_limits(plan.budget, overrides),
            plan.budget,
            plan.default_max_tokens,
            now + self.settings.identity_cache_ttl_s,
        )
        if len(self._cache) > 100_000:
            self._cache.clear()  # crude bound: the cache is an optimisation, not state
        self._cache[key_sha256] = resolved
        return resolved

    # -- reserve -------------------------------------------------------------------------------
    async def reserve(self, req: ReserveRequest) -> ReserveReply:
        t0 = time.perf_counter()
        try:
            return await self._reserve(req)
        except LLMLabError as err:
            self.m.refusals.labels(err.code or err.type).inc()
            return ReserveReply(
                request_id=req.request_id,
                error=err.to_info(),
                retry_after_s=getattr(err, "retry_after_s", None),
            )
        finally:
            self.m.reserve_seconds.observe(time.perf_counter() - t0)

    async def _reserve(self, req: ReserveRequest) -> ReserveReply:
        resolved = await self.resolve(req.key_sha256)
        if resolved is None:
            raise AuthenticationFailed("Incorrect API key provided.")
        ident = resolved.identity
        if not req.reserve:
            if ident.revoked:
                raise AuthenticationFailed("This API key has been revoked.", code=Code.API_KEY_REVOKED)
            return ReserveReply(request_id=req.request_id, principal=ident.principal())
        policy = resolved.policy
        input_tokens = req.input_tokens + req.tool_tokens
        want = req.requested_max_tokens or resolved.default_max_tokens
        now = self.clock()
        windows = Windows.at(now, self.tz)
        r = await self.ledger.reserve(
            req.request_id,
            ident,
            resolved.limits,
            policy,
            input_tokens=input_tokens,
            output_tokens=want,
            tools_exempt=0 if policy.count_tools else req.tool_tokens,
            now=now,
            windows=windows,
            hold_s=self._hold_s(req, now),
        )
        if not r.ok:
            raise self._refusal(r, input_tokens, want, windows, now)
        if r.status == "ok":
            self.m.reservations.inc()
            self.m.reserved_tokens.inc(r.reserved_tokens)
        if r.output_tokens < want:
            log.info("max_tokens clamped from %d to %d by the budget", want, r.output_tokens)
        return ReserveReply(
            request_id=req.request_id,
            principal=ident.principal(),
            max_tokens=r.output_tokens,
            reserved_tokens=r.reserved_tokens,
        )

    def _hold_s(self, req: ReserveRequest, now: float) -> float:
        """How long the reservation may stay open: the gateway's timeout as a duration (its
        deadline is on its own clock, which this replica's need not match) plus the grace."""
        left = req.timeout_s if req.timeout_s > 0 else max(req.deadline - now, 0.0)
        return left + self.settings.reservation_grace_s

    @staticmethod
    def _refusal(r: Reservation, input_tokens: int, want: int, w: Windows, now: float) -> LLMLabError:
        who = f"{r.scope} limit" if r.scope else "limit"
        if r.status == "unknown_key":
            return AuthenticationFailed("Incorrect API key provided.")
        if r.status == "revoked":
            return AuthenticationFailed("This API key has been revoked.", code=Code.API_KEY_REVOKED)
        if r.status == "input_cap":
            return InvalidRequest(
                f"The prompt is about {input_tokens} tokens; the {who} allows {r.limit} input tokens per request.",
                code=Code.INPUT_TOKENS_EXCEEDED,
                param="messages",
            )
        if r.status == "concurrency":
            return RateLimited(
                f"Too many requests in flight: the {who} allows {r.limit} at once.",
                retry_after_s=1,
                code=Code.CONCURRENCY_LIMIT_EXCEEDED,
            )
        if r.status == "rpm":
            return RateLimited(
                f"Rate limit reached: the {who} allows {r.limit} requests per minute.",
                retry_after_s=w.minute_ends_at - now,
            )
        if r.status == "tpm":
            return RateLimited(
                f"Rate limit reached: the {who} allows {r.limit} tokens per minute; "
                f"{r.available} output tokens are left this minute for a {input_tokens}-token prompt.",
                retry_after_s=w.minute_ends_at - now,
                code=Code.TOKENS_PER_MINUTE_EXCEEDED,
            )
        ends = w.day_ends_at if r.window == "daily" else w.month_ends_at
        return InsufficientQuota(
            f"You exceeded your {r.window} token budget ({who}: {r.limit} tokens): "
            f"{r.available} output tokens are left for a {input_tokens}-token prompt "
            f"(requested max_tokens {want}).",
            retry_after_s=ends - now,
        )

    # -- settle --------------------------------------------------------------------------------
    async def settle_attempt(self, ev: AttemptEvent) -> Closed | None:
        """Apply the charging rule to one attempt's event; None when it does not end the request
        (a failed attempt, a retry or fallback: our cost, not the user's)."""
        charge = rules.charge_for(ev)
        if charge is None:
            return None
        # -1: the ledger charges the input the reservation estimated.
        inp = charge.input_tokens if charge.input_tokens is not None else -1
        return await self._close(ev.request_id, "settled", inp, charge.output_tokens, ev.ended_at, attempt=ev.attempt)

    async def settle_request(self, ev: RequestEvent) -> Closed:
        """A request that was refused or failed as a whole pays nothing. One the gateway gave up
        on while its reserve was on the way (budget_unavailable) may be released before that
        reserve runs: its release leaves a closed record, so the late reserve takes no slot."""
        gave_up = ev.error.code == Code.BUDGET_UNAVAILABLE
        return await self._close(ev.request_id, "released", 0, 0, ev.ended_at, tombstone=gave_up)

    async def _close(
        self,
        request_id: str,
        state: Literal["settled", "released"],
        inp: int,
        out: int,
        ended_at: float,
        tombstone: bool = False,
        attempt: int = 0,
    ) -> Closed:
        closed = await self.ledger.close(
            request_id,
            state,
            input_tokens=inp,
            output_tokens=out,
            now=self.clock(),
            tombstone=tombstone,
            attempt=attempt,
        )
        self.m.settlements.labels(closed.status if closed.status != "ok" else state).inc()
        if closed.status == "late" or (closed.status == "resettled" and closed.charged > 0):
            # Settled after its release (charged, nothing reserved), or a later attempt's larger charge.
            self.m.charged_tokens.inc(closed.charged)
        if closed.status == "ok":
            self.m.settle_lag.observe(max(0.0, time.time() - ended_at))
            self.m.charged_tokens.inc(closed.charged)
            if closed.reserved > 0 and state == "settled":
                self.m.reserved_vs_actual.observe(closed.charged / closed.reserved)
                if closed.charged > closed.reserved:
                    self.m.underreserved_tokens.inc(closed.charged - closed.reserved)
        return closed

    async def reap(self) -> list[str]:
        released: list[str] = []
        while True:
            ids = await self.ledger.reap(REAP_BATCH)
            released += ids
            if len(ids) < REAP_BATCH:  # a short batch: nothing more is due
                break
        if released:
            self.m.reaped.inc(len(released))
            log.warning("released %d expired reservations (requests that never settled)", len(released))
        return released
