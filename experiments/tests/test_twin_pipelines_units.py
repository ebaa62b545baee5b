"""The pure parts of the twin-pipelines experiment: which pipeline flags reach the twin, its KV size, and
the side-by-side errors. (The run itself: ``python -m llmlab_experiments --only twin_pipelines``.)"""

from __future__ import annotations

from typing import Any

import pytest
from llmlab_experiments import real_pipelines as rp
from llmlab_experiments import twin_pipelines as m


def test_the_twin_gets_the_cpu_launch_flags_it_models_and_lists_the_rest() -> None:
    launches = rp.launches_of_pipelines()
    argv, left = m.twin_flags(launches["C"])
    assert argv == ["--max-num-seqs", "128", "--max-num-batched-tokens", "4096", "--long-prefill-token-threshold",
                    "2048", "--prefix-caching", "--max-model-len", "8192"]  # fmt: skip
    assert [x["flag"] for x in left] == ["--enable-chunked-prefill"]
    argv, _ = m.twin_flags(launches["C-no-cache"])
    assert "--no-prefix-caching" in argv and "--prefix-caching" not in argv
    _, left = m.twin_flags(launches["B"])
    assert {x["flag"] for x in left} == {"--enable-chunked-prefill", "--scheduling-policy", "--stream-interval"}
    assert all(x["reason"] for x in left)
    cmd = m.twin_command(9, launches["A"], "cpu-local")
    assert cmd[cmd.index("--mode") + 1] == "twin" and cmd[cmd.index("--twin-device") + 1] == "cpu-local"


AVX2 = "flags\t\t: fpu sse2 avx avx2 fma\nmodel name\t: AMD EPYC\ncpu family\t: 23\nmodel\t\t: 49\n"
ZEN4 = "flags\t\t: avx2 fma avx512f avx512bw avx512_bf16\nmodel name\t: AMD EPYC\ncpu family\t: 25\nmodel\t\t: 17\n"
ZEN5 = ZEN4.replace("avx512_bf16", "avx512_bf16 avx512_vp2intersect").replace("25", "26")


def test_the_twins_device_is_the_one_fitted_on_the_real_runs_host_class() -> None:
    from llmlab_loadtest.bench_meta import cpu_model

    # the metadata's cpu field as bench_meta writes it for each class
    assert m.twin_device(cpu_model(ZEN5)) == "cpu-local-avx512"
    assert m.twin_device(cpu_model(ZEN4)) == "cpu-local-zen4"
    assert m.twin_device(cpu_model(AVX2)) == "cpu-local"
    # ... and as it read before it named the ISA, then before it named vp2intersect
    assert m.twin_device("Intel(R) Xeon(R) Processor, 2 logical cores (2 physical)") == "cpu-local"
    assert m.twin_device("AMD EPYC, 2 logical cores (2 physical), avx2+avx512f+avx512_bf16") == "cpu-local-zen4"
    # every one is a device of the catalog the simulator loads
    from llmlab_twin.hwcatalog import get_device

    assert all(get_device(m.twin_device(cpu_model(c))) for c in (AVX2, ZEN4, ZEN5))


def test_kv_blocks_hold_the_real_engines_gib() -> None:
    # SmolLM2-135M: 30 layers, 3 KV heads of 64 dims; fp32 K and V: 2 * 30 * 3 * 64 * 4 = 46,080 bytes a token
    per_block = 2 * 30 * 3 * 64 * 4 * 128
    assert m.kv_blocks() == 2**30 // per_block == 182


def _summary(ttft: float, tok_s: float, hit: float) -> dict[str, Any]:
    def cell(**vals: float) -> dict[str, Any]:
        return {k: {"mean": v, "runs": [v, v]} for k, v in vals.items()}

    c = cell(**{"ttft_ms.p50": ttft, "output_tok_s": tok_s, "prefix_hit_rate": hit})
    return {"A": {"walk": {"2": c, "4": c}}, "B": c, "C": c, "C-no-cache": cell(**{"prefix_hit_rate": 0.0})}


def test_side_by_side_errors_are_the_twins_against_the_real_values() -> None:
    twin, real = _summary(1200.0, 9.0, 0.6), _summary(1000.0, 10.0, 0.5)
    twin["A"]["walk"].pop("4")  # a rung only the real walk measured is not compared
    rows = m.side_by_side(twin, real)
    assert {r["cell"] for r in rows} == {"A batch limit 2", "B", "C", "C-no-cache"}
    by = {(r["cell"], r["metric"]): r for r in rows}
    assert by[("B", "ttft_ms.p50")]["error_pct"] == pytest.approx(20.0)  # 1200 vs 1000
    assert by[("B", "output_tok_s")]["error_pct"] == pytest.approx(-10.0)  # 9 vs 10
    assert by[("C", "prefix_hit_rate")]["error_pct"] == pytest.approx(20.0)  # 0.6 vs 0.5
    assert by[("C-no-cache", "prefix_hit_rate")]["error_pct"] is None  # real 0: no relative error
    mae = m.mean_abs_error(rows)
    assert mae["ttft_ms.p50"] == pytest.approx(20.0) and mae["output_tok_s"] == pytest.approx(10.0)
    table = m.side_table(rows)
    assert "1200 / 1000 (+20%)" in table and "9.0 / 10.0 (-10%)" in table
