"""GPU-time attribution: what each attempt cost in GPU time, idle time included. Pure logic.

Rule, per worker (one worker drives one engine on ``gpu_count`` GPUs of one deployment) and per
period [t0, t1):

1. Each attempt the worker ran is busy on the engine during its *prefill* interval
   [engine start + engine queue wait, first token] and its *decode* interval [first token, last
   token], from the worker's own timings (``started_at``, ``engine_queue_s``, ``ttft_s``,
   ``decode_s``). Engine queue wait is not GPU work for the request; when the engine does not
   report it (vLLM, SGLang: histogram only) prefill starts at the engine call.
2. At every instant the worker's GPU cost rate (``$/GPU-hour × gpu_count / 3600`` per second) is
   split among the attempts active at that instant in proportion to their weights: an attempt in
   prefill weighs ``prefill_weight`` (default 1), one in decode weighs 1. With weight 1 every
   sequence in the engine's running batch holds an equal share, which is what continuous batching
   gives each request; a larger prefill weight says a prefill step costs the batch more.
3. Time in the period when no attempt was active is idle. The idle cost of the period
   (rate × idle seconds) is spread over the period's attempts in proportion to their busy cost, so
   cost per request includes idle time (§12). If the worker's attempts in the period carry no
   timings at all, the period's cost is split equally among them.

4. A *standby* worker: alive in the period (its heartbeats, which accounting records) but with no
   attempt in it. It costs ``$/hour × gpu_count`` × the time its heartbeats cover in the period
   (each heartbeat covers ``[sent_at, sent_at + interval_s]``). Capacity kept for a deployment is
   a cost of serving that deployment's requests, so this cost is spread over the attempts of the
   same deployment in the period (on its other workers), in proportion to what they cost so far
   (``standby_usd``). When the deployment served nothing in the period, nobody's request can
   carry it: it stays in the standby worker's period row as unattributed cost.

Invariants (tested): every worker with at least one attempt in the period has
``attributed == $/hour × gpu_count × period hours``; a standby worker has ``attributed`` equal to
its cost when its deployment served attempts in the period, else 0; and the attempts' costs add up
to the sum of all workers' attributed costs. A worker that neither beat nor ran an attempt in a
period (or beat while accounting was down: heartbeats are core NATS) is not seen, and costs
nothing here.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Span:
    """One attempt's GPU occupancy on one worker, in epoch seconds."""

    worker_id: str
    request_id: str
    attempt: int
    deployment: str
    model: str
    usd_per_hour: float  # the deployment's GPU price × gpu_count
    prefill: tuple[float, float] | None
    decode: tuple[float, float] | None
    tokens: int = 0

    @classmethod
    def from_timings(
        cls,
        worker_id: str,
        request_id: str,
        attempt: int,
        deployment: str,
        model: str,
        usd_per_hour: float,
        started_at: float | None,
        engine_queue_s: float | None,
        ttft_s: float | None,
        decode_s: float | None,
        e2e_s: float | None,
        tokens: int = 0,
    ) -> Span:
        prefill = decode = None
        if started_at is not None:
            p0 = started_at + (engine_queue_s or 0.0)
            if ttft_s is not None:
                first = started_at + ttft_s
                prefill = (p0, max(p0, first))
                if decode_s is not None:
                    decode = (first, first + max(decode_s, 0.0))
                elif e2e_s is not None:
                    decode = (first, max(first, started_at + e2e_s))
            elif e2e_s is not None:  # ended before its first token: all of it was prefill
                prefill = (p0, max(p0, started_at + e2e_s))
        return cls(worker_id, request_id, attempt, deployment, model, usd_per_hour, prefill, decode, tokens)


@dataclass(slots=True)
class AttemptCost:
    worker_id: str
    request_id: str
    attempt: int
    deployment: str
    model: str
    busy_s: float = 0.0
    busy_usd: float = 0.0
    idle_usd: float = 0.0
    standby_usd: float = 0.0  # its share of the deployment's standby workers (rule 4)
    tokens: int = 0

    @property
    def own_usd(self) -> float:
        """What it cost its own worker (busy and idle time)."""
        return self.busy_usd + self.idle_usd

    @property
    def total_usd(self) -> float:
        return self.busy_usd + self.idle_usd + self.standby_usd


@dataclass(frozen=True, slots=True)
class Alive:
    """A worker known to be up over [start, end): one heartbeat and its interval."""

    worker_id: str
    deployment: str
    model: str
    usd_per_hour: float
    start: float
    end: float


@dataclass(slots=True)
class WorkerPeriod:
    worker_id: str
    deployment: str
    model: str
    usd_per_hour: float
    period_s: float  # the period, or for a standby worker the part of it its heartbeats cover
    busy_s: float = 0.0
    attempts: list[AttemptCost] = field(default_factory=list)
    spread_usd: float = 0.0  # a standby worker's cost carried by its deployment's attempts

    @property
    def period_usd(self) -> float:
        return self.usd_per_hour * self.period_s / 3600.0

    @property
    def attributed_usd(self) -> float:
        return sum(a.own_usd for a in self.attempts) + self.spread_usd


