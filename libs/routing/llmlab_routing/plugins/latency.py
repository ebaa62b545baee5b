"""Scorer ``latency``: estimated end-to-end latency (TTFT p95 under current load + output x ITL p95),
as the ratio best/own (1 = fastest candidate)."""

from __future__ import annotations

from collections.abc import Sequence

from llmlab_routing.model import DecisionInputs, DeploymentView
from llmlab_routing.plugins import ratio_scores, register_scorer


@register_scorer
class Latency:
    name = "latency"

    def score(self, inp: DecisionInputs, deps: Sequence[DeploymentView]) -> list[float]:
        return ratio_scores([d.est_e2e_s(inp.max_output_tokens) for d in deps])
