"""The cross-service rules, each against expectations written out by hand (pure unit tests)."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from llmlab_common import rules
from llmlab_common.codes import Code
from llmlab_common.messages import AttemptEvent, ErrorInfo, Principal, Usage

pytestmark = pytest.mark.unit


def event(outcome: str, source: str = "worker", prompt: int = 10, completion: int = 20, **kw: Any) -> AttemptEvent:
    fields: dict[str, Any] = {
        "request_id": "r",
        "attempt": 1,
        "outcome": outcome,
        "source": source,
        "pool": "p",
        "deployment": "d",
        "model": "m",
        "endpoint": "chat",
        "principal": Principal(),
        "usage": Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion),
        "created_at": 0.0,
        "ended_at": 1.0,
    }
    return AttemptEvent(**(fields | kw))


def test_keys_are_compared_by_their_sha256_only() -> None:
    key = "sk-llm-example"
    digest = hashlib.sha256(key.encode()).hexdigest()
    assert rules.hash_key(key) == digest
    assert rules.key_matches(key, digest) and rules.key_matches(key, digest.upper())
    assert not rules.key_matches(key + "x", digest)
    assert rules.key_id(key) == "key_" + digest[:12]


def test_the_answering_attempt_pays_engine_counts_and_failures_pay_nothing() -> None:
    assert rules.charge_for(event("completed", prompt=100, completion=7)) == (100, 7)
    # No engine prompt count (0): the reservation's estimate is charged.
    assert rules.charge_for(event("completed", prompt=0, completion=7)) == (None, 7)
    for outcome in ("engine_error", "worker_lost", "abandoned", "expired", "stale"):
        assert rules.charge_for(event(outcome, source="gateway")) is None
    assert rules.charge_for(event("completed", usage=None)) is None


def test_a_resumed_stream_pays_its_input_once_and_every_delivered_token_once() -> None:
    # Attempt 1 delivered 30 tokens of a 100-token prompt and died; attempt 2 was given the prompt
    # plus those 30 tokens (130 as its engine counted) and generated 12 more.
    cont = event("completed", prompt=130, completion=12, resumed_tokens=30)
    assert rules.charge_for(cont) == (100, 42)
    u = rules.resumed_usage(Usage(prompt_tokens=130, completion_tokens=12, total_tokens=142), 30)
    assert (u.prompt_tokens, u.completion_tokens, u.total_tokens) == (100, 42, 142)
    # Not resumed: the engine's usage as it is; no engine prompt count stays "the estimate".
    plain = Usage(prompt_tokens=5, completion_tokens=2, total_tokens=7)
    assert rules.resumed_usage(plain, 0) is plain
    assert rules.charge_for(event("completed", prompt=0, completion=12, resumed_tokens=30)) == (None, 42)
    # The interrupted attempt pays nothing: its delivered tokens are the continuation's to bill.
    assert rules.charge_for(event("worker_lost", "gateway", completion=30, carried_tokens=30)) is None


def test_engine_failures_are_the_statuses_an_engine_elsewhere_would_not_give() -> None:
    assert all(rules.engine_failed(s) for s in (0, 500, 502, 503, 504))
    assert not any(rules.engine_failed(s) for s in (400, 404, 413, 422, 429))


def test_a_client_that_leaves_pays_its_estimated_input_and_what_it_received() -> None:
    gone = ErrorInfo(status=499, type="client", code=Code.CLIENT_DISCONNECTED, message="")
    assert rules.charge_for(event("cancelled", "gateway", prompt=0, completion=5, error=gone)) == (None, 5)
    # The worker's own cancellation (the gateway cancelled a retried attempt) is not the charge.
    assert rules.charge_for(event("cancelled", "worker", error=gone)) is None
    retry = ErrorInfo(status=499, type="client", code=Code.RETRY, message="")
    assert rules.charge_for(event("cancelled", "gateway", error=retry)) is None


def test_failed_outcomes_are_the_deployment_failures() -> None:
    assert {o for o in ("completed", "cancelled", "expired", "stale") if rules.attempt_failed(o)} == set()  # type: ignore[arg-type]
    assert all(rules.attempt_failed(o) for o in ("engine_error", "worker_lost", "abandoned"))


@pytest.mark.parametrize(
    ("status", "type_", "code", "refused"),
    [
        (429, "insufficient_quota", Code.INSUFFICIENT_QUOTA, True),
        (429, "rate_limit_error", Code.RATE_LIMIT_EXCEEDED, True),
        (429, "rate_limit_error", Code.TOKENS_PER_MINUTE_EXCEEDED, True),
        (429, "rate_limit_error", Code.CONCURRENCY_LIMIT_EXCEEDED, True),
        (400, "invalid_request_error", Code.INPUT_TOKENS_EXCEEDED, True),
        (429, "rate_limit_error", Code.QUEUE_TIMEOUT, False),  # the gateway's, not the budget's
        (429, "rate_limit_error", Code.OVERLOADED, False),  # the budget shedding load is no budget verdict
        (401, "authentication_error", Code.API_KEY_REVOKED, False),
    ],
)
def test_budget_refusals(status: int, type_: str, code: str, refused: bool) -> None:
    assert rules.is_budget_refusal(ErrorInfo(status=status, type=type_, code=code, message="")) is refused


@pytest.mark.parametrize(
    ("code", "shed"),
    [(Code.OVERLOADED, True), (Code.QUEUE_TIMEOUT, False), (Code.RATE_LIMIT_EXCEEDED, False), (None, False)],
)
def test_budget_shedding(code: str | None, shed: bool) -> None:
    err = ErrorInfo(status=429, type="rate_limit_error", code=code, message="")
    assert rules.is_budget_shedding(err) is shed


def test_slo_verdict() -> None:
    interactive = rules.SloLimits(ttft_s=1.0, tpot_s=0.1, queue_s=10.0)
    ok = rules.slo_verdict(interactive, answered=True, ttft_s=0.9, tpot_s=0.05, e2e_s=30.0, queue_s=0.2)
    assert ok == (True, True, None, True, True)
    slow = rules.slo_verdict(interactive, answered=True, ttft_s=1.2, tpot_s=0.05, e2e_s=3.0)
    assert slow.ttft_ok is False and not slow.met
    # A one-token answer has no TPOT: nothing fails on a missing figure.
    assert rules.slo_verdict(interactive, answered=True, ttft_s=0.5, tpot_s=None, e2e_s=0.5).met
    # An unanswered request never meets an SLO, however fast it failed.
    assert not rules.slo_verdict(interactive, answered=False, ttft_s=0.1, tpot_s=0.01, e2e_s=0.1).met
    waited = rules.slo_verdict(
        rules.SloLimits(e2e_s=60.0, queue_s=5.0), answered=True, ttft_s=None, tpot_s=None, e2e_s=9.0, queue_s=6.0
    )
    assert waited.queue_ok is False and not waited.met


def test_a_queue_timeout_is_a_failure_but_not_against_the_deployment() -> None:
    """Catches: queue timeouts (nobody took the attempt: the deployment is busy) counted against
    the deployment, which lets a burst mark a healthy deployment failing; and real failures
    (engine error, lost worker, no first token from a worker that took it) no longer counted."""
    queued = ErrorInfo(status=0, type="attempt", code=Code.QUEUE_TIMEOUT, message="queue wait exceeded")
    no_token = ErrorInfo(status=0, type="attempt", code="abandoned", message="no first token in time")
    timed_out = event("abandoned", "gateway", error=queued)
    assert rules.attempt_failed(timed_out.outcome) and not rules.counts_against_deployment(timed_out)
    assert rules.counts_against_deployment(event("abandoned", "gateway", error=no_token, worker_id="w1"))
    for outcome in ("engine_error", "worker_lost"):
        assert rules.counts_against_deployment(event(outcome))
    for outcome in ("completed", "cancelled", "expired", "stale"):
        assert not rules.counts_against_deployment(event(outcome))
