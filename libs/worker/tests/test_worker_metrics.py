"""The worker's metric families (docs/observability.md): every family labelled pool, ITL observed
for every gap between engine chunks, the phase histograms from the attempt's timings, and the
engine's own figures from its metrics, with a preemption counter that never goes down."""

from __future__ import annotations

import itertools

import pytest
from llmlab_common.messages import EngineLoad, Timings
from llmlab_common.metrics import Metrics, check_exposition
from llmlab_testkit.e2e import samples
from llmlab_worker.lifecycle import EngineLoadCollector, WorkerMetrics
from llmlab_worker_sglang.adapter import SglangAdapter
from llmlab_worker_vllm.adapter import VllmAdapter
from prometheus_client import generate_latest

pytestmark = pytest.mark.unit


def test_preemption_counter_stays_monotonic_when_the_engine_restarts() -> None:
    """Catches: the engine's counter copied as is (it drops to 0 on an engine restart, which
    Prometheus would read as a reset of ours, or a negative increase), or counted twice."""
    c = EngineLoadCollector("llmlab", "gpu-vllm", "vllm")
    seen: list[float | None] = []
    for v in (None, 5.0, 7.0, 2.0, 3.0, None, 1.0):
        c.update(EngineLoad(preemptions_total=v))
        seen.append(c.preemptions)
    assert seen == [None, 5.0, 7.0, 9.0, 10.0, 10.0, 11.0]
    assert all(b >= a for a, b in itertools.pairwise(seen[1:]))  # type: ignore[operator]


def test_engine_gauges_carry_pool_and_engine_and_are_absent_while_unknown() -> None:
    """Catches: a stale figure exported as 0 (a dashboard would read an idle engine), or a
    worker-specific label on the engine families."""
    m = Metrics("llmlab")
    wm = WorkerMetrics(m, "gpu-vllm", "vllm")
    wm.engine.update(EngineLoad(running=3, waiting=1, kv_cache_usage=0.5, batch_size=2.5, preemptions_total=4))
    s = samples(m)
    labels = '{engine="vllm",pool="gpu-vllm"}'
    assert s["llmlab_worker_engine_running_requests" + labels] == 3
    assert s["llmlab_worker_engine_waiting_requests" + labels] == 1
    assert s["llmlab_worker_engine_kv_cache_usage_ratio" + labels] == 0.5
    assert s["llmlab_worker_engine_batch_size" + labels] == 2.5
    assert s["llmlab_worker_engine_preemptions_total" + labels] == 4
    assert not any(k.startswith("llmlab_worker_engine_prefix_cache_hit_ratio") for k in s)
    wm.engine.update(EngineLoad())  # engine lost: gauges gone, the counter stays
    s = samples(m)
    assert not any(k.startswith("llmlab_worker_engine_running_requests") for k in s)
    assert s["llmlab_worker_engine_preemptions_total" + labels] == 4
    assert check_exposition(generate_latest(m.registry).decode()) == []


def test_timings_feed_every_phase_and_itl_observes_every_gap() -> None:
    """Catches: ITL observed once per attempt (its p50) instead of per gap, a phase the engine did
    not report observed as 0, or the phases swapped."""
    m = Metrics("llmlab")
    wm = WorkerMetrics(m, "gpu-vllm", "vllm")
    t = Timings(
        nats_queue_s=0.0, engine_queue_s=None, ttft_s=0.2, prefill_s=None, decode_s=0.06, e2e_s=0.3, tpot_s=0.02
    )
    wm.observe_timings(t, [10.0, 10.01, 10.03, 10.06])
    s = samples(m)
    p = '{pool="gpu-vllm"}'
    assert s["llmlab_worker_itl_seconds_count" + p] == 3
    assert s["llmlab_worker_itl_seconds_sum" + p] == pytest.approx(0.06)
    assert s['llmlab_worker_itl_seconds_bucket{le="0.01",pool="gpu-vllm"}'] == 1  # the 10 ms gap
    assert s["llmlab_worker_ttft_seconds_sum" + p] == pytest.approx(0.2)
    assert s["llmlab_worker_decode_seconds_sum" + p] == pytest.approx(0.06)
    assert s["llmlab_worker_tpot_seconds_sum" + p] == pytest.approx(0.02)
    assert s["llmlab_worker_engine_queue_seconds_count" + p] == 0
    assert s["llmlab_worker_prefill_seconds_count" + p] == 0
    assert s["llmlab_worker_e2e_seconds_count" + p] == 1


def test_engine_load_reads_preemptions_and_the_batch_size_per_engine() -> None:
    """Catches: the batch size taken from the histogram's running totals instead of the window,
    the running count used although vLLM's tokens-per-step histogram is there, or SGLang's
    missing preemption counter read as 0."""
    v = VllmAdapter("http://x", 4)
    base = {"vllm:num_requests_running": 3.0, "vllm:num_preemptions_total": 2.0}
    hist = {"vllm:iteration_tokens_total_sum": 1000.0, "vllm:iteration_tokens_total_count": 10.0}
    first = v.load_from_metrics(base | hist)
    assert (first.preemptions_total, first.batch_size) == (2.0, None)  # no window yet
    later = v.load_from_metrics(
        base | {"vllm:iteration_tokens_total_sum": 1600.0, "vllm:iteration_tokens_total_count": 14.0}
    )
    assert later.batch_size == pytest.approx(150.0)
    idle = v.load_from_metrics(
        base | {"vllm:iteration_tokens_total_sum": 1600.0, "vllm:iteration_tokens_total_count": 14.0}
    )
    assert idle.batch_size == 0.0
    no_hist = VllmAdapter("http://x", 4).load_from_metrics(base)  # the simulator has no such histogram
    assert no_hist.batch_size == 3.0
    s = SglangAdapter("http://x", 4).load_from_metrics({"sglang:num_running_reqs": 5.0})
    assert (s.running, s.batch_size, s.preemptions_total) == (5.0, 5.0, None)
    s = SglangAdapter("http://x", 4).load_from_metrics(
        {"sglang:num_running_reqs": 5.0, "sglang:num_retracted_requests_total": 7.0}
    )
    assert s.preemptions_total == 7.0
    assert EngineLoad.model_validate({"running": 1.0}).preemptions_total is None  # old heartbeats parse
