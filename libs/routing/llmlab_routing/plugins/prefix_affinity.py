"""Picker ``prefix-affinity``: the worker that was last sent the longest run of this prompt's leading
blocks (most likely to hold them in its prefix cache), among workers under the load bound
``in_flight <= (1 + load_bound) x mean in_flight + 1`` (so one hot prefix cannot pile onto one
worker: it spills, and the spill worker becomes a second home). With no match, the prompt's first
block picks a home by rendezvous hashing among workers under the bound, so a new prefix group lands
on one worker instead of spreading its cache over all. The rest follow by load."""

from __future__ import annotations

import hashlib
import random

from llmlab_routing.model import DecisionInputs, DeploymentView
from llmlab_routing.plugins import register_picker
from llmlab_routing.plugins.least_load import by_load


def _rendezvous(key: str, worker_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{key}|{worker_id}".encode(), digest_size=8).digest(), "big")


@register_picker
class PrefixAffinity:
    name = "prefix-affinity"

    def order(self, inp: DecisionInputs, dep: DeploymentView, rng: random.Random) -> list[str | None]:
        rest = by_load(dep)
        if not dep.workers or inp.prefix_blocks == 0:
            return rest
        mean = sum(w.in_flight for w in dep.workers) / len(dep.workers)
        bound = (1.0 + inp.load_bound) * mean + 1.0
        light = [w for w in dep.workers if w.in_flight <= bound]
        if not light:
            return rest
        matched = [w for w in light if w.prefix_match > 0]
        if matched:
            first = min(matched, key=lambda w: (-w.prefix_match, w.load, w.worker_id))
        else:
            # The home of a new prefix: stable for the same first block and worker set.
            first = max(light, key=lambda w: _rendezvous(inp.prefix_key, w.worker_id))
        return [first.worker_id] + [w for w in rest if w != first.worker_id]
