"""Event → row mapping: attribution to the catalog, the budget's charging rule, SLO verdicts."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from llmlab_accounting.domain import (
    AttemptRow,
    attempt_class,
    attempt_columns,
    attempt_row,
    error_class,
    heartbeat_row,
    request_row,
)
from llmlab_common.catalog import Catalog
from llmlab_common.messages import AttemptEvent, ErrorInfo, Heartbeat, RequestEvent, RouteInfo, Timings

pytestmark = pytest.mark.unit
Factory = Callable[..., AttemptEvent]
# configs/catalog.yaml list prices, USD per 1M tokens: input and output differ, so a swap shows.
LLAMA_IN, LLAMA_OUT = 0.10, 0.20
QWEN_IN, QWEN_OUT = 0.30, 0.90


def test_completed_attempt_is_billed_at_engine_counts_and_priced_from_the_catalog(
    catalog: Catalog, attempt_factory: Factory
) -> None:
    """Catches: the input and output prices swapped (or one used for both) when a row is priced."""
    row = attempt_row(attempt_factory(prompt=100, completion=50), catalog, now=1.0)
    assert (row["billed_input_tokens"], row["billed_output_tokens"], row["is_billing"]) == (100, 50, 1)
    assert row["status_class"] == "ok"
    assert (row["pool"], row["pipeline"], row["engine"], row["gpu"], row["gpu_count"]) == (
        "gpu-vllm",
        "throughput",
        "vllm",
        "H100-SXM",
        1,
    )
    assert (row["input_usd_per_mtok"], row["output_usd_per_mtok"]) == (LLAMA_IN, LLAMA_OUT)
    assert row["gpu_usd_per_hour"] == pytest.approx(2.99)
    assert row["price_as_of"] == "2026-12-01"
    assert row["started_at"] == pytest.approx(row["ended_at"] - 0.5)
    assert (row["tenant_id"], row["key_id"], row["plan"]) == ("acme", "k", "pro")


def test_two_gpu_deployment_costs_twice_the_gpu_rate(catalog: Catalog, attempt_factory: Factory) -> None:
    """Catches: a two-GPU deployment priced as one GPU, or another model's token prices."""
    row = attempt_row(attempt_factory(deployment="qwen3-32b-sglang", model="Qwen/Qwen3-32B"), catalog)
    assert row["gpu_usd_per_hour"] == pytest.approx(2 * 2.99) and row["gpu_count"] == 2
    assert (row["input_usd_per_mtok"], row["output_usd_per_mtok"]) == (QWEN_IN, QWEN_OUT)


def test_failed_attempts_are_not_billed(catalog: Catalog, attempt_factory: Factory) -> None:
    for outcome in ("worker_lost", "abandoned", "engine_error", "expired", "stale"):
        row = attempt_row(attempt_factory(outcome=outcome, source="gateway"), catalog)
        assert row["is_billing"] == 0 and row["billed_output_tokens"] == 0 and row["billed_input_tokens"] == 0


def test_client_disconnect_bills_delivered_tokens_and_the_worker_cancel_does_not(
    catalog: Catalog, attempt_factory: Factory
) -> None:
    gw = attempt_factory(
        outcome="cancelled", source="gateway", prompt=0, completion=7, error_code="client_disconnected"
    )
    row = attempt_row(gw, catalog)
    assert row["is_billing"] == 1
    # The budget charged its reserved input estimate, which the event does not carry.
    assert row["billed_input_tokens"] is None and row["billed_output_tokens"] == 7
    wk = attempt_factory(outcome="cancelled", source="worker", error_code="cancelled")
    assert attempt_row(wk, catalog)["is_billing"] == 0


def test_status_classes() -> None:
    assert error_class(ErrorInfo(status=429, type="insufficient_quota", message="")) == "refused_budget"
    assert error_class(ErrorInfo(status=429, type="rate_limit_error", code="rate_limit_exceeded", message="")) == (
        "refused_budget"
    )
    assert error_class(ErrorInfo(status=429, type="rate_limit_error", code="queue_timeout", message="")) == "timeout"
    # The budget shedding load is neither a verdict on the tenant nor a queue timeout.
    assert error_class(ErrorInfo(status=429, type="rate_limit_error", code="overloaded", message="")) == "shed_budget"
    predicted = ErrorInfo(status=429, type="rate_limit_error", code="queue_wait_predicted", message="")
    assert error_class(predicted) == "shed_admission"
    assert error_class(ErrorInfo(status=401, type="authentication_error", message="")) == "auth"
    # An address refused for its authentication failures is an auth refusal, not a queue timeout.
    refused_address = ErrorInfo(
        status=429, type="rate_limit_error", code="too_many_authentication_failures", message=""
    )
    assert error_class(refused_address) == "auth"
    assert error_class(ErrorInfo(status=502, type="server_error", message="")) == "server_error"
    assert error_class(ErrorInfo(status=400, type="invalid_request_error", message="")) == "client_error"


