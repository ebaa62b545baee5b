"""Events → rows: attribution to deployment/pool/GPU, the charging rule, list-price cost inputs and
SLO verdicts. Imports neither NATS nor FastAPI nor ClickHouse.

The rules shared with other services come from :mod:`llmlab_common.rules`, never restated here:
the charging rule (:func:`~llmlab_common.rules.charge_for`, which the budget settles by), budget
refusals, failed outcomes and the SLO verdict. Tokens an engine processed for an attempt nobody
pays for are *burnt* (retry overhead).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypedDict, cast

from llmlab_common import rules
from llmlab_common.catalog import Catalog
from llmlab_common.codes import Code
from llmlab_common.messages import AttemptEvent, ErrorInfo, Heartbeat, RequestEvent

StatusClass = Literal[
    "ok",
    "cancelled",  # the client went away (or the gateway cancelled a retried attempt)
    "timeout",  # queue timeout, no first token in time, taken after its start deadline
    "server_error",  # engine error 5xx, worker lost
    "client_error",  # 4xx other than the ones below
    "refused_budget",  # the budget refused: quota, rate, concurrency or input-size limit
    "shed_budget",  # the budget service shed load (429 overloaded): no verdict on the tenant
    "shed_admission",  # the gateway refused at once: the predicted wait for a worker was over the bound
    "auth",  # 401/403
    "dropped",  # a redelivered attempt nobody waited for: no work done
]


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
    auth_s: float | None
    route_s: float | None
    dispatch_offset_s: float | None
    engine_queue_method: str | None
    parse_s: float | None
    prep_s: float | None
    first_dispatch_offset_s: float | None
    intake_s: float | None
    finish_s: float | None
    resumed_tokens: int  # a stream's continuation: output delivered before it, which it bills
    carried_tokens: int  # an interrupted attempt: output it delivered, which a later attempt bills
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


class HeartbeatRow(TypedDict):
    """One row of ``worker_heartbeats``."""

    worker_id: str
    pool: str
    engine: str
    deployment: str
    model: str
    gpu_usd_per_hour: float
    ready: int
    sent_at: float
    interval_s: float
    ingested_at: float


def error_class(err: ErrorInfo) -> StatusClass:
    if err.status in (401, 403) or err.code == Code.AUTHENTICATION_FAILURES:
        return "auth"
    if rules.is_budget_refusal(err):
        return "refused_budget"
    if rules.is_budget_shedding(err):
        return "shed_budget"
    if err.code == Code.QUEUE_WAIT_PREDICTED:
        return "shed_admission"
    if err.status in (408, 504) or err.code in (Code.QUEUE_TIMEOUT, Code.TIMEOUT):
        return "timeout"
    if err.status == 499:
        return "cancelled"
    if err.status == 429:
        return "timeout"  # the gateway's own 429 (budget 429s are classed above): a queue timeout
    if 400 <= err.status < 500:
        return "client_error"
    return "server_error"


def attempt_class(ev: AttemptEvent) -> StatusClass:
    """Answered, cancelled, never generated (expired: taken too late; stale: nobody waited), or
    failed (:data:`llmlab_common.rules.FAILED_OUTCOMES`): a failure is classed by the engine's
    error when it sent one, and nobody answering in time is a timeout."""
    if ev.outcome == "completed":
        return "ok"
    if ev.outcome == "cancelled":
        return "cancelled"
    if rules.attempt_failed(ev.outcome):
        if ev.error is not None and ev.error.status >= 400:
            return error_class(ev.error)
        return "timeout" if ev.outcome == "abandoned" else "server_error"
    return "dropped" if ev.outcome == "stale" else "timeout"


def _flag(ok: bool | None) -> int | None:
    return None if ok is None else int(ok)


@dataclass(frozen=True, slots=True)
class _Context:
    """What an attempt's row takes from the catalog: the same for every event of one (deployment,
    model, plan, SLO class), so it is computed once and cached (it is most of a row's cost)."""

    model: str
    pipeline: str
    engine: str
    gpu: str
    gpu_count: int
    input_usd_per_mtok: float
    output_usd_per_mtok: float
    cached_input_usd_per_mtok: float | None
    gpu_usd_per_hour: float
    price_as_of: str
    slo_class: str | None
    slo: rules.SloLimits | None


# Keyed by (catalog, deployment, model, plan, route's SLO class): catalogs are immutable and few
# per process.
_CONTEXTS: dict[tuple[int, str, str, str, str | None], _Context] = {}


def _context(catalog: Catalog, deployment: str, model: str, plan: str, route_slo: str | None) -> _Context:
    key = (id(catalog), deployment, model, plan, route_slo)
    hit = _CONTEXTS.get(key)
    if hit is not None:
        return hit
    dep = catalog.deployment(deployment)
    price = catalog.model_price(dep.model if dep else model)
    gpu = catalog.gpu_price(dep.gpu) if dep else None
    slo_name = route_slo
    if slo_name is None and plan in catalog.plans:
        slo_name = catalog.plans[plan].slo_class
    hit = _Context(
        model=dep.model if dep else model,
        pipeline=dep.pipeline if dep else "",
        engine=dep.engine if dep else "",
        gpu=dep.gpu if dep else "",
        gpu_count=dep.gpu_count if dep else 0,
        input_usd_per_mtok=price.input_per_mtok_usd if price else 0.0,
        output_usd_per_mtok=price.output_per_mtok_usd if price else 0.0,
        cached_input_usd_per_mtok=price.cached_input_per_mtok_usd if price else None,
        gpu_usd_per_hour=(gpu.usd_per_hour * dep.gpu_count) if gpu and dep else 0.0,
        price_as_of=str(price.as_of) if price else "",
        slo_class=slo_name,
        slo=rules.SloLimits.of(catalog.slo_classes[slo_name]) if slo_name in catalog.slo_classes else None,
    )
    if len(_CONTEXTS) >= 10_000:  # unknown names from malformed events must not grow it forever
        _CONTEXTS.clear()
    _CONTEXTS[key] = hit
    return hit


def _slo_verdicts(
    ev: AttemptEvent, slo: rules.SloLimits | None
) -> tuple[int | None, int | None, int | None, int | None]:
    """(ttft, tpot, e2e, all) against the attempt's SLO class (:func:`llmlab_common.rules.slo_verdict`);
    None where there is no limit or no figure to judge."""
    if slo is None:
        return None, None, None, None
    t = ev.timings
    v = rules.slo_verdict(
        slo,
        answered=ev.outcome == "completed",
        # Client-side TTFT: NATS queue wait + engine TTFT (engine queue and prefill).
        ttft_s=t.nats_queue_s + t.ttft_s if t is not None and t.ttft_s is not None else None,
        tpot_s=t.tpot_s if t is not None else None,
        e2e_s=ev.ended_at - ev.created_at,
        queue_s=t.nats_queue_s if t is not None else None,
    )
    return _flag(v.ttft_ok), _flag(v.tpot_ok), _flag(v.e2e_ok), int(v.met)


def attempt_columns(evs: Sequence[AttemptEvent], catalog: Catalog, now: float | None = None) -> dict[str, list[Any]]:
    """The ``attempts_raw`` rows of ``evs``, column by column, in the table's column order (the
    keys of :class:`AttemptRow`). The one definition of a row: built by column because ingest
    inserts columns (Arrow), and a list comprehension per column costs a third of a dict per
    row at 20k events/s."""
    us = [e.usage for e in evs]
    ts = [e.timings for e in evs]
    ps = [e.principal for e in evs]
    rs = [e.route for e in evs]
    errs = [e.error for e in evs]
    cs = [
        _context(catalog, e.deployment, e.model, p.plan, r.slo_class if r and r.slo_class else None)
        for e, p, r in zip(evs, ps, rs, strict=True)
    ]
    charges = [rules.charge_for(e) for e in evs]
    prompt = [u.prompt_tokens if u else 0 for u in us]
    completion = [u.completion_tokens if u else 0 for u in us]
    slo_ttft, slo_tpot, slo_e2e, slo_all = (
        map(list, zip(*(_slo_verdicts(e, c.slo) for e, c in zip(evs, cs, strict=True)), strict=True))
        if evs
        else ([], [], [], [])
    )
    ingested_at = time.time() if now is None else now
    return {
        "request_id": [e.request_id for e in evs],
        "attempt": [e.attempt for e in evs],
        "source": [e.source for e in evs],
        "outcome": [e.outcome for e in evs],
        "status_class": [attempt_class(e) for e in evs],
        "created_at": [e.created_at for e in evs],
        # Engine call start, when the worker timed the call.
        "started_at": [
            e.ended_at - t.e2e_s if t is not None and e.source == "worker" else None
            for e, t in zip(evs, ts, strict=True)
        ],
        "ended_at": [e.ended_at for e in evs],
        "tenant_id": [p.tenant_id for p in ps],
        "team_id": [p.team_id for p in ps],
        "user_id": [p.user_id for p in ps],
        "key_id": [p.key_id for p in ps],
        "plan": [p.plan for p in ps],
        "model": [c.model for c in cs],
        "deployment": [e.deployment for e in evs],
        "pool": [e.pool for e in evs],
        "pipeline": [c.pipeline for c in cs],
        "engine": [e.engine or c.engine for e, c in zip(evs, cs, strict=True)],
        "gpu": [c.gpu for c in cs],
        "gpu_count": [c.gpu_count for c in cs],
        "worker_id": [e.worker_id for e in evs],
        "endpoint": [e.endpoint for e in evs],
        "finish_reason": [e.finish_reason for e in evs],
        "error_status": [x.status if x else None for x in errs],
        "error_type": [x.type if x else None for x in errs],
        "error_code": [x.code if x else None for x in errs],
        "route_policy": [r.policy if r else None for r in rs],
        "route_reason": [r.reason if r else None for r in rs],
        "route_position": [r.position if r else None for r in rs],
        "fallback_from": [r.fallback_from if r else None for r in rs],
        "slo_class": [c.slo_class for c in cs],
        "prompt_hash": [r.prompt_hash if r else None for r in rs],
        "prompt_tokens": prompt,
        "cached_tokens": [u.cached_tokens if u else None for u in us],
        "completion_tokens": completion,
        # None: the budget charged the reserved input estimate, which the event does not carry
        # (the gateway's cancel event carries delivered tokens only).
        "billed_input_tokens": [c.input_tokens if c is not None else 0 for c in charges],
        "billed_output_tokens": [c.output_tokens if c is not None else 0 for c in charges],
        "is_billing": [int(c is not None) for c in charges],
        "nats_queue_s": [t.nats_queue_s if t else None for t in ts],
        "engine_queue_s": [t.engine_queue_s if t else None for t in ts],
        "ttft_s": [t.ttft_s if t else None for t in ts],
        "prefill_s": [t.prefill_s if t else None for t in ts],
        "decode_s": [t.decode_s if t else None for t in ts],
        "e2e_s": [t.e2e_s if t else None for t in ts],
        "itl_p50_s": [t.itl_p50_s if t else None for t in ts],
        "itl_p95_s": [t.itl_p95_s if t else None for t in ts],
        "tpot_s": [t.tpot_s if t else None for t in ts],
        "auth_s": [t.auth_s if t else None for t in ts],
        "route_s": [t.route_s if t else None for t in ts],
        "dispatch_offset_s": [t.dispatch_offset_s if t else None for t in ts],
        "engine_queue_method": [t.engine_queue_method if t else None for t in ts],
        "parse_s": [t.parse_s if t else None for t in ts],
        "prep_s": [t.prep_s if t else None for t in ts],
        "first_dispatch_offset_s": [t.first_dispatch_offset_s if t else None for t in ts],
        "intake_s": [t.intake_s if t else None for t in ts],
        "finish_s": [t.finish_s if t else None for t in ts],
        "resumed_tokens": [e.resumed_tokens for e in evs],
        "carried_tokens": [e.carried_tokens for e in evs],
        "input_usd_per_mtok": [c.input_usd_per_mtok for c in cs],
        "output_usd_per_mtok": [c.output_usd_per_mtok for c in cs],
        "cached_input_usd_per_mtok": [c.cached_input_usd_per_mtok for c in cs],
        "gpu_usd_per_hour": [c.gpu_usd_per_hour for c in cs],
        "price_as_of": [c.price_as_of for c in cs],
        "slo_ttft_ok": slo_ttft,
        "slo_tpot_ok": slo_tpot,
        "slo_e2e_ok": slo_e2e,
        "slo_ok": slo_all,
        "ingested_at": [ingested_at] * len(evs),
    }


def attempt_row(ev: AttemptEvent, catalog: Catalog, now: float | None = None) -> AttemptRow:
    """One event's row (see :func:`attempt_columns`)."""
    return cast(AttemptRow, {k: v[0] for k, v in attempt_columns([ev], catalog, now).items()})


def request_row(ev: RequestEvent, catalog: Catalog, now: float | None = None) -> RequestRow:
    p = ev.principal
    row: RequestRow = {
        "request_id": ev.request_id,
        "status": ev.status,
        "status_class": error_class(ev.error),
        "error_type": ev.error.type,
        "error_code": ev.error.code,
        "model": ev.model,
        "deployment": ev.deployment,
        "tenant_id": p.tenant_id if p else None,
        "team_id": p.team_id if p else None,
        "user_id": p.user_id if p else None,
        "key_id": p.key_id if p else None,
        "plan": p.plan if p else None,
        "attempts": ev.attempts,
        "created_at": ev.created_at,
        "ended_at": ev.ended_at,
        "ingested_at": time.time() if now is None else now,
    }
    return row


def heartbeat_row(hb: Heartbeat, catalog: Catalog, now: float | None = None) -> HeartbeatRow:
    """A worker's heartbeat with its deployment and GPU price: the catalog's first deployment in
    the worker's pool that serves one of its models (a worker drives one engine on that pool's
    GPUs)."""
    dep = next((d for d in catalog.deployments if d.pool == hb.pool and d.model in hb.models), None)
    ctx = _context(catalog, dep.id if dep else "", hb.models[0] if hb.models else "", "", None)
    return {
        "worker_id": hb.worker_id,
        "pool": hb.pool,
        "engine": hb.engine,
        "deployment": dep.id if dep else "",
        "model": ctx.model,
        "gpu_usd_per_hour": ctx.gpu_usd_per_hour,
        "ready": int(hb.ready),
        "sent_at": hb.sent_at,
        "interval_s": hb.interval_s,
        "ingested_at": time.time() if now is None else now,
    }
