"""Scorer ``quality``: the deployment's catalog quality (already 0..1, absolute)."""

from __future__ import annotations

from collections.abc import Sequence

from llmlab_routing.model import DecisionInputs, DeploymentView
from llmlab_routing.plugins import register_scorer


@register_scorer
class Quality:
    name = "quality"

    def score(self, inp: DecisionInputs, deps: Sequence[DeploymentView]) -> list[float]:
        return [min(1.0, max(0.0, d.quality)) for d in deps]
