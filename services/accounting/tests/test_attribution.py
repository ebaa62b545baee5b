"""GPU-time attribution: the invariants (attributed == $/h × hours per worker, idle and standby
workers included) and the sharing rules."""

from __future__ import annotations

import random

import pytest
from llmlab_accounting.attribution import Alive, Span, attribute, period_bounds

pytestmark = pytest.mark.unit


def span(rid: str, prefill: tuple[float, float] | None, decode: tuple[float, float] | None, **kw: object) -> Span:
    fields: dict[str, object] = {"worker_id": "w1", "deployment": "d", "model": "m", "usd_per_hour": 3.6}
    fields.update(kw)
    return Span(request_id=rid, attempt=1, prefill=prefill, decode=decode, **fields)  # type: ignore[arg-type]


def test_one_request_alone_pays_the_whole_period_including_idle() -> None:
    [wp] = attribute([span("a", (10, 11), (11, 20))], 0, 100)
    [c] = wp.attempts
    assert wp.period_usd == pytest.approx(0.1)  # $3.6/h × 100 s
    assert c.busy_usd == pytest.approx(0.01) and c.idle_usd == pytest.approx(0.09)
    assert wp.busy_s == pytest.approx(10)


def test_overlap_is_shared_and_idle_follows_busy_share() -> None:
    # a: busy 0..10, b: busy 5..10 → 0..5 a alone, 5..10 shared; 10..20 idle.
    [wp] = attribute([span("a", (0, 1), (1, 10)), span("b", (5, 6), (6, 10))], 0, 20)
    a, b = wp.attempts
    rate = 3.6 / 3600
    assert a.busy_usd == pytest.approx(rate * (5 + 2.5)) and b.busy_usd == pytest.approx(rate * 2.5)
    assert a.idle_usd / b.idle_usd == pytest.approx(3.0)
    assert wp.attributed_usd == pytest.approx(rate * 20)


def test_prefill_weight() -> None:
    # 0..2: a in prefill (weight 3) with b in decode (weight 1).
    [wp] = attribute([span("a", (0, 2), None), span("b", None, (0, 2))], 0, 2, prefill_weight=3.0)
    a, b = wp.attempts
    assert a.busy_usd == pytest.approx(3 * b.busy_usd)


def test_spans_are_clipped_to_the_period_and_attempts_without_timings_share_equally() -> None:
    [wp] = attribute([span("a", (-50, -40), (-40, 50))], 0, 10)
    assert wp.attempts[0].busy_s == pytest.approx(10)
    [wp] = attribute([span("x", None, None), span("y", None, None)], 0, 36)
    assert [c.total_usd for c in wp.attempts] == pytest.approx([0.018, 0.018])


@pytest.mark.parametrize("seed", range(20))
def test_invariant_attributed_equals_rate_times_hours_per_worker(seed: int) -> None:
    rng = random.Random(seed)
    t0, t1 = 1000.0, 1000.0 + rng.uniform(1, 3600)
    spans = []
    rates = {f"w{i}": rng.choice([0.08, 2.99, 5.98]) for i in range(3)}
    for i in range(rng.randint(1, 300)):
        w = rng.choice(list(rates))
        start = rng.uniform(t0 - 100, t1 + 10)
        ttft = rng.uniform(0, 5)
        dec = rng.uniform(0, 60)
        spans.append(
            Span.from_timings(
                w,
                f"r{i}",
                1,
                "d",
                "m",
                rates[w],
                start,
                rng.choice([None, 0.1]),
                ttft,
                rng.choice([dec, None]),
                ttft + dec,
            )
        )
    periods = attribute(spans, t0, t1, prefill_weight=rng.choice([1.0, 2.5]))
    for wp in periods:
        assert wp.attributed_usd == pytest.approx(rates[wp.worker_id] * (t1 - t0) / 3600, rel=1e-9)
        assert all(c.busy_usd >= -1e-15 and c.idle_usd >= -1e-12 for c in wp.attempts)
        assert wp.busy_s <= (t1 - t0) + 1e-9


def beats(worker: str, start: float, end: float, every: float = 1.0, **kw: object) -> list[Alive]:
    fields: dict[str, object] = {"deployment": "d", "model": "m", "usd_per_hour": 3.6}
    fields.update(kw)
    n = int((end - start) / every)
    return [Alive(worker, start=start + k * every, end=start + (k + 1) * every, **fields) for k in range(n)]  # type: ignore[arg-type]


