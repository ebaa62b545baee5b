"""Events → rows: attribution to deployment/pool/GPU, the charging rule, list-price cost inputs and
SLO verdicts. Imports neither NATS nor FastAPI nor ClickHouse.

Charging rule (the budget's, ``llmlab_budget.service.BudgetService.settle_attempt``; it is a method
over the Redis ledger, so it is restated here, not imported): a request pays once, for the attempt
that answered (input and output tokens as the engine counted them); failed attempts (retries,
fallbacks) are not charged; a request the client cancels pays its input plus the tokens delivered
(the gateway's ``cancelled``/``client_disconnected`` event); a refused or failed request pays
nothing. Tokens an engine processed for an attempt nobody pays for are *burnt* (retry overhead).
"""

from __future__ import annotations

import time
from typing import Literal, TypedDict

from llmlab_common.catalog import Catalog, Deployment, GpuPrice, ModelPrice
from llmlab_common.messages import AttemptEvent, ErrorInfo, RequestEvent

StatusClass = Literal[
    "ok",
    "cancelled",  # the client went away (or the gateway cancelled a retried attempt)
    "timeout",  # queue timeout, no first token in time, taken after its start deadline
    "server_error",  # engine error 5xx, worker lost
    "client_error",  # 4xx other than the ones below
    "refused_budget",  # the budget refused: quota, rate, concurrency or input-size limit
    "auth",  # 401/403
    "dropped",  # a redelivered attempt nobody waited for: no work done
]

# Budget refusals: insufficient_quota, and the budget's 429/400 codes (llmlab_budget.service._refusal).
_BUDGET_CODES = frozenset(
    {"rate_limit_exceeded", "tokens_per_minute_exceeded", "concurrency_limit_exceeded", "input_tokens_exceeded"}
)


class AttemptRow(TypedDict):
    """One row of ``attempts_raw``; the keys are the table's columns. A TypedDict, not a pydantic
    model: rows are built from validated events at ingest rate, where model construction alone
    would cost more than everything else per event."""

    request_id: str
    attempt: int
    source: str
    outcome: str
    status_class: str
    created_at: float
    started_at: float | None  # engine call start (ended_at - e2e), when the worker timed it
    ended_at: float
    tenant_id: str
    team_id: str
    user_id: str
    key_id: str
    plan: str
    model: str
    deployment: str
    pool: str
    pipeline: str
    engine: str
    gpu: str
    gpu_count: int
    worker_id: str | None
    endpoint: str
    finish_reason: str | None
    error_status: int | None
    error_type: str | None
    error_code: str | None
    route_policy: str | None
    route_reason: str | None
    route_position: int | None
    fallback_from: str | None
    slo_class: str | None
    prompt_hash: str | None
    prompt_tokens: int
    cached_tokens: int | None
    completion_tokens: int
    billed_input_tokens: int | None  # None: the budget charged its reserved estimate (unknown here)
    billed_output_tokens: int
    is_billing: int  # 1 when this event is the one the budget charges
    nats_queue_s: float | None
    engine_queue_s: float | None
    ttft_s: float | None
    prefill_s: float | None
    decode_s: float | None
    e2e_s: float | None
    itl_p50_s: float | None
    itl_p95_s: float | None
    tpot_s: float | None
    input_usd_per_mtok: float
    output_usd_per_mtok: float
    cached_input_usd_per_mtok: float | None
    gpu_usd_per_hour: float  # the deployment's GPU price × gpu_count
    price_as_of: str
    slo_ttft_ok: int | None
    slo_tpot_ok: int | None
    slo_e2e_ok: int | None
    slo_ok: int | None
    ingested_at: float


class RequestRow(TypedDict):
    """One row of ``requests_raw``: a request refused or failed as a whole."""

    request_id: str
    status: int
    status_class: str
    error_type: str
    error_code: str | None
    model: str | None
    deployment: str | None
    tenant_id: str | None
    team_id: str | None
    user_id: str | None
    key_id: str | None
    plan: str | None
    attempts: int
    created_at: float
    ended_at: float
    ingested_at: float


def error_class(err: ErrorInfo) -> StatusClass:
    if err.status in (401, 403):
        return "auth"
    if err.type == "insufficient_quota" or err.code in _BUDGET_CODES:
        return "refused_budget"
    if err.status in (408, 504) or err.code in ("queue_timeout", "timeout"):
        return "timeout"
    if err.status == 499:
        return "cancelled"
    if err.status == 429:
        return "timeout"  # the gateway's own 429 is a queue timeout
    if 400 <= err.status < 500:
        return "client_error"
    return "server_error"


def attempt_class(ev: AttemptEvent) -> StatusClass:
    match ev.outcome:
        case "completed":
            return "ok"
        case "cancelled":
            return "cancelled"
        case "expired" | "abandoned":
            return "timeout"
        case "stale":
            return "dropped"
        case "worker_lost":
            return "server_error"
        case "engine_error":
            return error_class(ev.error) if ev.error is not None and ev.error.status >= 400 else "server_error"
    return "server_error"


def is_billing(ev: AttemptEvent) -> bool:
    """Whether the budget charges this event (mirrors ``BudgetService.settle_attempt``)."""
    if ev.outcome == "completed" and ev.usage is not None:
        return True
    return (
        ev.outcome == "cancelled"
        and ev.source == "gateway"
        and ev.error is not None
        and ev.error.code == "client_disconnected"
    )


def _ok(value: float | None, limit: float | None) -> int | None:
    if limit is None or value is None:
        return None
    return int(value <= limit)


_Lookup = tuple[Deployment | None, ModelPrice | None, GpuPrice | None]
# Catalog lookups per (catalog, deployment, model): catalogs are immutable and few per process.
_LOOKUPS: dict[tuple[int, str, str], _Lookup] = {}


