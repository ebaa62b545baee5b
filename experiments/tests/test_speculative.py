"""§5 speculative decoding on the twin: the acceptance model, draft memory, stop rules and the experiment's outputs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from llmlab_experiments import speculative as sp
from llmlab_twin.hwcatalog import get_device, get_model

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    d = sp.run(tmp_path_factory.mktemp("spec"), True, "python -m llmlab_experiments --quick --only speculative")
    return d, json.loads((d / "results.json").read_text())["rows"]


def test_expected_tokens_per_step() -> None:
    assert sp.expected_tokens_per_step(0.0, 5) == 1.0
    assert sp.expected_tokens_per_step(1.0, 5) == 6.0
    assert sp.expected_tokens_per_step(0.5, 3) == pytest.approx(1.875)


def test_simulated_acceptance_matches_the_model() -> None:
    pair = sp.PAIRS[0]
    tcm, dcm = sp.cost_models(pair)
    r = sp.simulate(tcm, dcm, k=5, alpha=0.7, concurrency=8, output_tokens=1024, max_seqs=8)
    e = sp.expected_tokens_per_step(0.7, 5)
    assert r["draft_acceptance_rate"] == pytest.approx((e - 1) / 5, abs=0.03)
    # per-sequence steps end early when few tokens are left, so allow a little below the formula
    assert r["tokens_per_seq_step"] == pytest.approx(e, rel=0.06)


def test_draft_memory_costs_sequences() -> None:
    dev = get_device("H100-SXM")
    target, draft = get_model("Qwen3-32B"), get_model("Qwen3-0.6B")
    base = sp.capacity(target, None, dev, 768, 0)
    spec = sp.capacity(target, draft, dev, 768, 5)
    assert 0 < spec.max_seqs < base.max_seqs
    assert spec.draft_weights_gib == pytest.approx(draft.weight_bytes("bf16") / sp.GiB)


def _row(**kw: Any) -> dict[str, Any]:
    r = {"concurrency": 8, "alpha": 0.7, "max_seqs": 100, "itl_p95_ms": 5.0, "output_tok_s": 200.0}
    return r | {"tokens_per_seq_step": 2.0, "mean_step_ms": 10.0} | kw


def test_stop_rules() -> None:
    base = _row(itl_p95_ms=6.0, output_tok_s=100.0, mean_step_ms=6.0)
    assert sp.stop_rules(_row(), base) == (True, [])
    ok, why = sp.stop_rules(_row(itl_p95_ms=7.0), base)
    assert not ok and why[0].startswith("p95 ITL worse")
    ok, why = sp.stop_rules(_row(max_seqs=4), base)
    assert not ok and why[0].startswith("concurrency lost")
    # 1.5 tokens per step cannot pay for a step 10/6 = 1.67x as long
    ok, why = sp.stop_rules(_row(tokens_per_seq_step=1.5), base)
    assert not ok and why[0].startswith("acceptance too low")
    ok, why = sp.stop_rules(_row(output_tok_s=90.0), base)
    assert not ok and why == ["throughput not above the baseline (90 vs 100 tok/s)"]
    # a draft that costs capacity the load does not need is not "concurrency lost"
    assert sp.stop_rules(_row(max_seqs=8), base)[0]


def test_quick_run_writes_every_output(quick: tuple[Path, list[dict[str, Any]]]) -> None:
    d, rows = quick
    assert {p.name for p in d.iterdir()} >= {"results.json", "table.md", "command.txt", "NOTE.md", "plot.png"}
    assert all(r["simulated"] for r in rows)
    assert all(r["alpha_assumed"] for r in rows if r["k"] > 0)
    assert "ASSUMED" in (d / "table.md").read_text()


def _find(rows: list[dict[str, Any]], pair: sp.Pair, c: int, k: int, a: float) -> dict[str, Any]:
    return next(r for r in rows if (r["pair"], r["concurrency"], r["k"], r["alpha"]) == (pair.label, c, k, a))


def test_helps_at_low_concurrency_and_is_rejected_at_high_concurrency_or_low_alpha(
    quick: tuple[Path, list[dict[str, Any]]],
) -> None:
    _, rows = quick
    for pair in sp.PAIRS:
        one = _find(rows, pair, 1, 5, 0.85)
        assert one["accepted"] and one["speedup"] > 1.5
        many = _find(rows, pair, 32, 5, 0.85)
        assert many["speedup"] < one["speedup"]  # verification turns compute-bound with the batch
        assert not any(r["accepted"] for r in rows if r["pair"] == pair.label and r["k"] > 0 and r["concurrency"] == 32)
        assert not any(r["accepted"] for r in rows if r["pair"] == pair.label and r["alpha"] == 0.5)
    # the 32B pair loses concurrency to the 0.6B draft's weights and KV at c=32
    big = _find(rows, sp.PAIRS[1], 32, 5, 0.85)
    assert any(x.startswith("concurrency lost") for x in big["reasons"])
