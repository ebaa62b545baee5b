"""Filter ``cost-cap``: the request's worst-case list-price cost (prompt + the whole output allowance)
must not exceed the plan's cap, or the lower one the request asked for."""

from __future__ import annotations

from llmlab_routing.model import DecisionInputs, DeploymentView
from llmlab_routing.plugins import register_filter


@register_filter
class CostCap:
    name = "cost-cap"
    soft = False

    def check(self, inp: DecisionInputs, dep: DeploymentView) -> str | None:
        cost = dep.est_cost_usd(inp.prompt_tokens, inp.max_output_tokens)
        cap = inp.constraints.cost_cap_usd
        if cost > cap:
            return f"estimated cost ${cost:.6f} > cap ${cap:.6f}"
        return None
