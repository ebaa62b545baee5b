"""The router counts the decisions gateways in shared router mode publish (unit): by the policy
and deployment they name when the catalog knows them, as ``other`` otherwise (a message cannot
add series)."""

from __future__ import annotations

import pytest
from llmlab_common.messages import RouteCommit
from llmlab_common.metrics import Metrics
from llmlab_router.metrics import RouterMetrics
from llmlab_testkit.e2e import samples

pytestmark = pytest.mark.unit


def test_shared_decisions_are_counted_with_known_names_only() -> None:
    m = Metrics("llmlab")
    rm = RouterMetrics(m)
    policies, deployments = {"latency-first", "static"}, {"llama-8b-vllm"}
    for policy, deployment in [
        ("latency-first", "llama-8b-vllm"),
        ("latency-first", "llama-8b-vllm"),
        ("made-up", "llama-8b-vllm"),
        ("static", "x" * 200),
    ]:
        rm.observe_shared(RouteCommit(deployment=deployment, policy=policy), policies, deployments)
    got = {k: v for k, v in samples(m, "llmlab_router_decisions_total").items() if v}
    assert got == {
        'llmlab_router_decisions_total{deployment="llama-8b-vllm",outcome="shared",policy="latency-first"}': 2,
        'llmlab_router_decisions_total{deployment="llama-8b-vllm",outcome="shared",policy="other"}': 1,
        'llmlab_router_decisions_total{deployment="other",outcome="shared",policy="static"}': 1,
    }
