"""Picker ``power-of-two``: two workers drawn at random (seeded), the less loaded first; then the
rest by load. Avoids the herd that pure least-load causes when load figures are stale."""

from __future__ import annotations

import random

from llmlab_routing.model import DecisionInputs, DeploymentView
from llmlab_routing.plugins import register_picker
from llmlab_routing.plugins.least_load import by_load


@register_picker
class PowerOfTwo:
    name = "power-of-two"

    def order(self, inp: DecisionInputs, dep: DeploymentView, rng: random.Random) -> list[str | None]:
        workers = sorted(dep.workers, key=lambda w: w.worker_id)
        if len(workers) < 2:
            return by_load(dep)
        a, b = rng.sample(workers, 2)
        first = a if (a.load, a.worker_id) <= (b.load, b.worker_id) else b
        return [first.worker_id] + [w for w in by_load(dep) if w != first.worker_id]