def test_attempt_classes(attempt_factory: Factory) -> None:
    assert attempt_class(attempt_factory(outcome="abandoned", source="gateway")) == "timeout"
    assert attempt_class(attempt_factory(outcome="worker_lost", source="gateway")) == "server_error"
    assert attempt_class(attempt_factory(outcome="stale")) == "dropped"


def test_slo_verdicts_against_the_plan_class(catalog: Catalog, attempt_factory: Factory) -> None:
    # interactive: TTFT p95 1.0 s (queue + engine TTFT), TPOT 0.10 s.
    fast = attempt_row(attempt_factory(), catalog)
    assert (fast["slo_class"], fast["slo_ttft_ok"], fast["slo_tpot_ok"], fast["slo_e2e_ok"], fast["slo_ok"]) == (
        "interactive",
        1,
        1,
        None,
        1,
    )
    slow = attempt_row(attempt_factory(timings=Timings(nats_queue_s=0.5, ttft_s=0.6, e2e_s=2.0, tpot_s=0.2)), catalog)
    assert (slow["slo_ttft_ok"], slow["slo_tpot_ok"], slow["slo_ok"]) == (0, 0, 0)
    failed = attempt_row(attempt_factory(outcome="engine_error"), catalog)
    assert failed["slo_ok"] == 0  # only an answered attempt meets an SLO


def test_route_info_is_carried(catalog: Catalog, attempt_factory: Factory) -> None:
    route = RouteInfo(
        policy="p", policy_version="1", position=2, reason="r", fallback_from="x", slo_class="batch", prompt_hash="ab"
    )
    row = attempt_row(attempt_factory(route=route), catalog)
    assert (row["route_policy"], row["route_position"], row["fallback_from"], row["slo_class"]) == (
        "p",
        2,
        "x",
        "batch",
    )
    assert row["prompt_hash"] == "ab"


def test_request_row(catalog: Catalog, refusal_factory: Callable[..., RequestEvent]) -> None:
    row = request_row(refusal_factory(), catalog)
    assert (row["status"], row["status_class"], row["tenant_id"]) == (429, "refused_budget", "acme")


def test_columns_of_a_mixed_batch_are_the_rows_of_each_event(catalog: Catalog, attempt_factory: Factory) -> None:
    events = [
        attempt_factory("a", 1, "completed", prompt=100, completion=40),
        attempt_factory("b", 1, "worker_lost", "gateway"),
        attempt_factory("c", 1, "cancelled", "gateway", prompt=0, completion=5, error_code="client_disconnected"),
        attempt_factory("d", 2, "completed", deployment="no-such-deployment", model="unknown/model"),
        attempt_factory(
            "e", 1, "completed", route=RouteInfo(policy="auto", policy_version="v1", reason="r", slo_class="batch")
        ),
    ]
    cols = attempt_columns(events, catalog, now=123.0)
    assert list(cols) == list(AttemptRow.__annotations__)  # the table's column order
    assert all(len(v) == len(events) for v in cols.values())
    for i, ev in enumerate(events):
        assert {k: v[i] for k, v in cols.items()} == attempt_row(ev, catalog, now=123.0)
    assert attempt_columns([], catalog) == {k: [] for k in AttemptRow.__annotations__}


def test_heartbeat_row_finds_the_worker_s_deployment_and_gpu_price(catalog: Catalog) -> None:
    def hb(pool: str, models: list[str]) -> Heartbeat:
        return Heartbeat(
            worker_id="w7",
            pool=pool,
            engine="sglang",
            models=models,
            max_concurrency=8,
            in_flight=0,
            ready=True,
            interval_s=1.0,
            sent_at=1000.0,
        )

    row = heartbeat_row(hb("gpu-sglang", ["Qwen/Qwen3-32B"]), catalog, now=1001.0)
    assert row["deployment"] == "qwen3-32b-sglang" and row["model"] == "Qwen/Qwen3-32B"
    assert row["gpu_usd_per_hour"] == pytest.approx(2 * 2.99)  # two H100s
    assert (row["sent_at"], row["interval_s"], row["ready"], row["ingested_at"]) == (1000.0, 1.0, 1, 1001.0)
    # A pool the catalog does not know: recorded, but with no deployment it costs nothing here.
    unknown = heartbeat_row(hb("elsewhere", ["x/y"]), catalog)
    assert unknown["deployment"] == "" and unknown["gpu_usd_per_hour"] == 0
