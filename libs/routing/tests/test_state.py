"""Live state: heartbeats age out, pending work counts until the next heartbeat, observed p95
replaces priors after enough samples, failures mark a deployment, the affinity table is bounded."""

from __future__ import annotations

import random

import numpy as np
import pytest
from llmlab_common.codes import Code
from llmlab_common.messages import AttemptEvent, ErrorInfo, Principal, RouteQuery, Timings
from llmlab_common.settings import DEFAULT_CATALOG
from llmlab_routing.config import load_router_catalog
from llmlab_routing.core import RouterCore
from llmlab_routing.state import DeploymentStats, LiveState
from llmlab_testkit.routing import heartbeat as hb

pytestmark = pytest.mark.unit


def done(dep: str, ttft: float, outcome: str = "completed") -> AttemptEvent:
    return AttemptEvent(
        request_id="r",
        attempt=1,
        outcome=outcome,  # type: ignore[arg-type]
        source="worker",
        pool="gpu-vllm",
        deployment=dep,
        model="m",
        endpoint="chat",
        principal=Principal(),
        timings=Timings(nats_queue_s=0, e2e_s=1, ttft_s=ttft, itl_p95_s=ttft / 10),
        created_at=0,
        ended_at=0,
    )


def test_dead_workers_age_out_and_pending_resets_on_heartbeat() -> None:
    st = LiveState()
    st.on_heartbeat(hb("w1", interval=1.0), now=100.0)
    assert [h.worker_id for h in st.live_entries("gpu-vllm", 102.9)[0]] == ["w1"]
    assert st.live_entries("gpu-vllm", 103.1)[0] == []
    st.commit("d", "w1", [])
    st.commit("d", "w1", [])
    assert st.workers["w1"].pending == 2
    st.on_heartbeat(hb("w1", in_flight=2), now=101.0)
    assert st.workers["w1"].pending == 0


def test_observed_latency_replaces_priors_after_min_samples() -> None:
    rc = load_router_catalog(DEFAULT_CATALOG)
    core = RouterCore(rc, clock=lambda: 1000.0)
    core.state.on_heartbeat(hb("w1"), now=1000.0)
    q = RouteQuery(request_id="r", model="meta-llama/Llama-3.1-8B-Instruct", prompt_tokens=10, max_output_tokens=10)
    view = core.build_inputs(q).deployments[0]
    assert (view.latency_source, view.ttft_p95_s) == ("prior", 0.25)
    for _ in range(rc.routing.min_samples):
        core.state.on_attempt(done("llama-8b-vllm", 0.9), now=999.0)
    view = core.build_inputs(q).deployments[0]
    assert view.latency_source == "observed" and view.ttft_p95_s == pytest.approx(0.9)
    # Outside the window the samples are gone and priors return.
    view = core.build_inputs(q, now=999.0 + rc.routing.stats_window_s + 1).deployments[0]
    assert view.latency_source == "prior"


def test_failures_are_counted_per_deployment() -> None:
    st = LiveState()
    for _ in range(3):
        st.on_attempt(done("a", 0.1, "engine_error"), now=10.0)
    st.on_attempt(done("a", 0.1), now=10.0)
    assert st.stats["a"].failure_rate(10.0, 60) == (0.75, 4)


def test_a_burst_of_queue_timeouts_leaves_the_deployment_routable() -> None:
    """Catches: the overload-to-outage path seen at 1,000 streams: queue timeouts (no worker took
    the attempt in time) counted as the deployment failing, after which the health filter refuses
    every request with 503 ``failing``."""
    rc = load_router_catalog(DEFAULT_CATALOG)
    core = RouterCore(rc, clock=lambda: 1000.0)
    core.state.on_heartbeat(hb("w1"), now=1000.0)
    queued = ErrorInfo(status=0, type="attempt", code=Code.QUEUE_TIMEOUT, message="queue wait exceeded")
    for _ in range(50):
        ev = done("llama-8b-vllm", 0.1, "abandoned").model_copy(update={"source": "gateway", "error": queued})
        core.state.on_attempt(ev, now=999.0)
    q = RouteQuery(request_id="r", model="meta-llama/Llama-3.1-8B-Instruct", prompt_tokens=10, max_output_tokens=10)
    view = core.build_inputs(q).deployments[0]
    assert view.failure_samples == 0
    # The same number of attempts a worker took and never answered do mark it failing.
    silent = done("llama-8b-vllm", 0.1, "abandoned").model_copy(update={"source": "gateway"})
    for _ in range(50):
        core.state.on_attempt(silent, now=999.0)
    assert core.build_inputs(q).deployments[0].failure_rate == 1.0


