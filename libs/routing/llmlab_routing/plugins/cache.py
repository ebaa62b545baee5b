"""Scorer ``cache``: the share of the request's leading prompt blocks that some worker of the
deployment was last sent (likely still in its prefix cache). Lets a cheaper model with a warm cache
beat a better one cold; 0 for every candidate when the prompt has no full block."""

from __future__ import annotations

from collections.abc import Sequence

from llmlab_routing.model import DecisionInputs, DeploymentView
from llmlab_routing.plugins import register_scorer


@register_scorer
class Cache:
    name = "cache"

    def score(self, inp: DecisionInputs, deps: Sequence[DeploymentView]) -> list[float]:
        if inp.prefix_blocks == 0:
            return [0.0] * len(deps)
        return [max((w.prefix_match for w in d.workers), default=0) / inp.prefix_blocks for d in deps]
