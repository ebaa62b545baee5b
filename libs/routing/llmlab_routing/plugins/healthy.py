"""Filter ``healthy``: a deployment needs a live, ready worker, and not a failing streak
(more than half of at least 4 attempts in the stats window failed: engine errors, lost workers)."""

from __future__ import annotations

from llmlab_routing.model import DecisionInputs, DeploymentView
from llmlab_routing.plugins import register_filter

MIN_SAMPLES = 4
MAX_FAILURE_RATE = 0.5


@register_filter
class Healthy:
    name = "healthy"
    soft = False

    def check(self, inp: DecisionInputs, dep: DeploymentView) -> str | None:
        if not dep.workers:
            return f"no live worker in pool {dep.pool}"
        if dep.failure_samples >= MIN_SAMPLES and dep.failure_rate > MAX_FAILURE_RATE:
            return f"failing: {dep.failure_rate:.0%} of {dep.failure_samples} recent attempts failed"
        return None
