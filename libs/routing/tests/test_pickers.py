"""One test per replica picker."""

from __future__ import annotations

import random

import pytest
from llmlab_routing.plugins import PICKERS
from llmlab_testkit.routing import dep, inputs, worker

pytestmark = pytest.mark.unit


def order(name: str, d, seed: int = 1, **kw):  # type: ignore[no-untyped-def]
    return PICKERS[name].order(inputs([d], **kw), d, random.Random(seed))


def test_least_load_orders_by_load_then_id() -> None:
    d = dep("a", workers=[worker("w1", 5), worker("w2", 1), worker("w3", 1, max_concurrency=2)])
    assert order("least-load", d) == ["w2", "w3", "w1"]


def test_power_of_two_picks_the_lighter_of_two_seeded_draws() -> None:
    d = dep("a", workers=[worker(f"w{i}", i) for i in range(8)])
    firsts = {order("power-of-two", d, seed=s)[0] for s in range(50)}
    assert "w7" not in firsts  # the heaviest never wins a draw
    assert len(firsts) > 2  # but not always the lightest: that is the point
    assert order("power-of-two", d, seed=3) == order("power-of-two", d, seed=3)  # the seed replays it
    assert sorted(order("power-of-two", d, seed=3)) == sorted(w.worker_id for w in d.workers)


def test_round_robin_starts_at_the_cursor() -> None:
    d = dep("a", workers=[worker("w1"), worker("w2"), worker("w3")], rr_cursor=4)
    assert order("round-robin", d) == ["w2", "w3", "w1"]


def test_prefix_affinity_prefers_the_warm_worker_under_the_load_bound() -> None:
    warm = dep("a", workers=[worker("w1", 2, match=3), worker("w2", 0), worker("w3", 1)])
    assert order("prefix-affinity", warm, prefix_blocks=4, prefix_key="k")[0] == "w1"
    # A hot prefix: the warm worker is far above the mean, so the request spills elsewhere.
    hot = dep("a", workers=[worker("w1", 12, max_concurrency=16, match=3), worker("w2", 0), worker("w3", 1)])
    assert order("prefix-affinity", hot, prefix_blocks=4, prefix_key="k", load_bound=0.25)[0] != "w1"
    # No match: the first block's hash picks a stable home among light workers.
    cold = dep("a", workers=[worker("w1"), worker("w2"), worker("w3")])
    homes = {order("prefix-affinity", cold, prefix_blocks=2, prefix_key="same")[0] for _ in range(5)}
    assert len(homes) == 1
    spread = {order("prefix-affinity", cold, prefix_blocks=2, prefix_key=f"k{i}")[0] for i in range(40)}
    assert len(spread) == 3
    # No prefix at all: least load.
    assert order("prefix-affinity", warm, prefix_blocks=0)[0] == "w2"
