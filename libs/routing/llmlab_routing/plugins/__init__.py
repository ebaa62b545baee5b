"""Routing plug-ins behind three small interfaces, registered by name (llm-d scheduler style):

* a **filter** says why a deployment cannot serve the request (``None``: it can). ``soft`` filters
  are relaxed, and the relaxation logged, when they would leave no deployment at all;
* a **scorer** maps each surviving deployment to 0..1 (1 = best); a policy combines scorers by
  weight, so raw units (seconds, dollars) are never added together;
* a **picker** orders the workers of the chosen deployment (first = the target, the rest are
  replica fallbacks). Randomness comes only from the ``rng`` it is given (seeded, logged).

Every plug-in is a pure function of :class:`~llmlab_routing.model.DecisionInputs`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from llmlab_routing.model import DecisionInputs, DeploymentView


class Filter(Protocol):
    name: str
    soft: bool

    def check(self, inp: DecisionInputs, dep: DeploymentView) -> str | None: ...


class Scorer(Protocol):
    name: str

    def score(self, inp: DecisionInputs, deps: Sequence[DeploymentView]) -> list[float]: ...


class Picker(Protocol):
    name: str

    def order(self, inp: DecisionInputs, dep: DeploymentView, rng: random.Random) -> list[str | None]: ...


FILTERS: dict[str, Filter] = {}
SCORERS: dict[str, Scorer] = {}
PICKERS: dict[str, Picker] = {}

T = TypeVar("T")


def _register(table: dict[str, T]) -> Callable[[type[T]], type[T]]:
    def deco(cls: type[T]) -> type[T]:
        inst = cls()
        name = getattr(inst, "name")  # noqa: B009 (protocol attribute)
        if name in table:
            raise ValueError(f"plug-in {name!r} registered twice")
        table[name] = inst
        return cls

    return deco


register_filter = _register(FILTERS)
register_scorer = _register(SCORERS)
register_picker = _register(PICKERS)


def ratio_scores(values: Sequence[float], eps: float = 1e-12) -> list[float]:
    """Lower-is-better values to 0..1 by ratio to the best (scale-free; 1 = the best candidate)."""
    if not values:
        return []
    best = min(values)
    return [(best + eps) / (v + eps) for v in values]


# Importing the modules registers them.
from llmlab_routing.plugins import (  # noqa: E402
    cache,
    context_fits,
    cost,
    cost_cap,
    difficulty,
    healthy,
    latency,
    least_load,
    pipeline,
    power_of_two,
    prefix_affinity,
    quality,
    quality_floor,
    round_robin,
    slo,
    tools,
)

__all__ = [
    "FILTERS",
    "PICKERS",
    "SCORERS",
    "Filter",
    "Picker",
    "Scorer",
    "cache",
    "context_fits",
    "cost",
    "cost_cap",
    "difficulty",
    "healthy",
    "latency",
    "least_load",
    "pipeline",
    "power_of_two",
    "prefix_affinity",
    "quality",
    "quality_floor",
    "round_robin",
    "slo",
    "tools",
]