def test_a_standby_worker_costs_its_deployment_s_requests() -> None:
    # w1 serves a and b over the whole period; w2 is up for 50 of its 100 s and serves nothing.
    served = [span("a", (10, 11), (11, 20)), span("b", (30, 31), (31, 40))]
    w1, w2 = attribute(served, 0, 100, alive=beats("w2", 50, 150) + beats("w1", 0, 100))
    assert (w1.worker_id, w2.worker_id) == ("w1", "w2") and w2.attempts == []
    assert w2.period_s == pytest.approx(50) and w2.period_usd == pytest.approx(0.05)
    a, b = w1.attempts
    # Spread in proportion to what the attempts cost their own worker (equal here).
    assert a.standby_usd == pytest.approx(0.025) and b.standby_usd == pytest.approx(0.025)
    assert w1.attributed_usd == pytest.approx(w1.period_usd) and w2.attributed_usd == pytest.approx(0.05)
    assert a.total_usd + b.total_usd == pytest.approx(w1.period_usd + w2.period_usd)


def test_standby_of_a_deployment_that_served_nothing_stays_unattributed() -> None:
    served = [span("a", (10, 11), (11, 20))]
    w1, w9 = attribute(served, 0, 100, alive=beats("w9", -5, 30, every=5, deployment="other"))
    assert w9.period_s == pytest.approx(30) and w9.attributed_usd == 0 and w9.spread_usd == 0
    assert w1.attempts[0].standby_usd == 0 and w1.attributed_usd == pytest.approx(w1.period_usd)


def test_overlapping_and_late_heartbeats_count_once() -> None:
    alive = [Alive("w2", "d", "m", 3.6, 0, 10), Alive("w2", "d", "m", 3.6, 5, 15), Alive("w2", "d", "m", 3.6, 90, 130)]
    [w2] = attribute([], 0, 100, alive=alive)
    assert w2.period_s == pytest.approx(25)
    assert attribute([], 0, 100, alive=[Alive("w3", "d", "m", 3.6, 100, 101)]) == []


@pytest.mark.parametrize("seed", range(20))
def test_invariant_attempts_carry_every_attributed_dollar(seed: int) -> None:
    rng = random.Random(seed)
    t0, t1 = 0.0, rng.uniform(10, 600)
    deployments = ["d1", "d2", "d3"]
    spans = [
        span(
            f"r{i}",
            (s, s + 0.5),
            (s + 0.5, s + rng.uniform(0.5, 30)),
            worker_id=f"w{i % 3}",
            deployment=f"d{i % 3 + 1}",
        )
        for i, s in enumerate(rng.uniform(-20, t1) for _ in range(rng.randint(0, 40)))
    ]
    alive = [
        a
        for k in range(5)
        for a in beats(
            f"s{k}", rng.uniform(-30, t1), t1 + 30, every=rng.choice([1.0, 5.0]), deployment=rng.choice(deployments)
        )
    ]
    periods = attribute(spans, t0, t1, alive=alive)
    attempts_total = sum(c.total_usd for wp in periods for c in wp.attempts)
    assert attempts_total == pytest.approx(sum(wp.attributed_usd for wp in periods), rel=1e-9, abs=1e-12)
    served = {c.deployment for wp in periods for c in wp.attempts}
    for wp in periods:
        assert wp.period_s <= t1 - t0 + 1e-9
        if wp.attempts or wp.deployment in served:
            assert wp.attributed_usd == pytest.approx(wp.period_usd, rel=1e-9)
        else:
            assert wp.attributed_usd == 0


def test_from_timings_splits_prefill_and_decode() -> None:
    s = Span.from_timings("w", "r", 1, "d", "m", 1.0, 100.0, 0.2, 0.5, 2.0, 2.6)
    assert s.prefill == (100.2, 100.5) and s.decode == (100.5, 102.5)
    cancelled = Span.from_timings("w", "r", 1, "d", "m", 1.0, 100.0, None, None, None, 1.0)
    assert cancelled.prefill == (100.0, 101.0) and cancelled.decode is None


def test_period_bounds_are_aligned_and_lag_behind_now() -> None:
    assert period_bounds(1000.0, 60, 30, 2) == [(840.0, 900.0), (900.0, 960.0)]
