"""Picker ``round-robin``: the worker at the deployment's cursor (router state, logged), then the next ones."""

from __future__ import annotations

import random

from llmlab_routing.model import DecisionInputs, DeploymentView
from llmlab_routing.plugins import register_picker


@register_picker
class RoundRobin:
    name = "round-robin"

    def order(self, inp: DecisionInputs, dep: DeploymentView, rng: random.Random) -> list[str | None]:
        ids: list[str | None] = [w.worker_id for w in sorted(dep.workers, key=lambda w: w.worker_id)]
        if not ids:
            return []
        k = dep.rr_cursor % len(ids)
        return ids[k:] + ids[:k]