def test_affinity_follows_the_last_worker_and_is_bounded() -> None:
    st = LiveState(affinity_capacity=4)
    st.commit("d", "w1", ["h1", "h2", "h3"])
    assert st.prefix_match("w1", ["h1", "h2", "h3", "h4"]) == 3
    st.commit("d", "w2", ["h1"])
    assert st.prefix_match("w1", ["h1", "h2"]) == 0 and st.prefix_match("w2", ["h1", "h2"]) == 1
    st.commit("d", "w3", ["x1", "x2", "x3"])
    assert len(st.affinity) == 4


def test_engine_queue_and_overflow_count_as_queued_and_raise_the_ttft_estimate() -> None:
    rc = load_router_catalog(DEFAULT_CATALOG)
    core = RouterCore(rc, clock=lambda: 1000.0)
    busy = hb("w1", in_flight=8)
    busy.load.waiting = 3
    core.state.on_heartbeat(busy, now=1000.0)
    core.state.commit("llama-8b-vllm", "w1", [])  # sent since the heartbeat: beyond its 8 slots
    q = RouteQuery(request_id="r", model="meta-llama/Llama-3.1-8B-Instruct", prompt_tokens=10, max_output_tokens=10)
    view = core.build_inputs(q).deployments[0]
    w = view.workers[0]
    assert (w.in_flight, w.queued) == (9, 3 + 1)
    assert view.est_ttft_s() == pytest.approx(0.25 * (1 + 9 / 8 + 4))


def test_a_workers_own_queue_counts_as_its_load_where_engine_counts_tie() -> None:
    """Catches: a worker whose own queue grows keeps getting requests (the autoscale demo of
    2026-12-06: eight workers behind one engine all reported its running count, 4 of 4 slots, and the
    tie went to the same id every time while 46 requests waited in that worker's queue)."""
    rc = load_router_catalog(DEFAULT_CATALOG)
    core = RouterCore(rc, clock=lambda: 1000.0)
    for wid, backlog in (("a-first", 46), ("b-second", 0)):
        beat = hb(wid, in_flight=4, slots=4).model_copy(update={"addressed_by_priority": [0, backlog, 0, 0]})
        beat.load.running = 4  # the shared engine's count, the same in both heartbeats
        core.state.on_heartbeat(beat, now=1000.0)
    q = RouteQuery(request_id="r", model="meta-llama/Llama-3.1-8B-Instruct", prompt_tokens=10, max_output_tokens=10)
    views = {w.worker_id: w for w in core.build_inputs(q).deployments[0].workers}
    assert (views["a-first"].in_flight, views["a-first"].queued) == (4 + 46, 46)
    assert (views["b-second"].in_flight, views["b-second"].queued) == (4, 0)
    reply, _, _ = core.route(q)
    assert reply.targets[0].worker_id == "b-second"


def test_windows_kept_sorted_match_a_sort_of_what_is_left_after_expiry_and_overflow() -> None:
    """The window's p95 and failure rate, kept incrementally, against numpy over the samples that
    should remain: those within the window and, past the cap, only the newest."""
    rng = random.Random(7)
    st = DeploymentStats()
    kept: list[tuple[float, float, bool]] = []
    for i in range(3000):
        now = i * 0.05
        # Values falling then rising (a stale one would show in the p95), rounded so that some tie.
        v, bad = round(rng.random() + abs(1500 - i) / 300, 2), rng.random() < 0.2
        st.ttft.add(now, v)
        st.outcomes.append((now, bad))
        kept.append((now, v, bad))
        if i % 37 == 0:
            window = rng.choice([5.0, 20.0, 60.0])
            live = [x for x in kept[-512:] if x[0] >= now - window]
            got = st.ttft.p95(now, window, 1)
            assert got == pytest.approx(float(np.percentile([x[1] for x in live], 95))), i
            outcomes = [x for x in kept[-256:] if x[0] >= now - window]
            rate, n = st.failure_rate(now, window)
            assert n == len(outcomes) and rate == pytest.approx(sum(x[2] for x in outcomes) / n), i
            kept = [x for x in kept if x[0] >= now - window]  # what the window dropped stays dropped
