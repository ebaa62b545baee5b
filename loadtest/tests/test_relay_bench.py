"""The relay benchmark: comparison/target/analysis math and report rendering (unit), and the
``--quick`` run end to end (e2e: starts the simulator, worker and gateway)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from llmlab_loadtest import promscrape
from llmlab_loadtest import relay_bench as rb
from llmlab_loadtest.bench_meta import METADATA_FIELDS

BENCH = "relay_bench"


def _run(
    level: int,
    mode: str,
    repeat: int,
    ttft50: float | None,
    ttft99: float | None,
    tps: float,
    *,
    failed: int = 0,
    cpu: dict[str, float] | None = None,
    gap: float = 0.5,
    errors: dict[str, int] | None = None,
) -> rb.Run:
    r = rb.Run(level=level, mode=mode, repeat=repeat, tokens=256, wall_s=10.0)
    r.summary = {
        "requests": {"total": level, "ok": level - failed, "failed": failed},
        "errors": errors or {},
        "error_samples": {"stream": ["in-band error (worker_lost): gone"]} if failed else {},
        "ttft_ms": {"p50": ttft50, "p99": ttft99},
        "itl_ms": {"p99": 60.0 if mode == "direct" else 90.0},
        "tpot_ms": {"p50": 50.0},
        "e2e_ms": {"p50": 12900.0},
        "output_tokens_per_s": tps,
        "output_tokens": int(tps * 10),
    }
    cpu = cpu or {"simulator": 0.3, "client": 0.4}
    r.processes = {
        n: {"cpu_s": v * 10, "cpu_util_mean": v, "cpu_util_peak": min(1.0, v + 0.1), "rss_peak_mb": 60.0}
        for n, v in cpu.items()
    }
    r.system = {"busy_cores_mean": sum(cpu.values()), "other_cpu_s": 0.5}
    r.engine_tokens = int(tps * 10) if not failed else 2000
    r.liveness = {
        "heartbeat_gap_max_s": gap,
        "worker_health_ms_max": 3500.0 if gap > 3 else 5.0,
        "gateway_health_ms_max": 700.0,
    }
    return r


def _runs() -> list[rb.Run]:
    hot = {"simulator": 0.4, "client": 0.3, "worker": 0.95, "gateway": 0.6, "nats-server": 0.05}
    calm = {"simulator": 0.01, "client": 0.01, "worker": 0.002, "gateway": 0.002, "nats-server": 0.001}
    return [
        _run(1, "direct", 0, 150.0, 150.0, 5.0),  # warm-up: must not count
        _run(1, "stack", 0, 900.0, 900.0, 5.0),
        _run(1, "direct", 1, 100.0, 104.0, 19.9),
        _run(1, "stack", 1, 104.0, 110.0, 19.8, cpu=calm),
        _run(1, "direct", 2, 101.0, 105.0, 19.9),
        _run(1, "stack", 2, 107.0, 140.0, 19.7, cpu=calm),
        _run(1000, "direct", 1, 1000.0, 1030.0, 18500.0),
        _run(1000, "stack", 1, 4000.0, 9000.0, 12000.0, cpu=hot, gap=6.1),
        _run(1000, "direct", 2, 1010.0, 1040.0, 18400.0),
        _run(1000, "stack", 2, None, None, 0.0, failed=1000, errors={"stream": 1000}, cpu=hot, gap=6.5),
    ]


@pytest.mark.unit
def test_compare_level_pairs_repeats_and_skips_warmups() -> None:
    c = rb.compare_level(_runs(), 1)
    assert c["repeats"] == 2
    assert c["added_ttft_p50_ms"]["runs"] == pytest.approx([4.0, 6.0])
    assert c["added_ttft_p50_ms"]["mean"] == pytest.approx(5.0)
    assert c["added_ttft_p50_ms"]["spread"] == pytest.approx(2.0)
    assert c["added_ttft_p99_ms"]["runs"] == pytest.approx([6.0, 35.0])
    assert c["itl_p99_ratio"]["mean"] == pytest.approx(1.5)
    assert c["tokens_per_s_ratio"]["runs"] == pytest.approx([19.8 / 19.9, 19.7 / 19.9], abs=1e-4)
    assert c["direct"]["ttft_p50_ms"]["mean"] == pytest.approx(100.5)
    assert c["all_ok"]


@pytest.mark.unit
def test_targets_pass_and_miss() -> None:
    comps = [rb.compare_level(_runs(), lv) for lv in (1, 1000)]
    t = {(x["level"], x["target"].split(" <=")[0].split(" >=")[0]): x for x in rb.evaluate_targets(comps)}
    assert t[(1, "added TTFT p50")]["result"] == "PASS"  # 5.0 <= 5
    assert t[(1, "added TTFT p99")]["result"] == "PASS"  # mean of 6 and 35 = 20.5 <= 25
    assert t[(1, "added TTFT p99")]["value"] == pytest.approx(20.5)
    assert t[(1000, "added TTFT p50")]["result"] == "MISS"
    assert t[(1000, "added TTFT p50")]["value"] == pytest.approx(3000.0)  # the failed repeat has no TTFT
    assert t[(1000, "tokens/s stack/direct")]["result"] == "MISS"
    assert t[(1000, "tokens/s stack/direct")]["value"] == pytest.approx((12000 / 18500 + 0.0) / 2, abs=1e-4)
    assert comps[1]["failures"]["stack"]["failed"] == 1000 and not comps[1]["all_ok"]


@pytest.mark.unit
def test_targets_fall_back_to_the_highest_level_when_1000_was_not_run() -> None:
    comps = [rb.compare_level(_runs(), 1)]
    tok = [x for x in rb.evaluate_targets(comps) if x["target"].startswith("tokens/s")]
    assert tok[0]["level"] == 1 and "defined at 1000" in tok[0]["note"] and tok[0]["result"] == "PASS"


@pytest.mark.unit
def test_analysis_names_the_saturated_process_and_the_liveness_failure() -> None:
    comps = [rb.compare_level(_runs(), lv) for lv in (1, 1000)]
    text = "\n".join(rb.analyse(comps, cores=2, heartbeat_s=1.0))
    assert "1000 streams, stack" in text and "worker saturates a core" in text
    assert "out of CPU" in text
    assert "FAILED" in text and "worker_lost" in text
    assert "heartbeats arrived up to 6.5 s apart" in text
    # Per token the engine generated at the top level (the failed run generated 2,000 tokens, the
    # other 120,000 as delivered): (0.6 + 0.95 + 0.05) cores * 20 s / 122,000 tokens = 262 us.
    assert "Relay CPU per token carried at 1000 streams" in text
    assert "262 us/token" in text and "(18450 tok/s)" in text and "CPU-bound by construction" in text


@pytest.mark.unit
def test_monitor_window_measures_heartbeat_gaps() -> None:
    m = rb.Monitor("nats://127.0.0.1:1", "tx", {"worker": "http://127.0.0.1:1"})
    m.heartbeats = [(9.5, 0), (10.5, 3), (11.5, 3), (15.0, 3)]
    m.health = [(10.0, "worker", 5.0), (12.0, "worker", 2500.0), (13.0, "worker", float("inf"))]
    w = m.window(10.0, 16.0)
    assert w["heartbeats"] == 3
    assert w["heartbeat_gap_max_s"] == pytest.approx(3.5)
    assert w["worker_health_ms_max"] == pytest.approx(2500.0)
    assert w["worker_health_failed"] == 1
    silent = m.window(15.5, 25.0)  # nothing after 15.0: the gap runs to the window's end
    assert silent["heartbeats"] == 0 and silent["heartbeat_gap_max_s"] == pytest.approx(10.0)


def _doc(tmp_path: Path) -> dict[str, Any]:
    comps = [rb.compare_level(_runs(), lv) for lv in (1, 1000)]
    meta = {k: "x" for k in REQUIRED_METADATA}
    meta.update(
        date="2026-01-01T00:00:00+00:00",
        git_commit="0123456789abcdef",
        git_dirty=False,
        simulator={"ttft_ms": 100, "itl_ms": 50, "output_len": 256},
        repeats=2,
    )
    return {
        "metadata": meta,
        "summary": {"levels": comps, "targets": rb.evaluate_targets(comps), "analysis": rb.analyse(comps, 2)},
        "runs": [r.to_json() for r in _runs()],
    }


@pytest.mark.unit
def test_reports_render(tmp_path: Path) -> None:
    doc = _doc(tmp_path)
    md = rb.render_markdown(doc)
    assert "| 1000 |" in md and "**MISS**" in md and "## What limits it" in md and "Warm-up runs" in md
    assert "highest 0.5 s sample" in md and "Over time" not in md  # no sample times: no timeline
    png = tmp_path / "plot.png"
    rb.render_plot(doc, png)
    assert png.stat().st_size > 10_000
    # With sample times (and a finer interval): the timeline row and its line in the report.
    _with_sample_times(doc)
    doc["metadata"]["sample_interval_s"] = 0.05
    md = rb.render_markdown(doc)
    assert "highest 0.05 s sample" in md and "0.05 s samples of the first measured run of each mode at 1000" in md
    timeline = tmp_path / "timeline.png"
    rb.render_plot(doc, timeline)
    from matplotlib.image import imread

    assert imread(timeline).shape[0] > imread(png).shape[0] * 1.3  # a third row of panels
    lines = rb.report_lines(doc, {"json": tmp_path / "x.json"})
    assert any(ln.strip().startswith("1000") for ln in lines)
    assert any("MISS" in ln for ln in lines)


def _with_sample_times(doc: dict[str, Any]) -> None:
    for r in doc["runs"]:
        r["sample_times_s"] = [0.05 * (i + 1) for i in range(4)]
        for proc in r["processes"].values():
            proc["samples"] = [0.2, 0.9, 0.4]  # one short (a process that ended early)


@pytest.mark.unit
def test_the_timeline_shows_the_first_measured_run_of_each_mode_at_the_highest_level(tmp_path: Path) -> None:
    doc = _doc(tmp_path)
    assert rb.timeline_runs(doc) == []  # results from before the sample times: none
    _with_sample_times(doc)
    shown = rb.timeline_runs(doc)
    assert [(r["level"], r["mode"], r["repeat"]) for r in shown] == [(1000, "direct", 1), (1000, "stack", 1)]
    doc["runs"] = [r for r in doc["runs"] if not (r["level"] == 1000 and r["mode"] == "direct")]
    assert [(r["level"], r["mode"]) for r in rb.timeline_runs(doc)] == [(1000, "stack")]
    rb.render_plot(doc, tmp_path / "one.png")  # one panel of the row left empty


@pytest.mark.unit
def test_sample_interval_option() -> None:
    assert rb.parse_args([]).sample_interval_s == 0.5
    assert rb.parse_args(["--workload", "thousand", "--sample-interval-s", "0.05"]).sample_interval_s == 0.05
    for bad in ("0", "0.001", "10"):
        with pytest.raises(SystemExit):
            rb.parse_args(["--sample-interval-s", bad])


@pytest.mark.unit
def test_settings_of_the_stacks_services() -> None:
    """--setting: LLMLAB_* variables only (the stack must run the tree's code), repeatable."""
    assert rb.parse_args([]).settings == {}
    cfg = rb.parse_args(["--setting", "LLMLAB_GATEWAY_ROUTE_AHEAD=false", "--setting", "LLMLAB_WORKER_COALESCE_MS=0"])
    assert cfg.settings == {"LLMLAB_GATEWAY_ROUTE_AHEAD": "false", "LLMLAB_WORKER_COALESCE_MS": "0"}
    for bad in ("PYTHONPATH=/tmp", "LLMLAB_=1", "LLMLAB_X"):
        with pytest.raises(SystemExit):
            rb.parse_args(["--setting", bad])


REQUIRED_METADATA = (*METADATA_FIELDS, "simulated_note")


@pytest.mark.e2e
def test_quick_bench_end_to_end(quick_bench: Callable[..., Any]) -> None:
    """``relay_bench.py --quick``: the whole stack plus the simulator, levels 1 and 100 (about a minute;
    half that at a GPU's pace, which the test takes: a run's 64 tokens last 1.3 s instead of 3.2)."""
    pace = ["--ttft-ms", "50", "--itl-ms", "20"]
    js, latest, proc = quick_bench(
        BENCH, "relay", out_flag="--out-dir", extra_fields=("simulated_note",), args=["--dirty", "--no-profile", *pace]
    )
    assert json.loads((js.parent.parent / "latest" / "result.json").read_text()) == latest
    meta = latest["metadata"]
    assert meta["simulated"] is True and meta["gpu"] == "none (simulated)"
    runs = latest["runs"]
    assert {(r["level"], r["mode"], r["repeat"]) for r in runs} == {
        (lv, m, rep) for lv in (1, 100) for m in ("direct", "stack") for rep in (0, 1)
    }
    for r in runs:  # a benchmark, not a test of targets: only that every request came back
        assert r["requests_failed"] == 0 and r["requests_ok"] == r["level"], r
        assert {"simulator", "worker", "gateway", "client"} <= set(r["processes"])
        if r["mode"] == "stack":  # the TTFT legs, from the services' histograms over the run
            legs = r["ttft_breakdown_ms"]
            assert legs["nats_queue_ms"] is not None and legs["gateway_accept_to_first_token_ms"] is not None, legs
    assert [c["level"] for c in latest["summary"]["levels"]] == [1, 100]
    assert "Targets:" in proc.stdout and "What limits it:" in proc.stdout


@pytest.mark.unit
def test_histogram_means_between_two_scrapes() -> None:
    before = {"llmlab_worker_nats_queue_seconds": (1.0, 10.0)}
    after = {"llmlab_worker_nats_queue_seconds": (1.5, 20.0), "llmlab_worker_ttft_seconds": (2.0, 10.0)}
    means = rb.histogram_means_ms(
        before, after, {"q": "llmlab_worker_nats_queue_seconds", "t": "llmlab_worker_ttft_seconds", "none": "missing"}
    )
    assert means == {"q": pytest.approx(50.0), "t": pytest.approx(200.0), "none": None}


@pytest.mark.unit
def test_admission_legs_come_from_their_labelled_series() -> None:
    """The admission histogram has one series per step: each leg reads its own, not their sum."""
    text = "\n".join(
        (
            'llmlab_gateway_admission_seconds_sum{step="auth_reserve"} 0.6',
            'llmlab_gateway_admission_seconds_count{step="auth_reserve"} 10',
            'llmlab_gateway_admission_seconds_sum{step="route"} 0.2',
            'llmlab_gateway_admission_seconds_count{step="route"} 10',
        )
    )
    scraped = promscrape.parse(text)
    names = rb.BREAKDOWN_METRICS["gateway"]
    means = rb.histogram_means_ms({}, rb.histogram_sums(scraped, names), names)
    assert means["admission_auth_reserve_ms"] == pytest.approx(60.0)
    assert means["admission_route_ms"] == pytest.approx(20.0)
    line = rb.ttft_legs_line(
        100,
        {
            "client_ttft_mean_ms": 200.0,
            "direct_client_ttft_mean_ms": 80.0,
            "gateway_accept_to_first_token_ms": 150.0,
            "admission_auth_reserve_ms": 60.0,
            "admission_route_ms": 20.0,
            "nats_queue_ms": 10.0,
            "engine_ttft_seen_by_worker_ms": 52.0,
        },
    )
    # 150 - (60 + 20 + 10 + 52) = 8 ms not covered; 200 - 150 = 50 ms of HTTP
    assert "not covered by those 8 " in line and "back out 50 " in line, line


@pytest.mark.unit
def test_service_warning_lines_are_recognised() -> None:
    assert rb._is_warning('{"ts": 1, "level": "warning", "service": "gateway", "msg": "stream ended with error"}')
    assert rb._is_warning('{"level":"error","msg":"x"}')
    assert not rb._is_warning('{"ts": 1, "level": "info", "msg": "route: static"}')
    assert rb._is_warning("Traceback (most recent call last):")


@pytest.mark.unit
def test_gpu_like_workload_preset() -> None:
    """The data-plane baseline's workload: TTFT 50 ms, ITL 20 ms, 64 tokens, the full stack."""
    cfg = rb.parse_args(["--workload", "gpu-like"])
    assert (cfg.ttft_ms, cfg.itl_ms, cfg.tokens, cfg.stack, cfg.name) == (50.0, 20.0, 64, "full", "relay-gpu")
    assert cfg.levels == [1, 100] and cfg.min_requests == 20
    # A steady state: each stream sends 10 requests at least, the starts spread over one request's
    # length (50 ms + 63 x 20 ms), so the 100 streams' requests arrive evenly from the first one.
    assert (cfg.min_per_stream, cfg.ramp_s) == (10, pytest.approx(1.31))
    own = rb.parse_args(["--workload", "gpu-like", "--stack", "relay", "--itl-ms", "5"])
    assert (own.stack, own.itl_ms, own.ttft_ms) == ("relay", 5.0, 50.0)
    assert own.ramp_s == pytest.approx((50 + 63 * 5) / 1000)
    burst = rb.parse_args(["--workload", "gpu-like", "--ramp-s", "0", "--min-per-stream", "1"])
    assert (burst.ramp_s, burst.min_per_stream) == (0.0, 1)
    # The other workloads start all at once, one request per stream unless asked.
    for workload in ("default", "thousand", "capacity"):
        other = rb.parse_args(["--workload", workload])
        assert (other.ramp_s, other.min_per_stream) == (0.0, 1), workload
    # The simulator's own 1 ms tick unless asked; a strict step loop (tick = ITL) on request.
    assert cfg.sim_tick_ms == 1.0
    assert rb.parse_args(["--workload", "gpu-like", "--sim-tick-ms", "20", "--ramp-s", "1.3"]).sim_tick_ms == 20.0


@pytest.mark.e2e
def test_quick_full_stack_run(quick_bench: Callable[..., Any]) -> None:
    """The gpu-like preset on the full stack (budget auth, router service, accounting) at one
    stream: every request answered through it, and its services' CPU measured."""
    _js, doc, _proc = quick_bench(
        BENCH,
        "relay-gpu",
        out_flag="--out-dir",
        extra_fields=("simulated_note",),
        # 1 kHz: at 100 Hz the gateway's few ms of GIL time in this run gave no sample on a fast host (CI flake)
        args=[
            *("--workload", "gpu-like", "--levels", "1", "--min-requests", "3", "--min-per-stream", "1", "--dirty"),
            *("--profile-hz", "1000", "--sim-tick-ms", "20"),
            *("--setting", "LLMLAB_GATEWAY_ROUTE_AHEAD_MAX_ADMITTING=16"),
        ],
    )
    assert doc["metadata"]["gateway"]["auth"] == "budget" and doc["metadata"]["gateway"]["router"] == "service"
    assert doc["metadata"]["settings"] == {"LLMLAB_GATEWAY_ROUTE_AHEAD_MAX_ADMITTING": "16"}
    assert doc["metadata"]["simulator"]["tick_ms"] == 20.0
    measured = [r for r in doc["runs"] if r["repeat"] == 1]
    # The data-plane figures come from the services' metrics: the worker took each of the 3
    # measured requests from NATS once, the router service answered every route.
    dp = doc["summary"]["levels"][0]["dataplane"]
    assert dp["queue_wait_samples"] == 3 and dp["refused"] == 0 and dp["router_timeouts"] == 0
    assert dp["queue_wait_ms"]["p50"] is not None and dp["queue_wait_ms"]["p50"] <= dp["queue_wait_ms"]["p99"]
    # The profiled run follows the measured ones, apart from the figures, with a py-spy profile of each.
    profiled = [r for r in doc["runs"] if r["profiled"]]
    assert [(r["mode"], r["level"]) for r in profiled] == [("stack", 1)]
    assert set(doc["profiles"]) == {"gateway-1", "worker-1"} and all(p["samples"] > 0 for p in doc["profiles"].values())
    assert (_js.parent / "profiles" / "gateway-1.txt").stat().st_size > 0
    assert {r["mode"] for r in measured} == {"direct", "stack"}
    for r in measured:
        assert r["requests_failed"] == 0 and r["requests_ok"] == 3, r
    stack_run = next(r for r in measured if r["mode"] == "stack")
    assert {"budget", "router", "accounting"} <= set(stack_run["processes"])


def _level(level: int, p50: float, p99: float, ratio: float, ok: bool = True, gw: float = 20, wk: float = 20) -> dict:
    return {
        "level": level,
        "added_ttft_p50_ms": {"mean": p50},
        "added_ttft_p99_ms": {"mean": p99},
        "tokens_per_s_ratio": {"mean": ratio},
        "all_ok": ok,
        "cpu_us_per_token": {"stack": {"gateway": gw, "worker": wk}},
    }


@pytest.mark.unit
def test_gpu_like_targets_are_the_data_plane_issues() -> None:
    """Catches: the gpu-like run judged by the default workload's targets, a limit moved, or a
    level with a refused request passing."""
    comps = [_level(1, 40, 90, 0.9), _level(100, 9.9, 39.9, 0.95)]
    t = {(x["level"], x["target"]): x["result"] for x in rb.evaluate_gpu_targets(comps)}
    assert set(t.values()) == {"PASS"} and len(t) == 3
    worse = [_level(100, 9, 41, 0.94)]
    t = {(x["level"], x["target"]): x["result"] for x in rb.evaluate_gpu_targets(worse)}
    assert t == {
        (100, "added TTFT p50 <= 10 ms"): "PASS",
        (100, "added TTFT p99 <= 40 ms"): "MISS",
        (100, "tokens/s stack/direct >= 0.95"): "MISS",
    }
    refused = [_level(100, 1, 1, 1.0, ok=False)]
    assert {x["result"] for x in rb.evaluate_gpu_targets(refused)} == {"MISS"}


def _thousand(ratio: float, p99: float, queue_p99: float | None, timeouts: int, refused: int) -> dict:
    c = _level(1000, 0, p99, ratio, ok=refused == 0)
    c["dataplane"] = {"queue_wait_ms": {"p99": queue_p99}, "router_timeouts": timeouts, "refused": refused}
    return c


@pytest.mark.unit
def test_thousand_stream_targets() -> None:
    """The 1,000-stream run's five targets, the queue wait and router timeouts read from the
    services' metrics. Catches: a limit inverted, the queue wait or the timeouts not judged, or a
    refusal passing."""
    cfg = rb.parse_args(["--workload", "thousand"])
    assert (cfg.levels, cfg.itl_ms, cfg.tokens, cfg.stack, cfg.min_requests, cfg.name) == (
        [1000],
        100.0,
        64,
        "full",
        1,
        "relay-thousand",
    )
    good = rb.targets_for("thousand", [_thousand(0.9, 1500, 100, 0, 0)])
    assert len(good) == 5 and {x["result"] for x in good} == {"PASS"}
    bad = rb.targets_for("thousand", [_thousand(0.89, 1501, 101, 1, 0)])
    assert [x["result"] for x in bad] == ["MISS", "MISS", "MISS", "MISS", "PASS"]
    refused = rb.targets_for("thousand", [_thousand(1.0, 1, 1, 0, 3)])
    assert {x["result"] for x in refused} == {"MISS"}
    unknown = rb.targets_for("thousand", [_thousand(1.0, 1, None, 0, 0)])
    assert [x["result"] for x in unknown if "queue" in x["target"]] == ["n/a"]


@pytest.mark.unit
def test_dataplane_figures_add_the_runs_buckets() -> None:
    """Two runs' queue-wait buckets are added before the percentile (not percentiles averaged);
    refusals are every answer but 200; router timeouts are the fallbacks whose cause is a timeout."""
    a = rb.Run(level=10, mode="stack", repeat=1, tokens=64)
    b = rb.Run(level=10, mode="stack", repeat=2, tokens=64)
    # a: 10 waits <= 10 ms; b: 10 waits in (10, 100] ms. Together p50 = 10 ms, p95 = 10 + 90 * 9/10 ms.
    a.queue_buckets = [(0.01, 10.0), (0.1, 10.0), (float("inf"), 10.0)]
    b.queue_buckets = [(0.01, 0.0), (0.1, 10.0), (float("inf"), 10.0)]
    a.router_fallbacks = {"TimeoutError": 2.0}
    b.router_fallbacks = {"NoRespondersError": 1.0}
    a.statuses, b.statuses = {"200": 9.0, "429": 1.0}, {"200": 8.0, "503": 2.0}
    dp = rb.dataplane_figures([a, b])
    assert dp["queue_wait_ms"]["p50"] == pytest.approx(10.0)
    assert dp["queue_wait_ms"]["p95"] == pytest.approx(91.0)
    assert dp["queue_wait_samples"] == 20
    assert dp["router_timeouts"] == 2 and dp["router_fallbacks"] == {"TimeoutError": 2, "NoRespondersError": 1}
    assert dp["refused"] == 3
    # GC: per run, the mean of the runs (a: 30 ms of it 20 full; b: 10 ms, none full); the worker's absent
    a.gc_pause_s = {"gateway": {"0": 0.004, "1": 0.006, "2": 0.02}}
    b.gc_pause_s = {"gateway": {"0": 0.01}}
    gc_ms = rb.dataplane_figures([a, b])["gc_pause_ms_per_run"]
    assert gc_ms == {"gateway": {"all": 20.0, "full": 10.0}, "worker": {"all": 0.0, "full": 0.0}}
    assert rb._gc_cell(gc_ms) == "gateway 20.0 (full 10.0), worker 0.0 (full 0.0)" and rb._gc_cell(None) == "—"


@pytest.mark.unit
def test_capacity_workload_preset() -> None:
    """The relay-capacity run: ITL 1 ms, 512 tokens, 50 streams, the full stack, its own results name."""
    cfg = rb.parse_args(["--workload", "capacity"])
    assert (cfg.ttft_ms, cfg.itl_ms, cfg.tokens, cfg.stack, cfg.name) == (50.0, 1.0, 512, "full", "relay-capacity")
    assert cfg.levels == [50] and cfg.min_requests == 1000


@pytest.mark.unit
def test_capacity_targets_are_tokens_per_core_of_each_process() -> None:
    """Catches: tokens per core taken from the wrong process, the 30k limit inverted, or a level
    with failed requests passing."""
    # 25 us/token = 40,000 tokens/s per core; 40 us = 25,000.
    judged = rb.evaluate_capacity_targets([_level(50, 0, 0, 1, gw=25, wk=40)])
    t = {(x["target"].split(":")[0], x["result"]) for x in judged}
    assert t == {
        ("one worker process", "MISS"),
        ("one gateway process", "PASS"),
        ("relay CPU per token (gateway + worker) <= 60 us", "MISS"),
    }
    judged = rb.evaluate_capacity_targets([_level(50, 0, 0, 1, gw=25, wk=20)])
    values = {x["target"].split(":")[0]: x["value"] for x in judged}
    assert values["one worker process"] == 50_000 and values["one gateway process"] == 40_000
    failed = rb.evaluate_capacity_targets([_level(50, 0, 0, 1, ok=False, gw=10, wk=10)])
    assert {x["result"] for x in failed} == {"MISS"}
    assert rb.targets_for("capacity", [_level(50, 0, 0, 1)]) == rb.evaluate_capacity_targets([_level(50, 0, 0, 1)])


@pytest.mark.unit
def test_render_rewrites_a_saved_run_whose_cpu_field_names_the_isa(tmp_path: Path) -> None:
    """``--render`` read the cores as the cpu field's last comma-separated part: since the field ends
    with the ISA ("avx2+avx512f"), every re-render failed."""
    doc = _doc(tmp_path)
    doc["metadata"]["cpu"] = (
        "Intel(R) Xeon(R) Processor (family 6 model 167), 2 logical cores (2 physical), avx2+avx512f"
    )
    assert rb.metadata_cores(doc["metadata"]) == 2
    assert rb.metadata_cores({"cpu": "AMD EPYC, 16 logical cores (8 physical)"}) == 16  # before the ISA
    assert rb.metadata_cores({}) is None
    saved = tmp_path / "result.json"
    saved.write_text(json.dumps(doc))
    paths = rb.rerender(saved)
    assert paths["png"].stat().st_size > 10_000 and "## What limits it" in paths["md"].read_text()


@pytest.mark.unit
def test_a_servers_port_comes_from_its_url() -> None:
    assert rb.url_port("nats://127.0.0.1:4222", 4222) == 4222
    assert rb.url_port("redis://127.0.0.1:6380/0", 6379) == 6380
    assert rb.url_port("redis://user:secret@10.0.0.5:6390/2", 6379) == 6390  # credentials are not the port
    assert rb.url_port("redis://localhost/0", 6379) == 6379
    assert rb.url_port("nats://nats.internal", 4222) == 4222


@pytest.mark.integration
def test_the_bench_finds_the_nats_and_redis_servers_it_samples() -> None:
    """The servers this machine runs for the tests (NATS on 4222, Redis on 6379): their CPU is sampled
    beside the services' (Redis's Lua scripts are the reservations' work too)."""
    import os

    nats = rb.find_server("nats-server", os.environ.get("LLMLAB_NATS_URL", "nats://127.0.0.1:4222"), 4222)
    redis = rb.find_server("redis-server", os.environ.get("LLMLAB_REDIS_URL", "redis://127.0.0.1:6379/0"), 6379)
    assert nats is not None and "nats-server" in " ".join([nats.name(), *nats.cmdline()[:1]])
    assert redis is not None and "redis-server" in " ".join([redis.name(), *redis.cmdline()[:1]])
    assert rb.find_server("no-such-server-program", "redis://127.0.0.1:6379/0", 6379) is None
