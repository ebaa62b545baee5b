"""Scorer ``cost``: estimated list-price cost of the request, as the ratio cheapest/own (1 = cheapest)."""

from __future__ import annotations

from collections.abc import Sequence

from llmlab_routing.model import DecisionInputs, DeploymentView
from llmlab_routing.plugins import ratio_scores, register_scorer


@register_scorer
class Cost:
    name = "cost"

    def score(self, inp: DecisionInputs, deps: Sequence[DeploymentView]) -> list[float]:
        return ratio_scores([d.est_cost_usd(inp.prompt_tokens, inp.max_output_tokens) for d in deps], eps=1e-9)
