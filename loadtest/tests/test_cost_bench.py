"""The relay cost benchmark's figures and targets, the Prometheus scrape helpers, and the rule that
a benchmark measures a committed tree. Expected values are worked out by hand in the comments."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from llmlab_loadtest import bench_meta, promscrape
from llmlab_loadtest import cost_bench as cb

pytestmark = pytest.mark.unit


def _window(tokens: int, ok: int, delivered: int, cpu: dict[str, float], refused: int = 0) -> dict[str, Any]:
    return {
        "variant": "this",
        "max_tokens": tokens,
        "profiled": False,
        "requests_ok": ok,
        "requests_refused": refused,
        "tokens": delivered,
        "cpu_s": cpu,
        "router_fallbacks": 0,
    }


def _cpu(gw: float, wk: float, other: float = 0.1) -> dict[str, float]:
    return {"gateway": gw, "worker": wk, "budget": other, "router": other, "accounting": other, "simulator": 5.0}


def test_per_request_and_per_token_figures() -> None:
    # 2 tokens: 1,000 requests; gateway 1.0 s -> 1 ms/request, worker 0.8 s -> 0.8 ms, the other
    # three 0.1 s -> 0.1 ms each: 1 + 0.8 + 0.3 = 2.1 ms per request (the simulator not counted).
    # 64 tokens: 100 requests; gateway 0.5 s -> 5 ms, worker 0.42 s -> 4.2 ms.
    # Per added token over 62 tokens: gateway 4 ms / 62 = 64.5 us, worker 3.4 / 62 = 54.8 us.
    short = _window(2, 1000, 2000, _cpu(1.0, 0.8))
    long = _window(64, 100, 6400, _cpu(0.5, 0.42, other=0.01))
    f = cb.variant_figures([short, long, dict(short), dict(long)])
    assert f["stack_ms_per_request"] == pytest.approx(2.1)
    assert f["us_per_added_token"]["gateway"] == pytest.approx(64.5)
    assert f["us_per_added_token"]["worker"] == pytest.approx(54.8)
    assert f["relay_us_per_token"] == pytest.approx(119.3)
    assert f["tokens_per_core_s"] == {"gateway": round(1e6 / 64.5), "worker": round(1e6 / 54.8)}
    assert f["tokens_per_request"] == {"2": 2.0, "64": 64.0}


def test_net_of_idle_cpu_takes_out_what_each_process_spends_with_nothing_to_do() -> None:
    # A 10 s window, 1,000 requests. Gateway 1.0 s of CPU, idle 0.02 cores -> 0.2 s of it idle:
    # (1.0 - 0.2) / 1000 = 0.8 ms. Worker 0.8 s, idle 0.03 -> (0.8 - 0.3) / 1000 = 0.5 ms. Budget,
    # router, accounting 0.1 s, idle 0.005 -> 0.05 ms each. Stack: 0.8 + 0.5 + 0.15 = 1.45 ms (the
    # raw figure stays 2.1). The simulator has no idle figure: it is not in the net table.
    idle = {"gateway": 0.02, "worker": 0.03, "budget": 0.005, "router": 0.005, "accounting": 0.005}
    short = {**_window(2, 1000, 2000, _cpu(1.0, 0.8)), "wall_s": 10.0, "idle_cpu_s_per_s": idle}
    long = {**_window(64, 100, 6400, _cpu(0.5, 0.42, other=0.01)), "wall_s": 10.0, "idle_cpu_s_per_s": idle}
    net = cb.net_per_request_ms(short)
    assert net["gateway"] == pytest.approx(0.8) and net["worker"] == pytest.approx(0.5)
    assert "simulator" not in net
    f = cb.variant_figures([short, long])
    assert f["stack_ms_per_request"] == pytest.approx(2.1)
    assert f["stack_net_ms_per_request"] == pytest.approx(1.45)
    # 64 tokens, 100 requests: gateway (0.5 - 0.2) / 100 = 3 ms.
    assert f["net_ms_per_request"]["64"]["gateway"] == pytest.approx(3.0)
    # Windows of a run without the idle measurement have no net figure.
    assert cb.variant_figures([_window(2, 1000, 2000, _cpu(1.0, 0.8))])["stack_net_ms_per_request"] is None


def test_per_token_divides_by_the_tokens_delivered_apart() -> None:
    # The long requests delivered 32 tokens each (the engine stopped early): 30 tokens apart.
    # gateway (5 - 1) ms / 30 = 133.3 us.
    f = cb.variant_figures([_window(2, 1000, 2000, _cpu(1.0, 0.8)), _window(64, 100, 3200, _cpu(0.5, 0.42))])
    assert f["us_per_added_token"]["gateway"] == pytest.approx(133.3)


def test_targets() -> None:
    passing = {
        "stack_ms_per_request": 2.0,
        "relay_us_per_token": 60.0,
        "tokens_per_core_s": {"gateway": 16_000, "worker": 30_000},
        "refused": 0,
    }
    assert [t["result"] for t in cb.targets(passing)] == ["PASS"] * 4
    missing = {**passing, "stack_ms_per_request": 2.01, "relay_us_per_token": 60.1}
    missing["tokens_per_core_s"] = {"gateway": 15_999}
    assert [t["result"] for t in cb.targets(missing)] == ["MISS", "MISS", "MISS", "n/a"]
    refused = cb.targets({**passing, "refused": 1})
    assert {t["result"] for t in refused} == {"MISS"} and "1 requests refused" in refused[0]["note"]


def test_prometheus_text_parsing_and_deltas() -> None:
    before = promscrape.parse('x_total{status="200",why="a \\"b\\""} 3\n# HELP x\ny 1e3\n')
    after = promscrape.parse('x_total{status="200",why="a \\"b\\""} 5\nx_total{status="429"} 2\ny 1500\n')
    d = promscrape.delta(before, after)
    assert promscrape.by_label(d, "x_total", "status") == {"200": 2.0, "429": 2.0}
    assert promscrape.total(d, "y") == 500.0
    assert promscrape.total(d, "x_total", {"status": "429"}) == 2.0


def test_histogram_quantile_interpolates_as_promql() -> None:
    text = "\n".join(
        f'h_bucket{{pool="{p}",le="{le}"}} {n}'
        for p, counts in (("a", (5, 15, 20, 20)), ("b", (5, 15, 20, 20)))
        for le, n in zip(("0.1", "0.2", "0.5", "+Inf"), counts, strict=True)
    )
    cum = promscrape.buckets(promscrape.parse(text), "h")
    assert cum[0] == (0.1, 10.0) and cum[-1][1] == 40.0
    # rank 20 of 40 lies in (0.1, 0.2], which holds 20: 0.1 + 0.1 * (20 - 10) / 20 = 0.15.
    assert promscrape.quantile(cum, 0.5) == pytest.approx(0.15)
    # rank 39.6 in (0.2, 0.5], which holds 10: 0.2 + 0.3 * 9.6 / 10 = 0.488.
    assert promscrape.quantile(cum, 0.99) == pytest.approx(0.488)
    # rank 2 in the first bucket: from 0 to 0.1, 2 of 10.
    assert promscrape.quantile(cum, 0.05) == pytest.approx(0.02)
    inf = [(0.1, 10.0), (0.5, 10.0), (float("inf"), 20.0)]
    assert promscrape.quantile(inf, 0.99) == 0.5  # past the last finite bound: that bound
    assert promscrape.quantile([(0.1, 0.0), (float("inf"), 0.0)], 0.5) is None


def test_a_benchmark_refuses_a_modified_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    git("add", "a.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "a")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "new-result.json").write_text("{}")  # untracked output: still committed code
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "README.md").write_text("index\n")
    git("add", "results/README.md")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "index")
    (tmp_path / "results" / "README.md").write_text("index, rewritten by a run\n")  # a tracked output
    assert bench_meta.require_committed(False) == []
    (tmp_path / "a.py").write_text("x = 2\n")
    with pytest.raises(SystemExit, match="refusing to benchmark a modified tree"):
        bench_meta.require_committed(False)
    assert bench_meta.require_committed(True) == ["a.py"]


def test_the_invocation_stays_under_fifteen_minutes() -> None:
    assert cb.parse_args(["--repeats", "2"]).repeats == 2
    with pytest.raises(SystemExit):
        cb.parse_args(["--repeats", "8", "--baseline", "HEAD~1"])  # 34 windows of ~27 s


def test_env_ab_runs_this_tree_twice_with_the_setting_in_one_variant_only() -> None:
    cfg = cb.parse_args(["--env-ab", "LLMLAB_WORKER_PUBLISH_BATCH_MS=5", "--env-ab", "LLMLAB_WORKER_COALESCE_MS=0"])
    assert cfg.env_ab == {"LLMLAB_WORKER_PUBLISH_BATCH_MS": "5", "LLMLAB_WORKER_COALESCE_MS": "0"}
    assert cb.parse_args([]).env_ab == {}
    # Two variants double the windows, each about 27 s: 7 repeats are 2 x 2 x 7 + 2 profiled = 30
    # windows (13.5 min, over the 13-minute bound); 7 repeats of one variant are 16 (7.2 min).
    with pytest.raises(SystemExit):
        cb.parse_args(["--repeats", "7", "--env-ab", "LLMLAB_WORKER_PUBLISH_BATCH_MS=5"])
    assert cb.parse_args(["--repeats", "7"]).repeats == 7
    for bad in ("PATH=/tmp", "PYTHONPATH=/tmp/old", "LLMLAB_X", "LLMLAB_=1", "LLMLAB_A-B=1"):
        with pytest.raises(SystemExit):
            cb.parse_args(["--env-ab", bad])
    with pytest.raises(SystemExit):
        cb.parse_args(["--env-ab", "LLMLAB_WORKER_PUBLISH_BATCH_MS=5", "--router-ab"])
    # Only the variant that names the setting passes it to its processes.
    plain, tuned = cb.QuietStack(None), cb.QuietStack(None, {"LLMLAB_WORKER_PUBLISH_BATCH_MS": "5"})
    assert "LLMLAB_WORKER_PUBLISH_BATCH_MS" not in plain.base_env()
    assert tuned.base_env()["LLMLAB_WORKER_PUBLISH_BATCH_MS"] == "5"
    meta = {"settings": {"default": {}, "env": {"LLMLAB_WORKER_PUBLISH_BATCH_MS": "5"}}}
    assert cb._settings_note(meta, "default") == ""
    assert cb._settings_note(meta, "env") == " with `LLMLAB_WORKER_PUBLISH_BATCH_MS=5`"
    assert cb._settings_note({}, "this") == ""  # a result written before the field


def test_the_metadata_names_the_settings_the_run_inherited_without_their_secrets() -> None:
    env = {
        "LLMLAB_WORKER_PUBLISH_BATCH_MS": "5",
        "LLMLAB_NATS_URL": "nats://gateway:s3cret@10.0.0.1:4222",
        "LLMLAB_NATS_PASSWORD": "s3cret",
        "LLMLAB_BUDGET_ADMIN_TOKEN": "t0k",
        "LLMLAB_GATEWAY_API_KEY": "sk-abc",
        "LLMLAB_WORKER_MAX_TOKENS_CAP": "64",
        "PATH": "/usr/bin",
    }
    got = bench_meta.service_settings(env)
    assert got == {
        "LLMLAB_BUDGET_ADMIN_TOKEN": "<redacted>",
        "LLMLAB_GATEWAY_API_KEY": "<redacted>",
        "LLMLAB_NATS_PASSWORD": "<redacted>",
        "LLMLAB_NATS_URL": "nats://<redacted>@10.0.0.1:4222",
        "LLMLAB_WORKER_MAX_TOKENS_CAP": "64",
        "LLMLAB_WORKER_PUBLISH_BATCH_MS": "5",
    }
    assert "s3cret" not in str(got) and "sk-abc" not in str(got)


def test_each_repeat_has_its_own_slope() -> None:
    # Repeat 1: gateway (5 - 1) ms, worker (4.2 - 0.8) ms over 62 tokens: 64.5 + 54.8 = 119.3 us.
    # Repeat 2: gateway (3 - 1) ms, worker (2 - 0.8) ms: 32.3 + 19.4 = 51.6 us. The mean of the
    # windows' figures: gateway (4 - 1) / 62 = 48.4, worker (3.1 - 0.8) / 62 = 37.1: 85.5 us.
    def at(repeat: int, w: dict[str, Any]) -> dict[str, Any]:
        return {**w, "repeat": repeat}

    f = cb.variant_figures(
        [
            at(1, _window(2, 1000, 2000, _cpu(1.0, 0.8))),
            at(1, _window(64, 100, 6400, _cpu(0.5, 0.42))),
            at(2, _window(2, 1000, 2000, _cpu(1.0, 0.8))),
            at(2, _window(64, 100, 6400, _cpu(0.3, 0.2))),
        ]
    )
    assert f["relay_us_per_token_by_repeat"] == pytest.approx([119.3, 51.6], abs=0.15)  # parts rounded to 0.1
    assert f["relay_us_per_token"] == pytest.approx(85.5, abs=0.1)


def test_the_cpu_field_tells_hosts_of_one_model_name_apart_by_their_vector_isa() -> None:
    avx2 = "model name\t: AMD EPYC\nflags\t\t: fpu sse2 fma avx avx2\n"
    avx512 = "model name\t: AMD EPYC\nflags\t\t: fpu sse2 fma avx avx2 avx512f avx512bw avx512_bf16\n"
    assert bench_meta.cpu_model(avx2).endswith(", avx2")
    assert bench_meta.cpu_model(avx512).endswith(", avx2+avx512f+avx512_bf16")
    assert bench_meta.cpu_model(avx2).startswith("AMD EPYC, ")
    assert bench_meta.cpu_model("model name : x\nflags : sse2\n").endswith(", no AVX2")
    # two AVX-512 generations under one model name: the family/model numbers and vp2intersect tell them apart
    zen4 = "cpu family\t: 25\nmodel\t\t: 17\nmodel name\t: AMD EPYC\nflags\t\t: avx2 avx512f avx512_bf16\n"
    zen5 = zen4.replace("25", "26").replace(": 17", ": 2").replace("bf16\n", "bf16 avx512_vp2intersect\n")
    assert bench_meta.cpu_model(zen4).startswith("AMD EPYC (family 25 model 17), ")
    assert bench_meta.cpu_model(zen4).endswith(", avx2+avx512f+avx512_bf16")
    assert bench_meta.cpu_model(zen5).startswith("AMD EPYC (family 26 model 2), ")
    assert bench_meta.cpu_model(zen5).endswith(", avx2+avx512f+avx512_bf16+avx512_vp2intersect")
