"""Prefix caching of the twin: vLLM's hash chain of full blocks and SGLang's radix tree, behind one
interface, with a pluggable eviction policy.

Granularity is one KV block (``block_size`` tokens) in both styles. A request describes its
prompt by *block keys*: ``keys[i]`` identifies the content of block ``i`` *and everything before
it* (a chain hash of real token ids, or ``(prefix_group, i)`` for a trace's shared prefix), so
two requests share block ``i`` exactly when their keys agree up to ``i``. Blocks after the keys
(the unique rest of the prompt, generated tokens) are not shareable with other requests; they are
kept as one anonymous *extent* per request, which only that request can hit again (recompute after
a preemption), as vLLM's own block hashes would allow.

Styles (the difference that matters for hit rates under memory pressure is what may be evicted):

* ``vllm`` (:class:`HashPrefixCache`): a table ``key -> block``. Any block no running request
  holds is evictable, also one in the middle of a chain (its successors stay cached but are
  unreachable until it is computed again, as with vLLM's block-hash map).
* ``sglang`` (:class:`RadixPrefixCache`): a tree; only unreferenced *leaves* are evictable, so a
  prefix always outlives its extensions (SGLang's RadixCache with ``page_size = block_size``;
  SGLang's default page size 1 also matches partial blocks, which the twin does not).

Accounting: every cached block is either held (``ref > 0``) or reclaimable (``ref == 0``);
reclaimable blocks count as free KV capacity, as both engines count them. Eviction order comes
from an :class:`EvictionPolicy` registered by name (:data:`EVICTION_POLICIES`).
"""

from __future__ import annotations

import heapq
import itertools
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Sequence
from typing import Protocol

__all__ = [
    "EVICTION_POLICIES",
    "CacheEntry",
    "EvictionPolicy",
    "HashPrefixCache",
    "KeepPaidUsers",
    "PrefixCache",
    "RadixPrefixCache",
    "WeightedScore",
    "make_prefix_cache",
    "recompute_cost",
    "register_policy",
    "register_weighted",
]


class CacheEntry:
    """One cached block (``key`` from the request's keys) or one request's extent (``blocks``
    contiguous blocks from block index ``start`` on, key ``("own", uid)``)."""

    __slots__ = (
        "blocks",
        "children",
        "created",
        "evictable",
        "hits",
        "key",
        "last_access",
        "parent",
        "priority",
        "ref",
        "start",
        "token",
    )

    def __init__(
        self,
        key: Hashable,
        blocks: int,
        start: int,
        parent: CacheEntry | None,
        now: float,
        created: int,
        priority: int = 0,
    ):
        self.key = key
        self.blocks = blocks
        self.start = start  # index of the first block (depth in the prompt, in blocks)
        self.parent = parent  # radix tree only
        self.children: dict[Hashable, CacheEntry] | None = None  # radix tree only
        self.ref = 1
        self.last_access = now
        self.hits = 0
        self.created = created
        self.evictable = False
        self.token = 0
        # Tenant priority (trace convention: lower = more important) of the most important request
        # that used the entry: a block a paid tenant needs counts as paid even if free users share it.
        self.priority = priority

    def __repr__(self) -> str:
        return f"CacheEntry({self.key!r}, blocks={self.blocks}, ref={self.ref})"


# -- eviction policies ------------------------------------------------------------------------------


class EvictionPolicy(ABC):
    """The set of evictable entries and their eviction order. ``add`` when an entry becomes
    evictable, ``discard`` when it stops being so (reused), ``peek`` the next victim."""

    name = "?"

    @abstractmethod
    def add(self, e: CacheEntry) -> None: ...

    @abstractmethod
    def discard(self, e: CacheEntry) -> None: ...

    @abstractmethod
    def peek(self) -> CacheEntry | None: ...


