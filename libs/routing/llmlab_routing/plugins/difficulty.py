"""Filter ``difficulty`` (soft): a medium or hard request (llmlab_routing.features) wants a deployment
of at least the configured quality for its class; relaxed when no deployment reaches it."""

from __future__ import annotations

from llmlab_routing.model import DecisionInputs, DeploymentView
from llmlab_routing.plugins import register_filter


@register_filter
class Difficulty:
    name = "difficulty"
    soft = True

    def check(self, inp: DecisionInputs, dep: DeploymentView) -> str | None:
        floor = inp.constraints.difficulty_floor
        if dep.quality < floor:
            return f"{inp.difficulty_class} request wants quality >= {floor:.2f}, has {dep.quality:.2f}"
        return None
