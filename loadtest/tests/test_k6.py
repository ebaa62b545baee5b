"""The k6 scenarios (loadtest/k6/) run by llmlab_loadtest.k6 against a live stack on the engine
simulator: what k6 counts must match what the gateway counted, thresholds must be able to fail,
and the budget scenario must see the over-budget tenant refused and the others served."""

from __future__ import annotations

from pathlib import Path

import pytest
from llmlab_loadtest.k6 import THRESHOLDS_CROSSED, run_k6, simulated_stack
from llmlab_testkit.e2e import metric

pytestmark = pytest.mark.e2e


def test_smoke_counts_what_the_gateway_counted_and_a_crossed_threshold_fails_the_run(tmp_path: Path) -> None:
    """Catches: a scenario that counts answers or tokens the server never gave (the usage block
    misread, a stream's [DONE] not required), a time to first byte that is not one, and
    thresholds that cannot fail."""
    with simulated_stack(budget=False) as env:
        gw = env["LOAD_BASE_URL"]
        run = run_k6("smoke", {**env, "LOAD_ITERATIONS": "6", "LOAD_MAX_TOKENS": "8"}, tmp_path)
        assert run.exit_code == 0, run.thresholds()
        assert all(run.thresholds().values())
        # The gateway's own counters witness the same 6 answers of 8 tokens (the simulator
        # generates 64 tokens unless max_tokens stops it first).
        assert run.value("llm_responses") == 6 == metric(gw, "llmlab_gateway_requests_total", status="200")
        assert run.value("llm_completion_tokens") == 6 * 8 == metric(gw, "llmlab_gateway_completion_tokens_total")
        assert run.value("llm_ok", "rate") == 1.0
        # First byte no sooner than the simulator's 20 ms first token, and before the last byte.
        assert run.value("llm_ttfb", "min") >= 20 and run.value("llm_ttfb", "max") <= run.value("llm_e2e", "max")
        assert run.cpu_s > 0 and run.wall_s > 0
        # A wrong key: every answer a 401, so the smoke's thresholds cross and k6 says so.
        bad = run_k6("smoke", {**env, "LOAD_API_KEY": "sk-wrong", "LOAD_ITERATIONS": "2"}, tmp_path)
        assert bad.exit_code == THRESHOLDS_CROSSED
        assert bad.thresholds() == {"llm_ok: rate==1": False, "llm_responses{status:200}: count==2": False}
        assert metric(gw, "llmlab_gateway_requests_total", status="401") == 2


def test_the_budget_scenario_sees_the_over_budget_tenant_refused_and_the_others_served(tmp_path: Path) -> None:
    with simulated_stack(budget=True) as env:
        assert len(env["LOAD_API_KEYS"].split(",")) == 4 and env["LOAD_OVER_BUDGET_KEYS"] in env["LOAD_API_KEYS"]
        run = run_k6("budget", {**env, "LOAD_ITERATIONS": "3"}, tmp_path)
        assert run.exit_code == 0, run.thresholds()
        # 4 tenants x 3 requests; the one over its daily budget refused each time, by the gateway too.
        assert run.value("llm_responses") == 12
        assert run.responses()["{tenant:over,status:429}"] == 3
        assert metric(env["LOAD_BASE_URL"], "llmlab_gateway_requests_total", code="insufficient_quota") == 3
        assert metric(env["LOAD_BASE_URL"], "llmlab_gateway_requests_total", status="200") == 9
