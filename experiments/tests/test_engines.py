"""§2.2 vLLM vs SGLang on the twin: the quick run writes every output, the table has every cell, and sanity
invariants hold (prefix caching lowers repeated-prefix TTFT; real-GPU columns say unverified)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from llmlab_experiments import engines
from llmlab_experiments.pipelines import get_pipeline

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return engines.run(tmp_path_factory.mktemp("out"), True, "python -m llmlab_experiments --quick --only engines")


def test_quick_run_writes_every_output(quick_run: Path) -> None:
    assert {p.name for p in quick_run.iterdir()} == {"results.json", "table.md", "command.txt", "NOTE.md", "plot.png"}
    res = json.loads((quick_run / "results.json").read_text())
    assert res["label"].startswith("SIMULATED") and res["meta"]["simulated"] is True
    cells = res["rows"]["cells"]
    with_cache = {(c["workload"], c["concurrency"], c["engine"]) for c in cells if c["prefix_caching"]}
    assert with_cache == {
        (w.name, c, e) for w in engines.WORKLOADS for c in engines.CONCURRENCY for e in engines.ENGINES
    }
    assert all(c["real_gpu"] == engines.UNVERIFIED for c in cells)


def test_table_has_every_row_and_a_winner_per_workload(quick_run: Path) -> None:
    table = (quick_run / "table.md").read_text()
    assert "SIMULATED" in table and "unverified (no GPU here)" in table
    n_cells = len(engines.WORKLOADS) * len(engines.CONCURRENCY) * len(engines.ENGINES)
    n_off = len(engines.CONCURRENCY) * len(engines.ENGINES)  # repeated prefix with the cache off
    rows = [ln for ln in table.splitlines() if ln.startswith("| ") and not ln.startswith("| workload")]
    assert len(rows) == n_cells + n_off + len(engines.WORKLOADS)
    wins = json.loads((quick_run / "results.json").read_text())["rows"]["winners"]
    assert [w["workload"] for w in wins] == [w.name for w in engines.WORKLOADS]
    assert all(w["winner"] in {"vllm", "sglang", "tie"} for w in wins)


def test_prefix_caching_lowers_repeated_prefix_ttft(quick_run: Path) -> None:
    cells = json.loads((quick_run / "results.json").read_text())["rows"]["cells"]
    rp = [c for c in cells if c["workload"] == "repeated_prefix"]
    for e in engines.ENGINES:
        for conc in engines.CONCURRENCY:
            on = next(c for c in rp if c["engine"] == e and c["concurrency"] == conc and c["prefix_caching"])
            off = next(c for c in rp if c["engine"] == e and c["concurrency"] == conc and not c["prefix_caching"])
            assert on["ttft_p50_s"] < off["ttft_p50_s"]
            assert on["prefix_hit_rate"] > 0.9 and off["prefix_hit_rate"] == 0


def test_concurrency_raises_throughput_and_ttft() -> None:
    pl = get_pipeline("A")
    w = next(w for w in engines.WORKLOADS if w.name == "throughput")
    one = engines.run_cell(pl, w, "vllm", 1, 2)
    many = engines.run_cell(pl, w, "vllm", 32, 2)
    assert many["output_tokens_per_s"] > 5 * one["output_tokens_per_s"]
    assert many["itl_p50_s"] >= one["itl_p50_s"]


def test_a_cell_is_deterministic() -> None:
    # the note's "run twice" claim for the twin: the same cell gives the same figures
    pl = get_pipeline("A")
    w = next(w for w in engines.WORKLOADS if w.name == "repeated_prefix")
    assert engines.run_cell(pl, w, "sglang", 8, 2) == engines.run_cell(pl, w, "sglang", 8, 2)
