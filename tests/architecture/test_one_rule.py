"""Each cross-service rule has one definition (llmlab_common.rules) and its consumers go through it:
replacing the rule changes what the budget, accounting, the router and the engine twin decide. A
service that restated a rule instead of calling it would keep deciding the old way and fail here."""

from __future__ import annotations

import ast
import time
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from llmlab_accounting.domain import attempt_row, error_class
from llmlab_budget.metrics import BudgetMetrics
from llmlab_budget.model import Closed, Reservation
from llmlab_budget.service import BudgetService
from llmlab_budget.settings import BudgetSettings
from llmlab_budget.windows import Windows
from llmlab_common import rules
from llmlab_common.catalog import Catalog, load_catalog
from llmlab_common.messages import AttemptEvent, Principal, Timings, Usage
from llmlab_common.metrics import Metrics
from llmlab_common.settings import DEFAULT_CATALOG
from llmlab_gateway.auth import StaticKeyAuthenticator
from llmlab_routing.plugins import FILTERS
from llmlab_routing.state import LiveState
from llmlab_testkit.routing import dep, inputs
from llmlab_twin.replay import Slo
from llmlab_twin.sched import SeqState, TwinSeq

pytestmark = pytest.mark.unit
REPO = Path(__file__).resolve().parents[2]
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog(REPO / DEFAULT_CATALOG)


def event(outcome: str, source: str = "worker", **kw: Any) -> AttemptEvent:
    fields: dict[str, Any] = {
        "request_id": "r1",
        "attempt": 1,
        "outcome": outcome,
        "source": source,
        "pool": "gpu-vllm",
        "deployment": "llama-8b-vllm",
        "model": LLAMA,
        "endpoint": "chat",
        "principal": Principal(plan="pro"),
        "usage": Usage(prompt_tokens=10, completion_tokens=20, total_tokens=30),
        "timings": Timings(nats_queue_s=0.01, ttft_s=0.1, e2e_s=0.5, tpot_s=0.02),
        "created_at": time.time() - 1,
        "ended_at": time.time(),
    }
    return AttemptEvent(**(fields | kw))


class _Ledger:
    """Records what settlement asked of the ledger (the real one is Redis + Lua)."""

    def __init__(self) -> None:
        self.closed: list[tuple[str, int, int]] = []

    async def close(
        self,
        request_id: str,
        state: str,
        *,
        input_tokens: int,
        output_tokens: int,
        now: float,
        tombstone: bool = False,
        attempt: int = 0,
    ) -> Closed:
        self.closed.append((state, input_tokens, output_tokens))
        return Closed("ok", charged=max(input_tokens, 0) + output_tokens, reserved=100)


def budget(catalog: Catalog) -> tuple[BudgetService, _Ledger]:
    ledger = _Ledger()
    svc = BudgetService(BudgetSettings(), catalog, None, ledger, BudgetMetrics(Metrics("t")))  # type: ignore[arg-type]
    return svc, ledger


# -- charging ------------------------------------------------------------------------------------


async def test_budget_and_accounting_charge_by_the_one_rule(catalog: Catalog, monkeypatch: pytest.MonkeyPatch) -> None:
    lost = event("worker_lost", source="gateway", usage=None)
    svc, ledger = budget(catalog)
    # As shipped: a lost attempt charges nothing, in the budget and in accounting alike.
    assert await svc.settle_attempt(lost) is None and ledger.closed == []
    assert attempt_row(lost, catalog)["is_billing"] == 0
    # A different rule (charge every attempt 3 + 4 tokens) changes both: neither restates it.
    monkeypatch.setattr(rules, "charge_for", lambda ev: rules.Charge(3, 4))
    assert await svc.settle_attempt(lost) is not None and ledger.closed == [("settled", 3, 4)]
    row = attempt_row(lost, catalog)
    assert (row["is_billing"], row["billed_input_tokens"], row["billed_output_tokens"]) == (1, 3, 4)


# -- failed outcomes -----------------------------------------------------------------------------