def _clip(iv: tuple[float, float] | None, t0: float, t1: float) -> tuple[float, float] | None:
    if iv is None:
        return None
    a, b = max(iv[0], t0), min(iv[1], t1)
    return (a, b) if b > a else None


def attribute(
    spans: list[Span], t0: float, t1: float, prefill_weight: float = 1.0, alive: Sequence[Alive] = ()
) -> list[WorkerPeriod]:
    """Attribute each worker's GPU cost over [t0, t1) to the spans that overlap it, and standby
    workers' cost (``alive`` intervals of workers without spans) to their deployment's spans."""
    if t1 <= t0:
        raise ValueError("empty period")
    by_worker: dict[str, list[Span]] = defaultdict(list)
    for s in spans:
        by_worker[s.worker_id].append(s)
    out: list[WorkerPeriod] = []
    for worker_id, ws in sorted(by_worker.items()):
        rate_h = max(s.usd_per_hour for s in ws)
        rate_s = rate_h / 3600.0
        wp = WorkerPeriod(worker_id, ws[0].deployment, ws[0].model, rate_h, t1 - t0)
        costs = [AttemptCost(worker_id, s.request_id, s.attempt, s.deployment, s.model, tokens=s.tokens) for s in ws]
        wp.attempts = costs
        # Sweep: +weight at an interval's start, -weight at its end.
        edges: list[tuple[float, int, int, float]] = []  # (time, order, index, weight)
        for i, s in enumerate(ws):
            for iv, w in ((_clip(s.prefill, t0, t1), prefill_weight), (_clip(s.decode, t0, t1), 1.0)):
                if iv is not None:
                    edges.append((iv[0], 1, i, w))
                    edges.append((iv[1], 0, i, -w))  # ends sort before starts at the same instant
        edges.sort()
        active: dict[int, float] = {}
        prev = t0
        for t, _order, i, w in edges:
            if t > prev and active:
                dt = t - prev
                total_w = sum(active.values())
                wp.busy_s += dt
                for j, wj in active.items():
                    costs[j].busy_usd += rate_s * dt * wj / total_w
                    costs[j].busy_s += dt
            prev = max(prev, t)
            nw = active.get(i, 0.0) + w
            if nw > 1e-12:
                active[i] = nw
            else:
                active.pop(i, None)
        idle_usd = wp.period_usd - sum(c.busy_usd for c in costs)
        busy_total = sum(c.busy_usd for c in costs)
        for c in costs:
            c.idle_usd = idle_usd * (c.busy_usd / busy_total if busy_total > 0 else 1.0 / len(costs))
        out.append(wp)
    out += _standby(out, [a for a in alive if a.worker_id not in by_worker], t0, t1)
    return out


def _covered(intervals: list[tuple[float, float]], t0: float, t1: float) -> float:
    """Seconds of [t0, t1) inside the union of ``intervals``."""
    total, reach = 0.0, t0
    for a, b in sorted(intervals):
        a, b = max(a, reach), min(b, t1)
        if b > a:
            total += b - a
            reach = b
    return total


def _standby(served: list[WorkerPeriod], alive: list[Alive], t0: float, t1: float) -> list[WorkerPeriod]:
    """Rule 4: periods of workers that were up without an attempt, their cost spread over the
    attempts of their deployment."""
    by_worker: dict[str, list[Alive]] = defaultdict(list)
    for a in alive:
        by_worker[a.worker_id].append(a)
    receivers: dict[str, list[AttemptCost]] = defaultdict(list)
    for wp in served:
        for c in wp.attempts:
            receivers[c.deployment].append(c)
    out: list[WorkerPeriod] = []
    for worker_id, beats in sorted(by_worker.items()):
        last = max(beats, key=lambda a: a.start)  # its newest heartbeat says what it runs
        up_s = _covered([(a.start, a.end) for a in beats], t0, t1)
        if up_s <= 0:
            continue
        wp = WorkerPeriod(worker_id, last.deployment, last.model, last.usd_per_hour, up_s)
        takers = receivers.get(last.deployment, [])
        if takers and wp.period_usd > 0:
            weights = [c.own_usd for c in takers]
            total_w = sum(weights)
            for c, w in zip(takers, weights, strict=True):
                c.standby_usd += wp.period_usd * (w / total_w if total_w > 0 else 1.0 / len(takers))
            wp.spread_usd = wp.period_usd
        out.append(wp)
    return out


def periods_covering(start: float, end: float, period_s: float) -> list[tuple[float, float]]:
    """The aligned periods that overlap [start, end), the last one clipped at ``end`` (an open
    period attributed early: the attribution loop's later run of the whole period replaces it)."""
    if end <= start:
        return []
    t0 = (start // period_s) * period_s
    out = []
    while t0 < end:
        out.append((t0, min(t0 + period_s, end)))
        t0 += period_s
    return out


def period_bounds(now: float, period_s: float, lag_s: float, lookback: int) -> list[tuple[float, float]]:
    """The closed periods to (re)compute at ``now``: the newest ``lookback`` periods that ended at
    least ``lag_s`` ago, aligned to multiples of ``period_s``."""
    newest_end = ((now - lag_s) // period_s) * period_s
    return [(newest_end - (k + 1) * period_s, newest_end - k * period_s) for k in reversed(range(lookback))]
