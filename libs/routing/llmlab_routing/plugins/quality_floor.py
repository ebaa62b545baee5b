"""Filter ``quality-floor``: quality >= the plan's floor, or the stricter one the request asked for."""

from __future__ import annotations

from llmlab_routing.model import DecisionInputs, DeploymentView
from llmlab_routing.plugins import register_filter


@register_filter
class QualityFloor:
    name = "quality-floor"
    soft = False

    def check(self, inp: DecisionInputs, dep: DeploymentView) -> str | None:
        floor = inp.constraints.quality_floor
        if dep.quality < floor:
            return f"quality {dep.quality:.2f} < floor {floor:.2f}"
        return None
