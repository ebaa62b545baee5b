"""Pure logic of llmlab_lab.twin_calibrate_cpu: cells and prompts, run statistics, the comparison table, the
closed-loop twin driver and both fits on synthetic points (no vLLM, no network)."""

from __future__ import annotations

import math

import pytest
from llmlab_lab.twin_calibrate import MeasuredPoint, predict
from llmlab_lab.twin_calibrate_cpu import (
    FIT_CELLS,
    WORKLOADS,
    Cell,
    EngineConfig,
    combine_runs,
    compare,
    engine_from_servers,
    error_pct,
    error_summary,
    fit_in_loop,
    fit_steady,
    make_cells,
    points_from_cells,
    prompt_ids,
    simulate_all,
    simulate_cell,
    summarise_records,
)
from llmlab_twin.hwcatalog import get_device, get_model
from llmlab_twin.roofline import EfficiencyParams, RooflineCostModel
from llmlab_twin.sched import LinearCost

pytestmark = pytest.mark.unit

ENGINE = EngineConfig()
TRUE = EfficiencyParams(compute_eff=0.35, bw_eff=0.6, step_overhead_s=0.02, token_overhead_s=0.0)


def test_grid_has_the_fit_cells_and_unique_ids() -> None:
    cells = make_cells()
    ids = [c.id for c in cells]
    assert len(ids) == len(set(ids))
    assert set(FIT_CELLS) <= set(ids)
    assert {c.concurrency for c in cells} == {1, 8, 32}
    assert {c.prefix_caching for c in cells} == {True, False}
    assert {c.id for c in make_cells(quick=True)} <= set(ids)


def test_prompt_ids_lengths_and_sharing() -> None:
    shared = Cell(WORKLOADS["shared"], 8, True, 1)
    a, b = prompt_ids(shared, 1, 0, 0), prompt_ids(shared, 1, 3, 0)
    assert len(a) == len(b) == 544
    assert a[:512] == b[:512] and a[512:] != b[512:]  # one shared prefix per cell and run, unique tails
    assert prompt_ids(shared, 2, 0, 0)[:512] != a[:512]  # another run starts cold
    assert prompt_ids(shared, 1, 0, 0) == a  # deterministic
    short = Cell(WORKLOADS["short"], 1, False, 2)
    s0, s1 = prompt_ids(short, 1, 0, 0), prompt_ids(short, 1, 0, 1)
    assert len(s0) == 128 and s0[:16] != s1[:16]


def test_summarise_records_and_combine_runs() -> None:
    recs = [
        {"ok": True, "ttft_s": 0.1, "itls_s": [0.01, 0.03], "tpot_s": 0.02, "output_tokens": 3},
        {"ok": True, "ttft_s": 0.3, "itls_s": [0.02, 0.02], "tpot_s": 0.02, "output_tokens": 3},
        {"ok": False, "ttft_s": 9.0, "itls_s": [9.0], "tpot_s": None, "output_tokens": None},
    ]
    s = summarise_records(recs, window_s=2.0)
    assert s["ok"] == 2 and s["requests"] == 3
    assert s["ttft_p50_s"] == pytest.approx(0.2)
    assert s["itl_p50_s"] == pytest.approx(0.02)
    assert s["output_tok_s"] == pytest.approx(3.0)
    assert s["requests_s"] == pytest.approx(1.0)
    c = combine_runs([{"x": 1.0}, {"x": 3.0}, {"x": None}], ["x", "y"])
    assert c["x"] == 2.0 and c["x_spread_pct"] == pytest.approx(100.0)
    assert c["y"] is None and c["y_spread_pct"] is None


def test_error_pct_and_compare_table() -> None:
    assert error_pct(110.0, 100.0) == pytest.approx(10.0)
    assert error_pct(None, 1.0) is None and error_pct(1.0, 0.0) is None and error_pct(math.nan, 1.0) is None
    measured = {
        "short-c1-pcoff": {"ttft_p50_s": 1.0, "itl_p50_s": 0.1, "output_tok_s": 10.0, "ttft_p50_s_spread_pct": 5.0},
        "short-c8-pcoff": {"ttft_p50_s": 2.0, "itl_p50_s": 0.2, "output_tok_s": 20.0},
    }
    simulated = {
        "short-c1-pcoff": {"ttft_p50_s": 1.5, "itl_p50_s": 0.1, "output_tok_s": 8.0},
        "short-c8-pcoff": {"ttft_p50_s": 1.0, "itl_p50_s": None, "output_tok_s": 30.0},
    }
    rows = compare(measured, simulated)
    assert len(rows) == 6
    r = {(x["cell"], x["figure"]): x for x in rows}
    assert r["short-c1-pcoff", "ttft_p50_s"]["error_pct"] == pytest.approx(50.0)
    assert r["short-c1-pcoff", "ttft_p50_s"]["measured_spread_pct"] == 5.0
    assert r["short-c1-pcoff", "output_tok_s"]["error_pct"] == pytest.approx(-20.0)
    assert r["short-c1-pcoff", "ttft_p50_s"]["split"] == "fit"
    assert r["short-c8-pcoff", "ttft_p50_s"]["split"] == "holdout"
    assert r["short-c8-pcoff", "itl_p50_s"]["error_pct"] is None
    summ = {(s["split"], s["figure"]): s for s in error_summary(rows)}
    assert summ["fit", "ttft_p50_s"]["mean_abs_err_pct"] == pytest.approx(50.0)
    assert summ["holdout", "output_tok_s"]["mean_abs_err_pct"] == pytest.approx(50.0)
    assert math.isinf(summ["holdout", "itl_p50_s"]["max_abs_err_pct"])  # a missing figure is a miss, not a pass
    assert summ["fit", "itl_p50_s"]["within_20pct"] == 1


