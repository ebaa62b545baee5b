"""Rules more than one component must apply the same way, each defined once.

* **API keys** (:func:`hash_key`, :func:`key_matches`, :func:`key_id`): keys are stored and sent
  over NATS only as their SHA-256; the gateway, the budget service and both admin APIs compare
  with these.
* **Failed attempts** (:data:`FAILED_OUTCOMES`, :func:`counts_against_deployment`): which attempt
  outcomes are failures (accounting's status classes) and which count against a deployment (the
  router's health filter: not a queue timeout).
* **Budget refusals** (:func:`is_budget_refusal`): which errors mean "the budget said no". The
  budget service raises them; accounting classifies request events by them.
* **Charging** (:func:`charge_for`, :func:`resumed_usage`): what a request pays because of one
  attempt event. The budget settles reservations with it; accounting bills rows with it; the
  gateway reports a resumed stream's usage to the client with it.
* **Engine failures** (:func:`engine_failed`): which engine statuses mean the engine (not the
  request) failed: the worker retries them before the first token, the gateway resumes after it.
* **SLO semantics** (:func:`slo_verdict`): whether an answer met its SLO class. Accounting judges
  attempts, the engine twin judges replayed requests, the router's SLO filter judges estimates.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import NamedTuple

from llmlab_common.catalog import SloClass
from llmlab_common.codes import Code
from llmlab_common.messages import AttemptEvent, AttemptOutcome, ErrorInfo, Usage

# -- API keys ------------------------------------------------------------------------------------


def hash_key(api_key: str) -> str:
    """The only form in which a key is stored or crosses NATS. A fast hash is right here: keys are
    256-bit random, so there is nothing to brute-force, and every request pays for it."""
    return hashlib.sha256(api_key.encode()).hexdigest()


def key_matches(api_key: str, sha256_hex: str) -> bool:
    """Whether ``api_key`` is the key whose SHA-256 is ``sha256_hex`` (constant-time compare)."""
    return hmac.compare_digest(hash_key(api_key).encode(), sha256_hex.lower().encode())


def key_id(api_key: str) -> str:
    """A stable, non-secret id for logs and events: a short prefix of the key's hash."""
    return "key_" + hash_key(api_key)[:12]


# -- attempts ------------------------------------------------------------------------------------

# A deployment took (or was sent) the work and did not answer: its engine failed, its worker
# vanished, or nobody took the attempt / produced a first token in time. Not failures: cancelled
# (the client left), expired and stale (never generated: the request had already moved on).
FAILED_OUTCOMES: frozenset[AttemptOutcome] = frozenset({"engine_error", "worker_lost", "abandoned"})


def attempt_failed(outcome: AttemptOutcome) -> bool:
    return outcome in FAILED_OUTCOMES


# Engine answers that say the engine failed, not the request: no connection (0), or a 5xx that a
# healthy engine elsewhere would not give. A 4xx is the request's own fault and fails anywhere.
ENGINE_FAILURE_STATUSES: frozenset[int] = frozenset({0, 500, 502, 503, 504})


def engine_failed(status: int) -> bool:
    return status in ENGINE_FAILURE_STATUSES


def counts_against_deployment(ev: AttemptEvent) -> bool:
    """The router's health rule: a failed attempt counts against its deployment, except one that
    no worker took within the queue bound (the gateway's ``abandoned`` with code ``queue_timeout``).
    That deployment is busy, not failing: the client got a 429 with Retry-After, and the load shows
    in the workers' heartbeats. Counted, a burst of queue timeouts would mark a healthy deployment
    failing, the router would refuse every request to it (503) and, with nothing routed, no new
    attempt would clear the mark: an overload turned into an outage."""
    if not attempt_failed(ev.outcome):
        return False
    return not (ev.outcome == "abandoned" and ev.error is not None and ev.error.code == Code.QUEUE_TIMEOUT)


# -- budget refusals -----------------------------------------------------------------------------

# The budget's refusal codes besides the quota (type insufficient_quota): requests, tokens and
# concurrency per scope, and the per-request input cap.
BUDGET_REFUSAL_CODES: frozenset[str] = frozenset(
    {
        Code.INSUFFICIENT_QUOTA,
        Code.RATE_LIMIT_EXCEEDED,
        Code.TOKENS_PER_MINUTE_EXCEEDED,
        Code.CONCURRENCY_LIMIT_EXCEEDED,
        Code.INPUT_TOKENS_EXCEEDED,
    }
)


