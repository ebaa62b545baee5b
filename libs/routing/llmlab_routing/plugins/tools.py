"""Filter ``tools`` (soft): a request that sends tool definitions prefers deployments that support
tools; when none does, it is relaxed and the gateway drops the tools (logged), as before routing."""

from __future__ import annotations

from llmlab_routing.model import DecisionInputs, DeploymentView
from llmlab_routing.plugins import register_filter


@register_filter
class Tools:
    name = "tools"
    soft = True

    def check(self, inp: DecisionInputs, dep: DeploymentView) -> str | None:
        if inp.needs_tools and not dep.supports_tools:
            return "request uses tools; deployment does not support them"
        return None
