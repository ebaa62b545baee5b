"""Live state the router decides on: worker heartbeats (aged out), observed TTFT/ITL per deployment
from completed attempts (windowed p95), recent failures, what the router itself sent since each
worker's last heartbeat, and which worker was last sent each prompt-prefix block.

It is also the gateway's one worker registry: the same heartbeats say which worker process still
holds an attempt (:meth:`LiveState.alive`) and how many workers of a pool are ready."""

from __future__ import annotations

import time
from bisect import bisect_left, insort
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from llmlab_common import rules
from llmlab_common.messages import HEARTBEAT_MISSES, AttemptEvent, Heartbeat
from llmlab_common.stats import quantile

from llmlab_routing.admission import WaitEstimate, predict_wait


@dataclass
class _Worker:
    hb: Heartbeat
    expires_at: float  # monotonic
    pending: int = 0  # sent by this router since the heartbeat (the heartbeat cannot count them yet)


class _Window:
    """Timed samples with their values also kept sorted, so the p95 of a decision costs an index
    and not a sort: every completed attempt changes the window, and sorting it per decision was
    the largest share of a decision's CPU (the shared-mode gateway's profile of the first
    ``cost_bench --router-ab`` run; docs/benchmarks.md)."""

    MAX = 512

    def __init__(self) -> None:
        self.samples: deque[tuple[float, float]] = deque()
        self._sorted: list[float] = []

    def add(self, t: float, v: float) -> None:
        if len(self.samples) == self.MAX:
            self._drop()
        self.samples.append((t, v))
        insort(self._sorted, v)

    def _drop(self) -> None:
        _, v = self.samples.popleft()
        del self._sorted[bisect_left(self._sorted, v)]

    def p95(self, now: float, window_s: float, min_samples: int) -> float | None:
        while self.samples and self.samples[0][0] < now - window_s:
            self._drop()
        if len(self.samples) < min_samples:
            return None
        return quantile(self._sorted, 0.95)


class _Outcomes:
    """Timed outcomes with a running count of failures (the rate is read on every decision)."""

    MAX = 256

    def __init__(self) -> None:
        self.items: deque[tuple[float, bool]] = deque()
        self.bad = 0

    def append(self, item: tuple[float, bool]) -> None:
        if len(self.items) == self.MAX:
            self._drop()
        self.items.append(item)
        self.bad += item[1]

    def _drop(self) -> None:
        self.bad -= self.items.popleft()[1]

    def rate(self, now: float, window_s: float) -> tuple[float, int]:
        while self.items and self.items[0][0] < now - window_s:
            self._drop()
        n = len(self.items)
        return (self.bad / n if n else 0.0), n


@dataclass
class DeploymentStats:
    ttft: _Window = field(default_factory=_Window)
    itl: _Window = field(default_factory=_Window)
    outcomes: _Outcomes = field(default_factory=_Outcomes)

    def failure_rate(self, now: float, window_s: float) -> tuple[float, int]:
        return self.outcomes.rate(now, window_s)