def _lookup(catalog: Catalog, deployment: str, model: str) -> _Lookup:
    key = (id(catalog), deployment, model)
    hit = _LOOKUPS.get(key)
    if hit is None:
        dep = catalog.deployment(deployment)
        price = catalog.model_price(dep.model if dep else model)
        gpu = catalog.gpu_price(dep.gpu) if dep else None
        hit = _LOOKUPS[key] = (dep, price, gpu)
        if len(_LOOKUPS) > 10_000:  # unknown names from malformed events must not grow it forever
            _LOOKUPS.clear()
    return hit


def attempt_row(ev: AttemptEvent, catalog: Catalog, now: float | None = None) -> AttemptRow:
    dep, price, gpu = _lookup(catalog, ev.deployment, ev.model)
    usage, t, p = ev.usage, ev.timings, ev.principal
    billing = is_billing(ev)
    prompt = usage.prompt_tokens if usage else 0
    completion = usage.completion_tokens if usage else 0
    billed_in: int | None = 0
    billed_out = 0
    if billing:
        # The gateway's cancel event carries delivered tokens only; the budget charged the
        # reserved input estimate, which the event does not carry.
        billed_in = prompt if prompt > 0 else None
        billed_out = completion
    route = ev.route
    slo_name = route.slo_class if route and route.slo_class else None
    if slo_name is None and p.plan in catalog.plans:
        slo_name = catalog.plans[p.plan].slo_class
    slo = catalog.slo_classes.get(slo_name) if slo_name else None
    ttft_ok = tpot_ok = e2e_ok = slo_ok = None
    if slo is not None:
        # Client-side TTFT: NATS queue wait + engine TTFT (engine queue and prefill).
        client_ttft = t.nats_queue_s + t.ttft_s if t is not None and t.ttft_s is not None else None
        ttft_ok = _ok(client_ttft, slo.ttft_p95_s)
        tpot_ok = _ok(t.tpot_s if t else None, slo.tpot_s)
        e2e_ok = _ok(ev.ended_at - ev.created_at, slo.e2e_s)
        verdicts = [v for v in (ttft_ok, tpot_ok, e2e_ok) if v is not None]
        # Only an answered attempt can meet an SLO; a missing figure does not fail it.
        slo_ok = int(ev.outcome == "completed" and all(verdicts))
    return AttemptRow(
        request_id=ev.request_id,
        attempt=ev.attempt,
        source=ev.source,
        outcome=ev.outcome,
        status_class=attempt_class(ev),
        created_at=ev.created_at,
        started_at=ev.ended_at - t.e2e_s if t is not None and ev.source == "worker" else None,
        ended_at=ev.ended_at,
        tenant_id=p.tenant_id,
        team_id=p.team_id,
        user_id=p.user_id,
        key_id=p.key_id,
        plan=p.plan,
        model=dep.model if dep else ev.model,
        deployment=ev.deployment,
        pool=ev.pool,
        pipeline=dep.pipeline if dep else "",
        engine=ev.engine or (dep.engine if dep else ""),
        gpu=dep.gpu if dep else "",
        gpu_count=dep.gpu_count if dep else 0,
        worker_id=ev.worker_id,
        endpoint=ev.endpoint,
        finish_reason=ev.finish_reason,
        error_status=ev.error.status if ev.error else None,
        error_type=ev.error.type if ev.error else None,
        error_code=ev.error.code if ev.error else None,
        route_policy=route.policy if route else None,
        route_reason=route.reason if route else None,
        route_position=route.position if route else None,
        fallback_from=route.fallback_from if route else None,
        slo_class=slo_name,
        prompt_hash=route.prompt_hash if route else None,
        prompt_tokens=prompt,
        cached_tokens=usage.cached_tokens if usage else None,
        completion_tokens=completion,
        billed_input_tokens=billed_in,
        billed_output_tokens=billed_out,
        is_billing=int(billing),
        nats_queue_s=t.nats_queue_s if t else None,
        engine_queue_s=t.engine_queue_s if t else None,
        ttft_s=t.ttft_s if t else None,
        prefill_s=t.prefill_s if t else None,
        decode_s=t.decode_s if t else None,
        e2e_s=t.e2e_s if t else None,
        itl_p50_s=t.itl_p50_s if t else None,
        itl_p95_s=t.itl_p95_s if t else None,
        tpot_s=t.tpot_s if t else None,
        input_usd_per_mtok=price.input_per_mtok_usd if price else 0.0,
        output_usd_per_mtok=price.output_per_mtok_usd if price else 0.0,
        cached_input_usd_per_mtok=price.cached_input_per_mtok_usd if price else None,
        gpu_usd_per_hour=(gpu.usd_per_hour * dep.gpu_count) if gpu and dep else 0.0,
        price_as_of=str(price.as_of) if price else "",
        slo_ttft_ok=ttft_ok,
        slo_tpot_ok=tpot_ok,
        slo_e2e_ok=e2e_ok,
        slo_ok=slo_ok,
        ingested_at=time.time() if now is None else now,
    )


def request_row(ev: RequestEvent, catalog: Catalog, now: float | None = None) -> RequestRow:
    p = ev.principal
    return RequestRow(
        request_id=ev.request_id,
        status=ev.status,
        status_class=error_class(ev.error),
        error_type=ev.error.type,
        error_code=ev.error.code,
        model=ev.model,
        deployment=ev.deployment,
        tenant_id=p.tenant_id if p else None,
        team_id=p.team_id if p else None,
        user_id=p.user_id if p else None,
        key_id=p.key_id if p else None,
        plan=p.plan if p else None,
        attempts=ev.attempts,
        created_at=ev.created_at,
        ended_at=ev.ended_at,
        ingested_at=time.time() if now is None else now,
    )
