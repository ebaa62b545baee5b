"""The per-request latency split (llmlab_accounting.latency), from hand-made attempt rows whose
phases are chosen so each expected figure is a plain subtraction."""

from __future__ import annotations

from typing import Any

import pytest
from llmlab_accounting.latency import split

pytestmark = pytest.mark.unit


def _row(**kw: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "attempt": 1,
        "source": "worker",
        "outcome": "completed",
        "error_code": None,
        "worker_id": "w1",
        "deployment": "llama-8b-vllm",
        "wall_s": 0.645,  # ended_at - created_at: measured apart from the phases
        "parse_s": 0.001,
        "auth_s": 0.010,
        "route_s": 0.004,
        "prep_s": 0.002,
        "first_dispatch_offset_s": 0.017,
        "dispatch_offset_s": 0.017,
        "nats_queue_s": 0.030,
        "intake_s": 0.003,
        "engine_queue_s": 0.050,
        "engine_queue_method": "engine",
        "ttft_s": 0.080,  # 50 queue + 30 prefill
        "prefill_s": 0.030,
        "decode_s": 0.500,
        "finish_s": 0.007,
        "completion_tokens": 26,
    }
    return row | kw


def _phases(s: Any) -> dict[str, float | None]:
    return {p.name: p.seconds for p in s.phases}


def test_one_attempt_splits_into_measured_phases_and_an_independent_total() -> None:
    """Catches: a phase taken from another column, or computed from the total (the total is the
    row's own wall-clock span, never a sum of phases)."""
    s = split("r1", [_row()])
    assert s is not None
    assert _phases(s) == pytest.approx(
        {
            "gateway: parse + validate": 0.001,
            "gateway: auth + reserve": 0.010,
            "gateway: route": 0.004,
            "gateway: build + publish": 0.002,
            "NATS queue": 0.030,
            "worker intake": 0.003,
            "engine queue": 0.050,
            "prefill": 0.030,
            "decode": 0.500,
            "worker: terminal message": 0.007,
        }
    )
    assert s.total_s == 0.645 and s.accounted_s == pytest.approx(0.637) and not s.unmeasured
    # A stamp missing from the row is shown as unmeasured, not as zero, and the sum falls short.
    gap = split("r1", [_row(intake_s=None)])
    assert gap is not None and gap.unmeasured == ["worker intake"] and gap.accounted_s == pytest.approx(0.634)


def test_a_fallback_shows_the_earlier_attempts_as_retry_time() -> None:
    """Catches: the time lost on a failed first attempt attributed to admission or hidden."""
    rows = [
        _row(attempt=2, dispatch_offset_s=5.019, worker_id="w2"),
        _row(attempt=1, outcome="abandoned", source="gateway", error_code="queue_timeout"),
    ]
    s = split("r1", rows)
    assert s is not None and s.answering_attempt == 2 and s.attempts == 2
    assert _phases(s)["retries (earlier attempts)"] == pytest.approx(5.002)  # 5.019 - 0.017
    assert s.earlier == ["attempt 1: abandoned (queue_timeout) on llama-8b-vllm/w1"]


def test_an_unknown_engine_queue_is_not_reported_as_zero() -> None:
    """Catches: an engine that does not report queue time shown as 0 ms queue and all prefill
    presented as measured."""
    s = split("r1", [_row(engine_queue_s=None, engine_queue_method=None, prefill_s=None)])
    assert s is not None
    got = _phases(s)
    assert got["engine queue"] is None
    assert got["prefill"] == pytest.approx(0.080)  # the whole first-token time, said so in its note
    assert "not known" in next(p.note for p in s.phases if p.name == "prefill")


def test_no_rows_is_none() -> None:
    assert split("r1", []) is None