class LiveState:
    def __init__(self, affinity_capacity: int = 200_000) -> None:
        self.workers: dict[str, _Worker] = {}
        self._by_pool: dict[str, dict[str, _Worker]] = {}
        self.stats: dict[str, DeploymentStats] = {}
        self.rr: dict[str, int] = {}
        # block hash -> worker id last sent it (LRU-bounded: memory stays flat under unique prompts)
        self.affinity: OrderedDict[str, str] = OrderedDict()
        self.affinity_capacity = affinity_capacity

    # -- inputs ----------------------------------------------------------------------------------
    def on_heartbeat(self, hb: Heartbeat, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        w = _Worker(hb, now + HEARTBEAT_MISSES * hb.interval_s)
        old = self.workers.get(hb.worker_id)
        if old is not None and old.hb.pool != hb.pool:
            self._by_pool.get(old.hb.pool, {}).pop(hb.worker_id, None)
        self.workers[hb.worker_id] = w
        self._by_pool.setdefault(hb.pool, {})[hb.worker_id] = w

    def on_attempt(self, ev: AttemptEvent, now: float | None = None) -> None:
        failed = rules.counts_against_deployment(ev)
        if ev.source != "worker" and not failed:
            return
        now = time.monotonic() if now is None else now
        if failed:
            self.observe(ev.deployment, ok=False, now=now)
        elif ev.outcome == "completed":
            t = ev.timings
            ttft = t.ttft_s if t is not None else None
            itl = (t.itl_p95_s if t.itl_p95_s is not None else t.tpot_s) if t is not None else None
            self.observe(ev.deployment, ok=True, now=now, ttft_s=ttft, itl_s=itl)

    def observe(
        self, deployment: str, *, ok: bool, now: float, ttft_s: float | None = None, itl_s: float | None = None
    ) -> None:
        """One finished attempt of a deployment (events here; the twin's replay calls it directly)."""
        st = self.stats.setdefault(deployment, DeploymentStats())
        st.outcomes.append((now, not ok))
        if ttft_s is not None:
            st.ttft.add(now, ttft_s)
        if itl_s is not None:
            st.itl.add(now, itl_s)

    # -- reads -----------------------------------------------------------------------------------
    def live_entries(self, pool: str, now: float) -> tuple[list[Heartbeat], list[int]]:
        """Live, ready workers of a pool with what this router sent each since its heartbeat."""
        hbs, pending = [], []
        for w in self._by_pool.get(pool, {}).values():
            if w.expires_at > now and w.hb.ready and not w.hb.draining:
                hbs.append(w.hb)
                pending.append(w.pending)
        return hbs, pending

    def predicted_wait(
        self, pool: str, priority: int = 0, now: float | None = None, local_queued: int = 0
    ) -> WaitEstimate | None:
        """What a request of ``priority`` sent to ``pool`` now would wait for a worker
        (:mod:`llmlab_routing.admission`); ``local_queued``: what the caller itself published there
        that no worker took yet."""
        hbs = self.live_entries(pool, time.monotonic() if now is None else now)[0]
        return predict_wait(hbs, priority, local_queued)

    def alive(self, worker_id: str, instance_id: str = "", now: float | None = None) -> bool:
        """Beating within its TTL, and, when ``instance_id`` is given, still the same process (one
        restarted under the same id does not carry on its predecessor's attempts)."""
        w = self.workers.get(worker_id)
        if w is None or w.expires_at <= (time.monotonic() if now is None else now):
            return False
        return not instance_id or not w.hb.instance_id or w.hb.instance_id == instance_id

    def draining(self, worker_id: str) -> bool:
        """Its last heartbeat said it drains: it takes nothing more, even what was addressed to it."""
        w = self.workers.get(worker_id)
        return w is not None and w.hb.draining

    def takes_nothing(self, worker_id: str) -> bool:
        """Its last heartbeat said it drains, or that its engine is not ready (down, or loading its model
        again): it pulls nothing, even what was addressed to it, until that changes."""
        w = self.workers.get(worker_id)
        return w is not None and (w.hb.draining or not w.hb.ready)

    def ttl(self, worker_id: str) -> float:
        """How long this worker may stay silent before it counts as lost."""
        w = self.workers.get(worker_id)
        return HEARTBEAT_MISSES * (w.hb.interval_s if w is not None else 1.0)

    def live_ready(self, pool: str, now: float | None = None, excluding: str | None = None) -> int:
        """Live, ready, not draining workers of a pool (other than ``excluding``)."""
        hbs = self.live_entries(pool, time.monotonic() if now is None else now)[0]
        return sum(1 for hb in hbs if hb.worker_id != excluding)

    def pools(self) -> list[str]:
        return [pool for pool, workers in self._by_pool.items() if workers]

    def prefix_match(self, worker_id: str, hashes: list[str]) -> int:
        """How many leading blocks were last sent to this worker (stops at the first that was not)."""
        n = 0
        for h in hashes:
            if self.affinity.get(h) != worker_id:
                break
            n += 1
        return n

    # -- after a decision --------------------------------------------------------------------------
    def commit(self, deployment: str, worker_id: str | None, hashes: list[str]) -> None:
        self.rr[deployment] = self.rr.get(deployment, 0) + 1
        if worker_id is None:
            return
        w = self.workers.get(worker_id)
        if w is not None:
            w.pending += 1
        aff = self.affinity
        for h in hashes:
            aff[h] = worker_id
            aff.move_to_end(h)
        while len(aff) > self.affinity_capacity:
            aff.popitem(last=False)

    def prune(self, now: float) -> None:
        for wid in [w for w, s in self.workers.items() if s.expires_at < now - 60]:
            gone = self.workers.pop(wid)
            self._by_pool.get(gone.hb.pool, {}).pop(wid, None)