class HeapPolicy(EvictionPolicy):
    """Evicts the entry with the smallest :meth:`priority` first (lazy deletion)."""

    def __init__(self) -> None:
        self._heap: list[tuple[object, int, CacheEntry]] = []
        self._tokens = itertools.count(1)
        self._live = 0

    def priority(self, e: CacheEntry) -> object:
        raise NotImplementedError

    def __len__(self) -> int:
        return self._live

    def add(self, e: CacheEntry) -> None:
        if e.evictable:
            self._live -= 1
        e.evictable = True
        e.token = tok = next(self._tokens)
        heapq.heappush(self._heap, (self.priority(e), tok, e))
        self._live += 1
        if len(self._heap) > 2 * self._live + 256:
            self._heap = [item for item in self._heap if item[2].evictable and item[2].token == item[1]]
            heapq.heapify(self._heap)

    def discard(self, e: CacheEntry) -> None:
        if e.evictable:
            self._live -= 1
        e.evictable = False
        e.token = 0

    def peek(self) -> CacheEntry | None:
        heap = self._heap
        while heap:
            _, tok, e = heap[0]
            if e.evictable and e.token == tok:
                return e
            heapq.heappop(heap)
        return None


class LRU(HeapPolicy):
    """Least recently used first (vLLM's and SGLang's default)."""

    name = "lru"

    def priority(self, e: CacheEntry) -> object:
        return e.last_access


class FIFO(HeapPolicy):
    """Oldest cached first, however often it was reused."""

    name = "fifo"

    def priority(self, e: CacheEntry) -> object:
        return e.created


class LFU(HeapPolicy):
    """Fewest hits first, least recently used among equals."""

    name = "lfu"

    def priority(self, e: CacheEntry) -> object:
        return (e.hits, e.last_access)


class LargestFirst(HeapPolicy):
    """Biggest entry first (§3.4 "largest cache first")."""

    name = "largest"

    def priority(self, e: CacheEntry) -> object:
        return (-e.blocks, e.last_access)


class CheapestFirst(HeapPolicy):
    """Cheapest to recompute first: prefill cost of an entry grows with its depth in the prompt
    (attention over what precedes it) and its size (§3.4 "cheapest to recompute first")."""

    name = "cheapest"

    def priority(self, e: CacheEntry) -> object:
        return (e.blocks * (e.start + e.blocks), e.last_access)


def recompute_cost(e: CacheEntry) -> int:
    """Relative prefill cost of recomputing an entry: its blocks times their depth in the prompt
    (attention over everything before them), the same measure :class:`CheapestFirst` orders by."""
    return e.blocks * (e.start + e.blocks)


class KeepPaidUsers(HeapPolicy):
    """Evict the least important tenant's entries first (highest ``priority`` value; a block also
    used by a paid tenant counts as paid), least recently used among equals (§3.4 "keep paid users")."""

    name = "keep-paid"

    def priority(self, e: CacheEntry) -> object:
        return (-e.priority, e.last_access)


# §3.4's example weights: idle time, cache size, recompute-cost inverse, tenant-priority inverse.
DEFAULT_SCORE_WEIGHTS: tuple[float, float, float, float] = (0.40, 0.25, 0.20, 0.15)