def test_router_and_accounting_count_failures_by_the_one_set(catalog: Catalog, monkeypatch: pytest.MonkeyPatch) -> None:
    expired = event("expired", source="worker", usage=None)
    st = LiveState()
    st.on_attempt(expired, now=1.0)
    assert "llama-8b-vllm" not in st.stats  # not a failure of the deployment
    assert attempt_row(expired, catalog)["status_class"] == "timeout"
    monkeypatch.setattr(rules, "FAILED_OUTCOMES", rules.FAILED_OUTCOMES | {"expired"})
    st.on_attempt(expired, now=1.0)
    assert st.stats["llama-8b-vllm"].failure_rate(1.0, 60.0) == (1.0, 1)
    assert attempt_row(expired, catalog)["status_class"] == "server_error"  # now classed as a failure


# -- budget refusals -----------------------------------------------------------------------------


def test_every_budget_refusal_is_one_accounting_counts_as_a_budget_refusal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w = Windows.at(1_800_000_000.0, ZoneInfo("UTC"))
    refused = [
        BudgetService._refusal(Reservation(status, scope="user", limit=5, window=window), 100, 50, w, 1_800_000_000.0)
        for status, window in [
            ("input_cap", ""),
            ("concurrency", ""),
            ("rpm", ""),
            ("tpm", ""),
            ("quota", "daily"),
            ("quota", "monthly"),
        ]
    ]
    assert all(error_class(e.to_info()) == "refused_budget" for e in refused)
    monkeypatch.setattr(rules, "BUDGET_REFUSAL_CODES", frozenset())
    assert error_class(refused[0].to_info()) == "client_error"  # accounting reads the one set


# -- SLO semantics -------------------------------------------------------------------------------


def test_accounting_the_twin_and_the_router_judge_slos_by_the_one_rule(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    answered = event("completed")
    seq = TwinSeq("s", prompt_tokens=10, output_tokens=2, arrival=0.0)
    seq.state, seq.admitted_at, seq.first_token_at, seq.finished_at, seq.generated = SeqState.DONE, 0.0, 0.1, 0.2, 2
    slo_filter, view = FILTERS["slo"], dep("a")
    assert attempt_row(answered, catalog)["slo_ok"] == 1
    assert Slo(ttft_s=1.0).met(seq)
    assert slo_filter.check(inputs([view]), view) is None

    def nothing_meets(limits: rules.SloLimits, **_: Any) -> rules.SloVerdict:
        return rules.SloVerdict(False, False, False, False, met=False)

    monkeypatch.setattr(rules, "slo_verdict", nothing_meets)
    assert attempt_row(answered, catalog)["slo_ok"] == 0
    assert not Slo(ttft_s=1.0).met(seq)
    assert slo_filter.check(inputs([view]), view) is not None


# -- API keys ------------------------------------------------------------------------------------


async def test_gateway_and_admin_apis_compare_keys_by_the_one_hash(monkeypatch: pytest.MonkeyPatch) -> None:
    auth = StaticKeyAuthenticator([rules.hash_key("sk-a")], "pro")
    assert (await auth.authenticate("sk-a")).plan == "pro"
    monkeypatch.setattr(rules, "hash_key", lambda key: "0" * 64)
    with pytest.raises(Exception, match="Incorrect API key"):
        await auth.authenticate("sk-a")


_RULE_LITERALS = {"client_disconnected", "insufficient_quota"}


def test_no_package_but_the_common_library_hashes_keys_or_restates_a_rule_literal() -> None:
    """Services and libraries hash API keys (SHA-256) only through ``rules`` (a content hash of a
    catalog or a prompt is no key), and never spell the charging or refusal literals."""
    offenders = []
    for path in sorted((REPO / "services").glob("*/llmlab_*/**/*.py")) + sorted(REPO.glob("libs/*/llmlab_*/**/*.py")):
        if "llmlab_common" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "sha256"
                and "key" in " ".join(ast.unparse(a) for a in node.args).lower()
            ):
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno}: {ast.unparse(node)}")
            if isinstance(node, ast.Constant) and node.value in _RULE_LITERALS:
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.value!r}")
    assert offenders == []
