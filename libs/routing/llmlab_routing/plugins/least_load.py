"""Picker ``least-load``: workers by load (in flight / max concurrency), ties by id."""

from __future__ import annotations

import random

from llmlab_routing.model import DecisionInputs, DeploymentView
from llmlab_routing.plugins import register_picker


def by_load(dep: DeploymentView) -> list[str | None]:
    return [w.worker_id for w in sorted(dep.workers, key=lambda w: (w.load, w.worker_id))]


@register_picker
class LeastLoad:
    name = "least-load"

    def order(self, inp: DecisionInputs, dep: DeploymentView, rng: random.Random) -> list[str | None]:
        return by_load(dep)