class WeightedScore(EvictionPolicy):
    """§3.4's eviction score; the highest score is evicted first::

        score = w_idle·idle/max_idle + w_size·blocks/max_blocks
              + w_recompute·min_cost/cost + w_tenant·priority/max_priority

    Each term is normalised over the evictable entries at ranking time, so the ranking depends on
    the whole set (a heap keyed once per entry cannot express it). "Now" is the latest access time
    the policy has seen (entries become evictable when released, stamped with the release time):
    eviction calls carry no clock. The ranking is computed on the first :meth:`peek` after the set
    grew and reused for the evictions that follow (entries removed meanwhile are skipped), which
    costs O(n log n) per burst of evictions instead of per block."""

    name = "weighted"

    def __init__(self, weights: Sequence[float] = DEFAULT_SCORE_WEIGHTS) -> None:
        if len(weights) != 4 or any(w < 0 for w in weights):
            raise ValueError("weights: four non-negative numbers (idle, size, recompute inverse, tenant inverse)")
        self.weights = tuple(float(w) for w in weights)
        self._live: dict[int, CacheEntry] = {}
        self._ranking: list[CacheEntry] = []
        self._stale = True
        self.now = 0.0

    def __len__(self) -> int:
        return len(self._live)

    def add(self, e: CacheEntry) -> None:
        e.evictable = True
        self._live[id(e)] = e
        if e.last_access > self.now:
            self.now = e.last_access
        self._stale = True

    def discard(self, e: CacheEntry) -> None:
        e.evictable = False
        self._live.pop(id(e), None)

    def scores(self) -> list[tuple[float, CacheEntry]]:
        """(score, entry) for every evictable entry, highest score first."""
        entries = list(self._live.values())
        if not entries:
            return []
        now = self.now
        idle = [max(0.0, now - e.last_access) for e in entries]
        costs = [max(1, recompute_cost(e)) for e in entries]
        max_idle = max(idle) or 1.0
        max_blocks = max(e.blocks for e in entries) or 1
        min_cost = min(costs)
        max_prio = max(e.priority for e in entries)
        w_idle, w_size, w_cost, w_ten = self.weights
        scored = [
            (
                w_idle * i / max_idle
                + w_size * e.blocks / max_blocks
                + w_cost * min_cost / c
                + (w_ten * e.priority / max_prio if max_prio > 0 else 0.0),
                e,
            )
            for e, i, c in zip(entries, idle, costs, strict=True)
        ]
        # ties: least recently used first, then oldest
        scored.sort(key=lambda x: (-x[0], x[1].last_access, x[1].created))
        return scored

    def peek(self) -> CacheEntry | None:
        if self._stale:
            self._ranking = [e for _, e in reversed(self.scores())]  # best victim last: pop() is O(1)
            self._stale = False
        ranking = self._ranking
        while ranking:
            e = ranking[-1]
            if e.evictable and id(e) in self._live:
                return e
            ranking.pop()
        if self._live:  # everything ranked was taken back meanwhile: rank what is left
            self._stale = True
            return self.peek()
        return None


EVICTION_POLICIES: dict[str, Callable[[], EvictionPolicy]] = {}


def register_policy(name: str, factory: Callable[[], EvictionPolicy]) -> None:
    EVICTION_POLICIES[name] = factory


def register_weighted(weights: Sequence[float], name: str | None = None) -> str:
    """Register :class:`WeightedScore` with other weights (configs name policies by string);
    returns the name, ``weighted:<idle>,<size>,<recompute>,<tenant>`` unless given."""
    w = tuple(float(x) for x in weights)
    WeightedScore(w)  # validate now, not at the first eviction
    key = name or "weighted:" + ",".join(f"{x:g}" for x in w)
    register_policy(key, lambda: WeightedScore(w))
    return key


for _cls in (LRU, FIFO, LFU, LargestFirst, CheapestFirst, KeepPaidUsers, WeightedScore):
    register_policy(_cls.name, _cls)


# -- caches -----------------------------------------------------------------------------------------


class BlockSink(Protocol):
    """Where evicted blocks go (the KV manager's pool of never-used/free blocks)."""

    unused: int


