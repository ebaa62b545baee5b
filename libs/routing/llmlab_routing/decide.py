"""The decision: a pure function of :class:`DecisionInputs` (hard filters, soft filters relaxed only
when they would leave nothing, weighted normalised score, replica order, bounded fallback chain)."""

from __future__ import annotations

import random

from llmlab_common.codes import Code

from llmlab_routing.model import Decision, DecisionInputs, DeploymentView, Target
from llmlab_routing.plugins import FILTERS, PICKERS, SCORERS

# Which refusal a client sees when no deployment is left, by the first hard filter that removed
# the last candidates (a request too long for every model is the client's to fix: 400).
_ERRORS: dict[str, tuple[int, Code]] = {
    "context": (400, Code.CONTEXT_LENGTH_EXCEEDED),
    "quality-floor": (422, Code.NO_ROUTE),
    "cost-cap": (422, Code.NO_ROUTE),
    "healthy": (503, Code.NO_WORKERS),
}


def _filter(inp: DecisionInputs, deps: list[DeploymentView]) -> tuple[list[DeploymentView], dict[str, dict[str, str]]]:
    verdicts: dict[str, dict[str, str]] = {d.id: {} for d in deps}
    alive = list(deps)
    for name in inp.filters:
        f = FILTERS[name]
        results = [(d, f.check(inp, d)) for d in alive]
        passed = [d for d, why in results if why is None]
        if f.soft and not passed and alive:
            for d, why in results:
                verdicts[d.id][name] = f"relaxed: {why}"
            continue
        for d, why in results:
            verdicts[d.id][name] = "ok" if why is None else why
        alive = passed
    return alive, verdicts


def decide(inp: DecisionInputs) -> Decision:
    alive, verdicts = _filter(inp, inp.deployments)
    if not alive:
        last = _last_blocking_filter(inp, verdicts)
        status, code = _ERRORS.get(last, (503, Code.NO_ROUTE))
        reasons = "; ".join(f"{dep}: {v.get(last, '?')}" for dep, v in verdicts.items()) or "no candidate deployment"
        return Decision([], verdicts, {}, [], f"{inp.policy}: nothing can serve ({last}): {reasons}", status, code)

    weights = {k: w for k, w in inp.weights.items() if w > 0}
    total_w = sum(weights.values())
    scores: dict[str, dict[str, float]] = {d.id: {} for d in alive}
    for name in weights:
        for d, s in zip(alive, SCORERS[name].score(inp, alive), strict=True):
            scores[d.id][name] = round(s, 6)
    for d in alive:
        per = scores[d.id]
        per["total"] = round(sum(weights[k] * per[k] for k in weights) / total_w, 6) if total_w else 0.0
    order = {d.id: i for i, d in enumerate(inp.deployments)}  # ties: catalog order
    ranked = sorted(alive, key=lambda d: (-scores[d.id]["total"], order[d.id]))

    rng = random.Random(inp.seed)
    picker = PICKERS[inp.picker]
    targets: list[Target] = []
    for d in ranked:
        if len(targets) >= inp.max_chain:
            break
        workers = picker.order(inp, d, rng)[: 1 + inp.replica_retries]
        if len(workers) < 1 + inp.replica_retries:
            # Fewer live workers than retries: the retry goes to the pool, so a worker that
            # started after this decision (a restart, a scale-up) can still take it.
            workers.append(None)
        for wid in workers:
            if len(targets) < inp.max_chain:
                targets.append(Target(d.id, d.pool, wid))
    first = ranked[0]
    why = (
        f"{inp.policy}: {first.id} (score {scores[first.id]['total']:.3f}"
        + (", " + ", ".join(f"{k} {v:.2f}" for k, v in scores[first.id].items() if k != "total") if weights else "")
        + f") worker {targets[0].worker_id or 'any'} by {inp.picker}; "
        + f"{inp.difficulty_class}/{inp.length_class} request, {len(alive)}/{len(inp.deployments)} deployments passed"
    )
    return Decision(targets, verdicts, scores, [d.id for d in ranked], why)


def _last_blocking_filter(inp: DecisionInputs, verdicts: dict[str, dict[str, str]]) -> str:
    """The filter that removed the last candidates (the one whose refusal the client should read)."""
    last = "healthy"
    for name in inp.filters:
        if any(name in v and v[name] != "ok" and not v[name].startswith("relaxed") for v in verdicts.values()):
            last = name
    return last
