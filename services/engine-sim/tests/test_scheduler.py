"""The scheduler on a virtual clock: timings are exact, nothing waits on wall time."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from typing import Any

import pytest
from llmlab_engine_sim.engine import SimEngine
from llmlab_engine_sim.flavors import SglangMetrics, VllmMetrics
from llmlab_engine_sim.protocol import ParsedRequest
from llmlab_engine_sim.scheduler import (
    OutputPlan,
    RequestState,
    Scheduler,
    SchedulerConfig,
    SimRequest,
    VirtualClock,
)
from llmlab_engine_sim.settings import SimSettings

pytestmark = pytest.mark.unit

T0 = 1000.0
TTFT = 0.1
ITL = 0.05


def make_req(rid: str, n: int, reason: str = "stop", **kw: Any) -> SimRequest:
    return SimRequest(
        id=rid,
        prompt_tokens=10,
        plan=OutputPlan([f" t{i}" for i in range(n)], reason),
        token_times=[],
        **kw,
    )


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock(start=T0)


async def _started(sched: Scheduler) -> AsyncIterator[Scheduler]:
    sched.start()
    try:
        yield sched
    finally:
        await sched.stop()


@pytest.fixture
async def sched(clock: VirtualClock) -> AsyncIterator[Scheduler]:
    async for s in _started(Scheduler(SchedulerConfig(max_num_seqs=2, ttft_s=TTFT, itl_s=ITL), clock)):
        yield s


def approx(value: Any) -> Any:
    """Exact up to float rounding (pytest's default relative tolerance is 1 ms at T0 = 1000 s)."""
    return pytest.approx(value, rel=0, abs=1e-9)


async def test_single_request_ttft_and_itl_are_exact(sched: Scheduler, clock: VirtualClock) -> None:
    req = make_req("a", 5)
    sched.submit(req)
    await clock.run_until_idle()
    assert req.state is RequestState.DONE and req.finish_reason == "stop"
    assert req.token_times == approx([T0 + TTFT + k * ITL for k in range(5)])
    assert req.queue_time == approx(0.0)
    assert req.ttft == approx(TTFT)
    assert req.e2e == approx(TTFT + 4 * ITL)
    assert req.sink.take() == [f" t{i}" for i in range(5)] and req.sink.closed


async def test_ttft_that_is_not_a_multiple_of_itl(clock: VirtualClock) -> None:
    async for sched in _started(Scheduler(SchedulerConfig(4, ttft_s=0.123, itl_s=0.05), clock)):
        req = make_req("a", 3)
        sched.submit(req)
        await clock.run_until_idle()
        assert req.token_times == approx([T0 + 0.123, T0 + 0.173, T0 + 0.223])


async def test_max_num_seqs_queues_and_measures_queue_time(sched: Scheduler, clock: VirtualClock) -> None:
    reqs = [make_req(x, 4) for x in "abc"]
    for r in reqs:
        sched.submit(r)
    await clock.advance(0.01)
    assert (sched.num_running, sched.num_waiting) == (2, 1)
    assert reqs[2].state is RequestState.WAITING
    await clock.run_until_idle()
    a, b, c = reqs
    assert a.token_times == b.token_times == approx([T0 + 0.1, T0 + 0.15, T0 + 0.2, T0 + 0.25])
    # c gets the slot when a and b finish (0.25, a step boundary since ttft = 2 * itl).
    assert c.admitted_at == approx(T0 + 0.25)
    assert c.queue_time == approx(0.25)
    assert c.ttft == approx(0.25 + TTFT)
    assert c.token_times == approx([T0 + 0.35, T0 + 0.4, T0 + 0.45, T0 + 0.5])
    assert sched.snapshot() | {} == {
        "received": 3,
        "running": 0,
        "waiting": 0,
        "pending": 0,
        "aborted": 0,
        "finished": 3,
        "finished_by_reason": {"stop": 3},
        "prompt_tokens": 30,
        "generation_tokens": 12,
    }


async def test_busy_engine_admits_at_the_next_tick(clock: VirtualClock) -> None:
    async for sched in _started(Scheduler(SchedulerConfig(4, ttft_s=TTFT, itl_s=ITL), clock)):
        await _admits_at_the_next_tick(sched, clock)


async def _admits_at_the_next_tick(sched: Scheduler, clock: VirtualClock) -> None:
    a, b, c = make_req("a", 10), make_req("b", 3), make_req("c", 3)
    sched.submit(a)
    await clock.advance_to(T0 + 0.07)
    sched.submit(b)  # on a tick (1 ms grid anchored at a's admission): admitted at once
    await clock.advance_to(T0 + 0.0805)
    sched.submit(c)  # mid-tick: waits for the next one
    await clock.run_until_idle()
    assert b.queue_time == approx(0.0)
    assert b.token_times == approx([T0 + 0.17, T0 + 0.22, T0 + 0.27])
    assert c.admitted_at == approx(T0 + 0.081)
    assert c.queue_time == approx(0.0005)
    assert c.token_times == approx([T0 + 0.181, T0 + 0.231, T0 + 0.281])


async def test_strict_step_loop_admits_at_step_boundaries(clock: VirtualClock) -> None:
    config = SchedulerConfig(4, ttft_s=TTFT, itl_s=ITL, tick_s=ITL)  # one phase: a wake-up per ITL
    async for sched in _started(Scheduler(config, clock)):
        a, b = make_req("a", 10), make_req("b", 3)
        sched.submit(a)
        await clock.advance_to(T0 + 0.07)
        sched.submit(b)
        await clock.run_until_idle()
        assert b.admitted_at == approx(T0 + 0.1)  # boundaries every ITL from a's admission
        assert b.queue_time == approx(0.03)
        # b's tokens share a's emission ticks: one wake-up serves both.
        assert b.token_times == approx([T0 + 0.2, T0 + 0.25, T0 + 0.3])
        assert b.token_times is not None and a.token_times is not None
        assert set(b.token_times) <= set(a.token_times)


async def test_abort_frees_the_slot_at_once(clock: VirtualClock) -> None:
    async for sched in _started(Scheduler(SchedulerConfig(1, ttft_s=TTFT, itl_s=ITL), clock)):
        a, b = make_req("a", 100), make_req("b", 2)
        sched.submit(a)
        sched.submit(b)
        await clock.advance_to(T0 + 0.2)
        assert (sched.num_running, sched.num_waiting) == (1, 1)
        assert sched.abort("a") is True
        assert sched.num_running == 0  # before the loop even runs
        assert a.state is RequestState.ABORTED and a.finish_reason == "abort" and a.sink.closed
        assert a.generated == 3  # tokens at 0.1, 0.15, 0.2
        await clock.settle()
        assert (sched.num_running, sched.num_waiting) == (1, 0)
        await clock.run_until_idle()
        assert b.admitted_at == approx(T0 + 0.2)  # idle engine: admitted at once
        assert b.token_times == approx([T0 + 0.3, T0 + 0.35])
        assert sched.abort("a") is False and sched.abort("b") is False
        snap = sched.snapshot()
        assert (snap["aborted"], snap["finished"]) == (1, 1)


async def test_abort_while_waiting(sched: Scheduler, clock: VirtualClock) -> None:
    reqs = [make_req(x, 3) for x in "abc"]
    for r in reqs:
        sched.submit(r)
    await clock.advance(0.01)
    assert sched.abort("c")
    assert sched.num_waiting == 0
    await clock.run_until_idle()
    assert reqs[2].generated == 0 and reqs[2].admitted_at is None
    assert [r.state for r in reqs] == [RequestState.DONE, RequestState.DONE, RequestState.ABORTED]


async def test_lower_priority_value_is_admitted_first(clock: VirtualClock) -> None:
    async for sched in _started(Scheduler(SchedulerConfig(1, ttft_s=TTFT, itl_s=ITL), clock)):
        first, low, high = make_req("first", 2), make_req("low", 2, priority=5), make_req("high", 2, priority=-1)
        sched.submit(first)
        await clock.settle()  # first is running
        sched.submit(low)
        sched.submit(high)
        await clock.run_until_idle()
        assert first.admitted_at is not None and high.admitted_at is not None and low.admitted_at is not None
        assert first.admitted_at < high.admitted_at < low.admitted_at


async def test_future_arrival_waits_in_virtual_time(sched: Scheduler, clock: VirtualClock) -> None:
    req = make_req("a", 2, arrival=T0 + 5.0)
    sched.submit(req)
    await clock.settle()
    assert req.state is RequestState.PENDING and sched.num_pending == 1 and sched.num_waiting == 0
    await clock.run_until_idle()
    assert req.admitted_at == approx(T0 + 5.0)
    assert req.token_times == approx([T0 + 5.1, T0 + 5.15])


async def test_idle_scheduler_sets_no_timer(sched: Scheduler, clock: VirtualClock) -> None:
    await clock.settle()
    assert clock.next_deadline() is None
    sched.submit(make_req("a", 2))
    await clock.run_until_idle()
    assert clock.next_deadline() is None and sched.num_running == 0
    assert sched.alive


def _count_timers(clock: VirtualClock) -> list[int]:
    fired = [0]
    real_call_at = clock.call_at

    def counting_call_at(when: float, cb: Any) -> Any:
        def wrapped() -> None:
            fired[0] += 1
            cb()

        return real_call_at(when, wrapped)

    clock.call_at = counting_call_at  # type: ignore[method-assign]
    return fired


async def test_streams_admitted_together_share_one_wakeup_per_tick(clock: VirtualClock) -> None:
    fired = _count_timers(clock)
    async for sched in _started(Scheduler(SchedulerConfig(1000, ttft_s=TTFT, itl_s=ITL), clock)):
        reqs = [make_req(f"r{i}", 20) for i in range(1000)]
        for i, r in enumerate(reqs):
            if i == 500:
                await clock.advance(0.013)  # a second wave, in another phase
            sched.submit(r)
        await clock.run_until_idle()
        assert all(r.generated == 20 for r in reqs)
        assert sched.stats.generation_tokens == 20_000
        # 20 ticks per wave, not 20,000 timers.
        assert fired[0] <= 2 * 20 + 2


async def test_wakeups_are_bounded_by_phases_not_streams(clock: VirtualClock) -> None:
    fired = _count_timers(clock)
    config = SchedulerConfig(1000, ttft_s=TTFT, itl_s=ITL, tick_s=0.005)  # 10 phases
    async for sched in _started(Scheduler(config, clock)):
        reqs = [make_req(f"r{i}", 20) for i in range(1000)]
        for r in reqs:
            sched.submit(r)
            await clock.advance(0.0001)  # arrivals spread over 0.1 s, all phases in use
        await clock.run_until_idle()
        assert all(r.generated == 20 for r in reqs)
        for r in reqs:  # ITL stays exact whatever the phase
            assert r.token_times is not None
            assert [b - a for a, b in itertools.pairwise(r.token_times)] == approx([ITL] * 19)
        assert fired[0] <= config.phases * (20 + 2) + 20 + 1000 // 50


async def test_metrics_observe_every_phase(clock: VirtualClock) -> None:
    settings = SimSettings(max_num_seqs=1, ttft_ms=100, itl_ms=50)
    metrics = VllmMetrics(settings)
    async for sched in _started(Scheduler(SchedulerConfig(1, TTFT, ITL), clock, metrics)):
        metrics.bind(sched)
        sched.submit(make_req("a", 4))
        sched.submit(make_req("b", 4, reason="length"))
        await clock.run_until_idle()
    assert metrics.success["stop"] == 1 and metrics.success["length"] == 1
    assert metrics.generation_tokens == 8 and metrics.prompt_tokens == 20
    assert metrics.ttft.count == 2 and metrics.ttft.sum == approx(0.1 + (0.25 + 0.1))
    assert metrics.itl.count == 6 and metrics.itl.sum == approx(6 * ITL)
    assert metrics.queue.sum == approx(0.25)
    assert metrics.prefill.sum == approx(0.2)
    assert metrics.decode.sum == approx(0.3)
    assert metrics.e2e.sum == approx(0.25 + 0.5)


async def test_sglang_metrics_count_aborts(clock: VirtualClock) -> None:
    metrics = SglangMetrics(SimSettings(flavor="sglang"))
    async for sched in _started(Scheduler(SchedulerConfig(4, TTFT, ITL), clock, metrics)):
        metrics.bind(sched)
        sched.submit(make_req("a", 10))
        await clock.advance_to(T0 + 0.16)
        assert metrics.used_tokens() == 10 + 2
        sched.abort("a")
        await clock.run_until_idle()
    assert metrics.num_aborted == 1 and metrics.num_requests == 1
    assert metrics.generation_tokens == 2 and metrics.itl.count == 1


def _parsed(max_tokens: int | None = None, stop: list[str] | None = None, **kw: Any) -> ParsedRequest:
    return ParsedRequest(
        endpoint="completions",
        model="m",
        prompt_tokens=3,
        prompt_key=b"hello there",
        max_tokens=max_tokens,
        stop=stop or [],
        **kw,
    )


@pytest.mark.parametrize(
    ("max_tokens", "expected"),
    [(None, (8, "stop")), (100, (8, "stop")), (8, (8, "stop")), (3, (3, "length"))],
)
async def test_finish_reason_from_output_len_and_max_tokens(
    clock: VirtualClock, max_tokens: int | None, expected: tuple[int, str]
) -> None:
    engine = SimEngine(SimSettings(output_len=8), clock=clock)
    engine.scheduler.start()
    try:
        req = engine.new_request(_parsed(max_tokens))
        engine.scheduler.submit(req)
        await clock.run_until_idle()
        assert (req.generated, req.finish_reason) == expected
    finally:
        await engine.stop()


async def test_stop_string_ends_early_without_emitting_it(clock: VirtualClock) -> None:
    engine = SimEngine(SimSettings(output_len=8), clock=clock)
    full = engine.plan(_parsed()).tokens
    stop = full[3]  # e.g. " word" - with its leading space
    plan = engine.plan(_parsed(stop=[stop]))
    text = "".join(plan.tokens)
    assert plan.finish_reason == "stop"
    assert stop not in text and "".join(full).startswith(text)
    engine.scheduler.start()
    try:
        req = engine.new_request(_parsed(stop=[stop]))
        engine.scheduler.submit(req)
        await clock.run_until_idle()
        assert req.finish_reason == "stop" and "".join(req.sink.take()) == text
    finally:
        await engine.stop()


def test_ignore_eos_and_min_tokens() -> None:
    engine = SimEngine(SimSettings(output_len=8))
    plan = engine.plan(_parsed(max_tokens=20, ignore_eos=True))
    assert (len(plan.tokens), plan.finish_reason) == (20, "length")
    plan = engine.plan(_parsed(max_tokens=20, min_tokens=12))
    assert (len(plan.tokens), plan.finish_reason) == (12, "stop")