class PrefixCache(ABC):
    """Shared interface of both styles. Entries returned by :meth:`match` and :meth:`insert` are
    held by the caller (``ref`` counted) until :meth:`release`."""

    style = "?"

    def __init__(self, pool: BlockSink, policy: EvictionPolicy | str = "lru") -> None:
        self.pool = pool
        self.policy = EVICTION_POLICIES[policy]() if isinstance(policy, str) else policy
        self.reclaimable = 0  # blocks of entries with ref == 0 (free capacity, still cached)
        self.cached_blocks = 0  # all blocks held by entries (held + reclaimable)
        self.evicted_blocks = 0
        self._created = itertools.count()

    # -- style-specific ----------------------------------------------------------------------

    @abstractmethod
    def _lookup(self, parent: CacheEntry | None, key: Hashable) -> CacheEntry | None: ...

    @abstractmethod
    def _link(self, parent: CacheEntry | None, e: CacheEntry) -> bool:
        """Add a new entry; False if its key is already cached (the caller keeps a duplicate)."""

    @abstractmethod
    def _unlink(self, e: CacheEntry) -> None: ...

    @abstractmethod
    def _eligible(self, e: CacheEntry) -> bool:
        """May this unreferenced entry be evicted now?"""

    # -- shared ------------------------------------------------------------------------------

    def _acquire(self, e: CacheEntry, now: float, priority: int = 0) -> None:
        if priority < e.priority:
            e.priority = priority
        if e.ref == 0:
            self.reclaimable -= e.blocks
            if e.evictable:
                self.policy.discard(e)
        e.ref += 1
        e.hits += 1
        e.last_access = now

    def match(
        self, keys: Sequence[Hashable], own_key: Hashable, max_blocks: int, now: float, priority: int = 0
    ) -> tuple[list[CacheEntry], CacheEntry | None]:
        """The longest cached prefix of ``keys`` (then the request's own extent, if it follows
        directly), at most ``max_blocks`` blocks; every returned entry is now held. ``priority``:
        the request's tenant priority (recorded on the entries for tenant-aware eviction)."""
        held: list[CacheEntry] = []
        parent: CacheEntry | None = None
        limit = min(len(keys), max_blocks)
        for i in range(limit):
            e = self._lookup(parent, keys[i])
            if e is None:
                break
            self._acquire(e, now, priority)
            held.append(e)
            parent = e
        own: CacheEntry | None = None
        n = len(held)
        if n < max_blocks and (n == len(keys) or not keys):
            e = self._lookup(parent, own_key)
            if e is not None and e.start == n and e.blocks > 0:
                want = max_blocks - n
                if e.blocks > want:  # more than may hit: hand the rest back as free blocks
                    drop = e.blocks - want
                    e.blocks = want
                    self.cached_blocks -= drop
                    if e.ref == 0:
                        self.reclaimable -= drop
                    self.pool.unused += drop
                self._acquire(e, now, priority)
                own = e
        return held, own

    def insert(
        self, key: Hashable, parent: CacheEntry | None, depth: int, now: float, priority: int = 0
    ) -> CacheEntry | None:
        """Cache a block the caller just filled (held by the caller); None if already cached."""
        e = CacheEntry(key, 1, depth, parent, now, next(self._created), priority)
        if not self._link(parent, e):
            return None
        self.cached_blocks += 1
        return e

    def release(
        self,
        held: Sequence[CacheEntry],
        own: CacheEntry | None,
        own_key: Hashable,
        own_blocks: int,
        now: float,
        priority: int = 0,
    ) -> None:
        """The request frees its blocks: its anonymous ``own_blocks`` join its extent (kept cached,
        evicted first: vLLM frees a request's blocks tail first), then its chain, tail first."""
        parent = held[-1] if held else None
        if own is None and own_blocks > 0:
            own = CacheEntry(own_key, 0, len(held), parent, now, next(self._created), priority)
            if not self._link(parent, own):  # a stale extent of the same request: replace it
                old = self._lookup(parent, own_key)
                if old is not None:
                    self._drop(old)
                self._link(parent, own)
        if own is not None:
            own.blocks += own_blocks
            self.cached_blocks += own_blocks
            self._release_one(own, now)
        for e in reversed(held):
            self._release_one(e, now)

    def _release_one(self, e: CacheEntry, now: float) -> None:
        e.ref -= 1
        e.last_access = now
        if e.ref == 0:
            if e.blocks == 0:
                self._unlink(e)
                return
            self.reclaimable += e.blocks
            if self._eligible(e):
                self.policy.add(e)

    def _drop(self, e: CacheEntry) -> None:
        """Forget an unreferenced entry entirely (its blocks go back to the pool)."""
        if e.evictable:
            self.policy.discard(e)
        if e.ref == 0:
            self.reclaimable -= e.blocks
        self.cached_blocks -= e.blocks
        self.pool.unused += e.blocks
        e.blocks = 0
        self._unlink(e)

    def evict(self, n: int) -> int:
        """Free ``n`` blocks (into the pool) by the policy's order; returns how many it freed."""
        freed = 0
        policy = self.policy
        while freed < n:
            e = policy.peek()
            if e is None:
                break
            take = min(n - freed, e.blocks)
            freed += take
            e.blocks -= take
            self.reclaimable -= take
            self.cached_blocks -= take
            if e.blocks == 0:
                policy.discard(e)
                self._unlink(e)
            # A partly evicted extent keeps its leading blocks and its place in the order.
        self.pool.unused += freed
        self.evicted_blocks += freed
        return freed

    def num_entries(self) -> int:
        raise NotImplementedError


