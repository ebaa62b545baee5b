"""§3.4 eviction policies of the twin: keep-paid-users and the weighted score (weights as parameters)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from llmlab_twin.kvcache import KVConfig
from llmlab_twin.prefix import (
    EVICTION_POLICIES,
    CacheEntry,
    HashPrefixCache,
    WeightedScore,
    register_weighted,
)
from llmlab_twin.sched import FixedStepCost, StepScheduler, TwinConfig, TwinSeq, group_keys

pytestmark = pytest.mark.unit


def cache_with(policy: str) -> HashPrefixCache:
    return HashPrefixCache(SimpleNamespace(unused=0), policy)


def extent(c: HashPrefixCache, name: str, blocks: int, now: float, priority: int = 0) -> CacheEntry:
    """A released extent of ``blocks`` blocks at depth 0 (evictable from ``now`` on)."""
    c.release([], None, ("own", name), blocks, now, priority)
    e = c._lookup(None, ("own", name))
    assert e is not None and e.evictable and e.priority == priority
    return e


def victim(c: HashPrefixCache) -> object:
    e = c.policy.peek()
    return None if e is None else e.key


def test_new_policies_are_registered() -> None:
    assert {"keep-paid", "weighted", "lru", "largest", "cheapest"} <= set(EVICTION_POLICIES)


def test_keep_paid_evicts_the_free_tenant_first_even_if_recent() -> None:
    c = cache_with("keep-paid")
    extent(c, "paid", 2, now=1.0, priority=0)
    extent(c, "free", 2, now=5.0, priority=2)
    assert victim(c) == ("own", "free")
    assert c.evict(2) == 2 and c._lookup(None, ("own", "paid")) is not None
    lru = cache_with("lru")
    extent(lru, "paid", 2, now=1.0, priority=0)
    extent(lru, "free", 2, now=5.0, priority=2)
    assert victim(lru) == ("own", "paid")  # plain LRU would drop the paid tenant's entry


def test_weighted_score_terms_and_default_weights() -> None:
    c = cache_with("weighted")
    a = extent(c, "a", 4, now=0.0, priority=0)  # idle 10, biggest, most expensive, paid
    b = extent(c, "b", 1, now=10.0, priority=2)  # idle 0, small, cheap, free
    pol = c.policy
    assert isinstance(pol, WeightedScore) and pol.weights == (0.40, 0.25, 0.20, 0.15)
    scores = {e.key: s for s, e in pol.scores()}
    # a: idle 1, size 1, cost inverse min/cost = 1/16, tenant 0; b: 0, 0.25, 1, 1
    assert scores[a.key] == pytest.approx(0.40 + 0.25 + 0.20 / 16)
    assert scores[b.key] == pytest.approx(0.25 * 0.25 + 0.20 + 0.15)
    assert victim(c) == a.key


@pytest.mark.parametrize(
    ("weights", "expected"),
    [((1, 0, 0, 0), "old"), ((0, 1, 0, 0), "big"), ((0, 0, 1, 0), "cheap"), ((0, 0, 0, 1), "free")],
)
def test_weights_are_parameters(weights: tuple[float, ...], expected: str) -> None:
    name = register_weighted(weights)
    assert name.startswith("weighted:") and name in EVICTION_POLICIES
    c = cache_with(name)
    extent(c, "old", 2, now=0.0, priority=0)
    extent(c, "big", 8, now=5.0, priority=0)
    extent(c, "cheap", 1, now=5.0, priority=0)
    extent(c, "free", 2, now=6.0, priority=2)
    assert victim(c) == ("own", expected)


def test_weighted_rejects_bad_weights() -> None:
    with pytest.raises(ValueError, match="four non-negative"):
        register_weighted((0.5, 0.5))
    with pytest.raises(ValueError, match="four non-negative"):
        WeightedScore((1, -1, 0, 0))


def test_weighted_ranking_survives_reuse_and_partial_eviction() -> None:
    c = cache_with("weighted")
    extent(c, "x", 3, now=0.0)
    extent(c, "y", 3, now=1.0)
    assert c.evict(1) == 1  # x (idler) loses one block, keeps its place
    assert victim(c) == ("own", "x")
    c.match([], ("own", "x"), 10, now=2.0)  # reused: no longer evictable
    assert victim(c) == ("own", "y")
    assert c.evict(3) == 3 and victim(c) is None and c.evict(1) == 0


@pytest.mark.parametrize("style", ["vllm", "sglang"])
def test_scheduler_records_the_most_important_tenant_on_shared_blocks(style: str) -> None:
    kv = KVConfig(num_gpu_blocks=200, block_size=16, prefix_style=style, eviction_policy="keep-paid")
    s = StepScheduler(TwinConfig(max_num_seqs=4, max_num_batched_tokens=512, kv=kv), FixedStepCost(0.01))
    keys = group_keys("sys", 64, 16)
    free = TwinSeq("free", 100, 4, priority=2, keys=keys)
    s.add(free, 0.0)
    t = s.run_until_idle(0.0)
    cache = s.kv.cache
    assert cache is not None
    first = cache._lookup(None, keys[0])  # the first block: a root child in both styles
    assert first is not None and first.priority == 2
    paid = TwinSeq("paid", 100, 4, priority=0, keys=keys)
    s.add(paid, t)
    s.run_until_idle(t)
    assert paid.cached_tokens == 64 and first.priority == 0
