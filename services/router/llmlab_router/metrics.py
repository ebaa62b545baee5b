"""Router metrics (bounded labels only: policy, deployment, outcome, result, pool)."""

from __future__ import annotations

from collections.abc import Collection, Mapping

from llmlab_common.jsprobe import PoolQueue
from llmlab_common.messages import RouteCommit, RouteReply
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
            "Routing decisions by policy, first deployment and outcome (shared: made by a gateway in shared mode)",
            ("policy", "deployment", "outcome"),
        )
        self.reloads = metrics.counter("router_catalog_reloads_total", "Catalog reloads by result", ("result",))
        self.queue_pending = metrics.gauge(
            "router_queue_pending_messages",
            "Requests waiting in JetStream for a worker: the pool's consumer and its live workers' consumers",
            ("pool",),
        )
        self.queue_ack_pending = metrics.gauge(
            "router_queue_ack_pending_messages", "Requests taken by a worker of the pool, not yet acked", ("pool",)
        )

    def set_queues(self, by_pool: Mapping[str, PoolQueue]) -> None:
        """The backlog of every catalog pool (a pool gone from the catalog loses its series)."""
        self.queue_pending.clear()
        self.queue_ack_pending.clear()
        for pool, q in by_pool.items():
            self.queue_pending.labels(pool).set(q.pending)
            self.queue_ack_pending.labels(pool).set(q.ack_pending)

    def reloaded(self, result: str) -> None:
        self.reloads.labels(result).inc()

    def observe_shared(self, commit: RouteCommit, policies: Collection[str], deployments: Collection[str]) -> None:
        """A decision a gateway in shared router mode made and published (outcome ``shared``);
        names the catalog does not know count as ``other``, so no message can add series."""
        policy = commit.policy if commit.policy in policies else "other"
        deployment = commit.deployment if commit.deployment in deployments else "other"
        self.decisions.labels(policy, deployment, "shared").inc()

    def observe(self, reply: RouteReply, policy: str) -> None:
        if reply.targets:
            self.decisions.labels(policy, reply.targets[0].deployment, "routed").inc()
        else:
            self.decisions.labels(policy, "", reply.error.code if reply.error and reply.error.code else "error").inc()
