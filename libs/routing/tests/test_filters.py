"""One test per filter plug-in (verdicts on hand-made deployments)."""

from __future__ import annotations

import pytest
from llmlab_routing.plugins import FILTERS
from llmlab_testkit.routing import dep, inputs, worker

pytestmark = pytest.mark.unit


def check(name: str, d, **kw):  # type: ignore[no-untyped-def]
    return FILTERS[name].check(inputs([d], **kw), d)


def test_healthy_needs_a_live_worker_and_no_failing_streak() -> None:
    assert check("healthy", dep("a")) is None
    assert "no live worker" in check("healthy", dep("a", workers=[]))
    assert "failing" in check("healthy", dep("a", failure_rate=0.75, failure_samples=4))
    assert check("healthy", dep("a", failure_rate=1.0, failure_samples=3)) is None  # too few to judge


def test_context_counts_prompt_plus_output() -> None:
    assert check("context", dep("a", max_context=200), prompt_tokens=100, max_output_tokens=100) is None
    assert "201" in check("context", dep("a", max_context=200), prompt_tokens=101, max_output_tokens=100)


def test_tools_only_matter_when_the_request_has_tools() -> None:
    assert check("tools", dep("a", supports_tools=False)) is None
    assert check("tools", dep("a", supports_tools=False), needs_tools=True) is not None
    assert FILTERS["tools"].soft


def test_quality_floor_is_hard() -> None:
    assert check("quality-floor", dep("a", quality=0.5), quality_floor=0.5) is None
    assert check("quality-floor", dep("a", quality=0.49), quality_floor=0.5) is not None
    assert not FILTERS["quality-floor"].soft


def test_cost_cap_uses_the_whole_output_allowance() -> None:
    d = dep("a", input_usd_per_mtok=1.0, output_usd_per_mtok=2.0)
    # 1000 in x $1/M + 1000 out x $2/M = $0.003
    assert check("cost-cap", d, prompt_tokens=1000, max_output_tokens=1000, cost_cap_usd=0.003) is None
    assert check("cost-cap", d, prompt_tokens=1000, max_output_tokens=1001, cost_cap_usd=0.003) is not None


def test_difficulty_is_soft_and_uses_the_class_floor() -> None:
    assert check("difficulty", dep("a", quality=0.5), difficulty_floor=0.6, difficulty_class="hard") is not None
    assert check("difficulty", dep("a", quality=0.6), difficulty_floor=0.6) is None
    assert FILTERS["difficulty"].soft


def test_slo_checks_ttft_under_load_and_itl_for_interactive_and_e2e_for_batch() -> None:
    assert check("slo", dep("a", ttft_p95_s=0.6)) is None
    # The least-loaded worker is full: estimated TTFT doubles past the 1 s SLO.
    busy = dep("a", ttft_p95_s=0.6, workers=[worker("w", in_flight=8)])
    assert "TTFT" in check("slo", busy)
    assert "ITL" in check("slo", dep("a", itl_p95_s=0.2))
    batch = {"slo_class": "batch", "slo_ttft_s": None, "slo_tpot_s": None, "slo_e2e_s": 10.0}
    assert check("slo", dep("a", itl_p95_s=0.2), max_output_tokens=40, **batch) is None
    assert "E2E" in check("slo", dep("a", itl_p95_s=0.2), max_output_tokens=100, **batch)


def test_pipeline_wants_the_request_class_pipeline_and_is_soft() -> None:
    assert check("pipeline", dep("a", pipeline="long_context"), request_class="long_context") is None
    assert check("pipeline", dep("a", pipeline="latency"), request_class="long_context") is not None
    assert check("pipeline", dep("a", pipeline="throughput"), request_class="latency") is not None
    assert FILTERS["pipeline"].soft