class HashPrefixCache(PrefixCache):
    """vLLM: ``key -> block``; any unreferenced block is evictable (also inside a chain)."""

    style = "vllm"

    def __init__(self, pool: BlockSink, policy: EvictionPolicy | str = "lru") -> None:
        super().__init__(pool, policy)
        self._table: dict[Hashable, CacheEntry] = {}

    def _lookup(self, parent: CacheEntry | None, key: Hashable) -> CacheEntry | None:
        return self._table.get(key)

    def _link(self, parent: CacheEntry | None, e: CacheEntry) -> bool:
        if e.key in self._table:
            return False
        self._table[e.key] = e
        return True

    def _unlink(self, e: CacheEntry) -> None:
        if self._table.get(e.key) is e:
            del self._table[e.key]

    def _eligible(self, e: CacheEntry) -> bool:
        return True

    def num_entries(self) -> int:
        return len(self._table)


class RadixPrefixCache(PrefixCache):
    """SGLang: a radix tree of blocks; only unreferenced leaves are evictable."""

    style = "sglang"

    def __init__(self, pool: BlockSink, policy: EvictionPolicy | str = "lru") -> None:
        super().__init__(pool, policy)
        self._root: dict[Hashable, CacheEntry] = {}
        self._count = 0

    def _children(self, parent: CacheEntry | None) -> dict[Hashable, CacheEntry]:
        if parent is None:
            return self._root
        if parent.children is None:
            parent.children = {}
        return parent.children

    def _lookup(self, parent: CacheEntry | None, key: Hashable) -> CacheEntry | None:
        if parent is None:
            return self._root.get(key)
        children = parent.children
        return children.get(key) if children else None

    def _link(self, parent: CacheEntry | None, e: CacheEntry) -> bool:
        children = self._children(parent)
        if e.key in children:
            return False
        children[e.key] = e
        e.parent = parent
        self._count += 1
        if parent is not None and parent.evictable:
            self.policy.discard(parent)  # no longer a leaf
        return True

    def _unlink(self, e: CacheEntry) -> None:
        parent = e.parent
        children = self._root if parent is None else parent.children
        if children is not None and children.get(e.key) is e:
            del children[e.key]
            self._count -= 1
        if parent is not None and not parent.children and parent.ref == 0 and parent.blocks and not parent.evictable:
            self.policy.add(parent)  # became a leaf

    def _eligible(self, e: CacheEntry) -> bool:
        return not e.children

    def num_entries(self) -> int:
        return self._count


def make_prefix_cache(style: str, pool: BlockSink, policy: EvictionPolicy | str = "lru") -> PrefixCache:
    if style == "vllm":
        return HashPrefixCache(pool, policy)
    if style == "sglang":
        return RadixPrefixCache(pool, policy)
    raise ValueError(f"unknown prefix cache style {style!r} (vllm, sglang)")
