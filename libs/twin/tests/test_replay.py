"""Virtual-time replay: dispatch, summary figures, cost arithmetic."""

from __future__ import annotations

import pytest
from llmlab_twin import replay
from llmlab_twin import trace as tr
from llmlab_twin.kvcache import KVConfig
from llmlab_twin.replay import Slo, VirtualSetup, run_virtual, summarize
from llmlab_twin.sched import FixedStepCost, LinearCost, TwinConfig
from llmlab_twin.trace import TraceRequest

pytestmark = pytest.mark.unit

SLO = {"interactive": Slo(ttft_s=0.05, tpot_s=0.02, queue_s=5.0), "batch": Slo(e2e_s=600, queue_s=60)}


def setup(workers: int = 1, dispatch: str = "round-robin", usd: float | None = 3.6) -> VirtualSetup:
    cfg = TwinConfig(max_num_seqs=16, max_num_batched_tokens=256, kv=KVConfig(num_gpu_blocks=1000, block_size=16))
    return VirtualSetup(workers=workers, dispatch=dispatch, config=cfg, usd_per_hour=usd)


def reqs(n: int, gap: float = 1.0, prompt: int = 100, output: int = 10) -> list[TraceRequest]:
    return [TraceRequest(t=i * gap, id=f"r{i}", prompt_tokens=prompt, output_tokens=output) for i in range(n)]


def test_hand_computed_summary() -> None:
    # One request every second, 100 prompt tokens (one 10 ms step), then 9 decode steps.
    st = setup()
    workers, seqs, t_end = run_virtual(reqs(10), FixedStepCost(0.01), st)
    s = summarize(workers, seqs, t_end, st, SLO, duration=10.0)
    assert s["simulated"] is True
    assert s["finished"] == 10 and s["steps"] == 100
    assert t_end == pytest.approx(9.1)
    assert s["ttft_s"]["p50"] == pytest.approx(0.01) and s["tpot_s"]["p50"] == pytest.approx(0.01)
    assert s["itl_s"]["p99"] == pytest.approx(0.01)
    assert s["slo_attainment"] == 1.0 and s["goodput_rps"] == pytest.approx(1.0)
    # cost: 3.6 $/h x 10 s = 0.01 $ for 10 x 110 tokens -> 0.01 / 1100 * 1e6
    assert s["cost_usd"] == pytest.approx(0.01)
    assert s["cost_per_1m_tokens_usd"] == pytest.approx(0.01 / 1100 * 1e6, rel=1e-4)
    assert s["gpu_busy_fraction"] == pytest.approx(0.1)
    assert s["overspend"] == "n/a"


def test_slo_misses_count_against_goodput() -> None:
    st = setup()
    # 20 requests at once on one worker with a 256-token budget: later ones wait for prefill
    workers, seqs, t_end = run_virtual(reqs(20, gap=0.0), FixedStepCost(0.01), st)
    s = summarize(workers, seqs, t_end, st, SLO, duration=1.0)
    assert 0 < s["slo_attainment"] < 1
    met = s["slo_attainment_by_class"]["interactive"]["met"]
    assert s["goodput_rps"] == pytest.approx(met / s["simulated_duration_s"])


def test_dispatch_round_robin_and_least_loaded() -> None:
    st = setup(workers=2, dispatch="round-robin")
    workers, seqs, _ = run_virtual(reqs(10, gap=0.0), FixedStepCost(0.01), st)
    assert [s.worker for s in seqs] == [0, 1] * 5
    st = setup(workers=2, dispatch="least-loaded")
    workers, seqs, _ = run_virtual(reqs(6, gap=0.0), FixedStepCost(0.01), st)
    assert sorted(w.stats.received for w in workers) == [3, 3]


def test_custom_picker_and_determinism() -> None:
    st = setup(workers=3)
    _, seqs, _ = run_virtual(reqs(9, gap=0.1), FixedStepCost(0.01), st, pick=lambda ws, s: 2)
    assert {s.worker for s in seqs} == {2}
    trace = tr.generate(rate=20, duration=20, seed=3, shared_share=0.5)
    st = setup(workers=2, dispatch="least-loaded")
    a, _, _ = replay.replay_trace(trace, st, LinearCost(), slo=SLO)
    b, _, _ = replay.replay_trace(trace, st, LinearCost(), slo=SLO)
    a.pop("replay_wall_s"), b.pop("replay_wall_s")
    assert a == b
    assert a["prefix_cache_hits"] > 0


def test_markdown_is_labelled_simulated() -> None:
    st = setup()
    workers, seqs, t_end = run_virtual(reqs(3), FixedStepCost(0.01), st)
    md = replay.markdown(summarize(workers, seqs, t_end, st, SLO))
    headings = [line for line in md.splitlines() if line.startswith("#")]
    assert headings and all("imulated" in h for h in headings)


def test_catalog_slo_classes_load() -> None:
    slo = replay.load_slo_classes()
    assert "interactive" in slo and slo["interactive"].ttft_s is not None
