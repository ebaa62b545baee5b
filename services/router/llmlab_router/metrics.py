"""Router metrics (bounded labels only: policy, deployment, outcome)."""

from __future__ import annotations

from llmlab_common.messages import RouteReply
from llmlab_common.metrics import Metrics


class RouterMetrics:
    def __init__(self, metrics: Metrics) -> None:
        self.decision_seconds = metrics.histogram(
            "router_decision_seconds",
            "Time to decide one route (inputs, filters, scores, picker, record)",
            buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05),
        )
        self.decisions = metrics.counter(
            "router_decisions_total",
            "Routing decisions by policy, first deployment and outcome",
            ("policy", "deployment", "outcome"),
        )
        self.reloads = metrics.counter("router_catalog_reloads_total", "Catalog reloads by result", ("result",))

    def reloaded(self, result: str) -> None:
        self.reloads.labels(result).inc()

    def observe(self, reply: RouteReply, policy: str) -> None:
        if reply.targets:
            self.decisions.labels(policy, reply.targets[0].deployment, "routed").inc()
        else:
            self.decisions.labels(policy, "", reply.error.code if reply.error and reply.error.code else "error").inc()