def is_budget_refusal(err: ErrorInfo) -> bool:
    return err.type == "insufficient_quota" or err.code in BUDGET_REFUSAL_CODES


# The budget service's answers that are no verdict on the caller but the service protecting itself:
# too many reserves pending (429 ``overloaded``, Retry-After). Neither a budget refusal (the tenant
# is within its limits) nor the gateway's own queue timeout (no worker was ever asked).
BUDGET_SHEDDING_CODES: frozenset[str] = frozenset({Code.OVERLOADED})


def is_budget_shedding(err: ErrorInfo) -> bool:
    return err.code in BUDGET_SHEDDING_CODES


# -- charging ------------------------------------------------------------------------------------


class Charge(NamedTuple):
    """What a request pays. ``input_tokens`` None: the reserved input estimate (the event does
    not carry the engine's count)."""

    input_tokens: int | None
    output_tokens: int


def resumed_usage(usage: Usage, resumed_tokens: int) -> Usage:
    """The usage of a request whose stream an attempt resumed, from that attempt's engine usage.
    Its engine processed the delivered text again as prompt: that part is input the request does
    not pay (the retry's overhead), and it is output the request does pay, once. Exact up to the
    engine re-tokenizing the delivered text (a token or two at a boundary)."""
    if resumed_tokens <= 0:
        return usage
    prompt = max(usage.prompt_tokens - resumed_tokens, 0) if usage.prompt_tokens > 0 else 0
    completion = usage.completion_tokens + resumed_tokens
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


def charge_for(ev: AttemptEvent) -> Charge | None:
    """The charging rule: a request pays once, for the attempt that answered (its input and output
    tokens as the engine counted them; for an attempt that resumed an interrupted stream, the
    request's view of them, :func:`resumed_usage`: the original input, and every token the
    client received); a request the client cancels pays its input (the reservation's estimate)
    plus the tokens delivered before it left (the gateway's ``cancelled``/``client_disconnected``
    event). Any other attempt event charges nothing (None): tokens burnt by failed attempts
    (retries, fallbacks, the interrupted attempt of a resumed stream) are the operator's cost,
    and a request that fails as a whole pays nothing."""
    if ev.outcome == "completed" and ev.usage is not None:
        u = resumed_usage(ev.usage, ev.resumed_tokens)
        return Charge(u.prompt_tokens if u.prompt_tokens > 0 else None, u.completion_tokens)
    if (
        ev.outcome == "cancelled"
        and ev.source == "gateway"
        and ev.error is not None
        and ev.error.code == Code.CLIENT_DISCONNECTED
    ):
        return Charge(None, ev.usage.completion_tokens if ev.usage is not None else 0)
    return None


# -- SLO semantics -------------------------------------------------------------------------------


class SloLimits(NamedTuple):
    """An SLO class's limits, per request. ``ttft_s`` is the class's ``ttft_p95_s`` applied to
    each request (a request over it misses, whatever the p95 of its neighbours)."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    queue_s: float | None = None

    @classmethod
    def of(cls, slo: SloClass) -> SloLimits:
        return cls(slo.ttft_p95_s, slo.tpot_s, slo.e2e_s, slo.queue_timeout_s)


class SloVerdict(NamedTuple):
    """Each limit's verdict (None: no limit, or no figure to judge) and whether the SLO was met."""

    ttft_ok: bool | None
    tpot_ok: bool | None
    e2e_ok: bool | None
    queue_ok: bool | None
    met: bool


def _within(value: float | None, limit: float | None) -> bool | None:
    return None if value is None or limit is None else value <= limit


def slo_verdict(
    limits: SloLimits,
    *,
    answered: bool,
    ttft_s: float | None,
    tpot_s: float | None,
    e2e_s: float | None,
    queue_s: float | None = None,
) -> SloVerdict:
    """Only an answered request can meet an SLO, and it meets it when no limit is exceeded: TTFT
    as the client sees it (queue wait included), time per output token, end to end, and the wait
    before an engine took it. A missing figure (a one-token answer has no TPOT) fails nothing."""
    ttft_ok = _within(ttft_s, limits.ttft_s)
    tpot_ok = _within(tpot_s, limits.tpot_s)
    e2e_ok = _within(e2e_s, limits.e2e_s)
    queue_ok = _within(queue_s, limits.queue_s)
    met = answered and ttft_ok is not False and tpot_ok is not False and e2e_ok is not False and queue_ok is not False
    return SloVerdict(ttft_ok, tpot_ok, e2e_ok, queue_ok, met)