def test_closed_loop_twin_single_stream_is_sequential() -> None:
    cost = LinearCost(base_s=0.01, per_prefill_token_s=1e-3, per_decode_seq_s=0.0)
    cell = Cell(WORKLOADS["short"], 1, False, 3)
    s = simulate_cell(cell, cost, ENGINE, num_gpu_blocks=100)
    prefill = 0.01 + 128 * 1e-3
    assert s["simulated"] is True and s["ok"] == 3
    assert s["ttft_p50_s"] == pytest.approx(prefill)  # nobody queues at C=1
    assert s["itl_p50_s"] == pytest.approx(0.01)
    per_request = prefill + 31 * 0.01
    assert s["window_s"] == pytest.approx(3 * per_request)  # back to back, no gap
    assert s["output_tok_s"] == pytest.approx(96 / (3 * per_request))
    gap = simulate_cell(cell, cost, ENGINE, num_gpu_blocks=100, client_gap_s=0.5)
    assert gap["window_s"] == pytest.approx(3 * per_request + 2 * 0.5)


def test_closed_loop_twin_prefix_cache_and_concurrency() -> None:
    cost = LinearCost(base_s=0.01, per_prefill_token_s=1e-3, per_decode_seq_s=1e-4)
    on = simulate_cell(Cell(WORKLOADS["shared"], 1, True, 3), cost, ENGINE, num_gpu_blocks=100)
    off = simulate_cell(Cell(WORKLOADS["shared"], 1, False, 3), cost, ENGINE, num_gpu_blocks=100)
    assert off["prefix_hit_rate"] is None or off["prefix_hit_rate"] == 0
    assert on["prefix_hit_rate"] == pytest.approx(2 * 512 / (3 * 544), rel=0.01)  # the first request misses
    assert on["ttft_p50_s"] < off["ttft_p50_s"]
    c8 = simulate_cell(Cell(WORKLOADS["short"], 8, False, 2), cost, ENGINE, num_gpu_blocks=100)
    assert c8["ok"] == 16 and c8["output_tokens"] == 16 * 32
    c1 = simulate_cell(Cell(WORKLOADS["short"], 1, False, 2), cost, ENGINE, num_gpu_blocks=100)
    assert c8["output_tok_s"] > 2 * c1["output_tok_s"]  # batching


def _synthetic_measured(params: EfficiencyParams) -> dict[str, dict[str, float]]:
    sims = simulate_all(make_cells(), params, ENGINE)
    return {cid: {k: v for k, v in s.items() if isinstance(v, float)} for cid, s in sims.items()}


def test_fit_from_points_recovers_steady_state_truth() -> None:
    model, device = get_model("SmolLM2-135M-Instruct"), get_device("cpu-local")
    cm = RooflineCostModel(model, device, dtype="fp32", params=TRUE)
    pts = []
    for c in (1, 32):
        for metric in ("ttft_s", "itl_s", "output_throughput_tok_s"):
            p = MeasuredPoint(metric=metric, value=1.0, input_len=128, output_len=32, concurrency=c, dtype="fp32")
            pts.append(MeasuredPoint(**{**p.__dict__, "value": predict(cm, p)}))
    fit = fit_steady(pts, model, device)
    fitted = RooflineCostModel(model, device, dtype="fp32", params=fit)
    for p in pts:
        assert predict(fitted, p) == pytest.approx(p.value, rel=0.02)


def test_points_from_cells_uses_fit_cells_only() -> None:
    measured = _synthetic_measured(TRUE)
    pts = points_from_cells(measured, make_cells(), ENGINE, FIT_CELLS)
    assert len(pts) == 3 * len(FIT_CELLS)
    assert {p.concurrency for p in pts} == {1, 32}
    assert all(p.input_len == 128 and p.output_len == 32 and p.dtype == ENGINE.dtype for p in pts)


def test_fit_in_loop_recovers_scheduler_truth_and_predicts_holdout() -> None:
    measured = _synthetic_measured(TRUE)
    fit = fit_in_loop(measured, make_cells(), ENGINE, FIT_CELLS)
    sims = simulate_all(make_cells(), fit, ENGINE)
    rows = compare(measured, sims)
    worst = max(abs(r["error_pct"]) for r in rows if r["error_pct"] is not None)
    assert worst < 5.0, rows  # held-out cells too: the synthetic truth is in the model family


def test_engine_from_servers_takes_vllm_cache_config() -> None:
    servers = [{"log_facts": {"cache_config": {"block_size": "128", "num_gpu_blocks": "182"}}}]
    e = engine_from_servers(EngineConfig(block_size=16), servers)
    assert (e.block_size, e.kv_blocks(get_model("SmolLM2-135M-Instruct"))) == (128, 182)
    assert engine_from_servers(ENGINE, [{"log_facts": {}}]) == ENGINE
    # fp32 KV: 2 x 30 layers x 3 heads x 64 x 4 B = 46,080 B/token; 1 GiB / (128 x 46,080) = 182 blocks.
    assert EngineConfig().kv_blocks(get_model("SmolLM2-135M-Instruct")) == 182


def test_device_option_swaps_the_twins_device_and_refuses_an_unknown_one() -> None:
    import llmlab_lab.twin_calibrate_cpu as tc

    before = tc.DEVICE
    try:
        tc.set_device("cpu-local-avx512")
        assert tc.DEVICE == "cpu-local-avx512"
        with pytest.raises(ValueError, match="unknown device"):  # CatalogError
            tc.set_device("cpu-nowhere")
        assert tc.DEVICE == "cpu-local-avx512"
    finally:
        tc.set_device(before)
