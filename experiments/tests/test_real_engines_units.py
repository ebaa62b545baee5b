"""The pure parts of the §2 table on real vLLM: its cells, their prompts, the winner rule and the report. (The run
itself, on real vLLM: ``make pipelines-table``; a quick run in experiments/tests/test_real.py.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from llmlab_experiments import real_engines as m


def test_the_cells_are_the_tutorials_workloads_and_concurrencies() -> None:
    full = m.cells(quick=False)
    assert [c.workload for c in full] == [
        "single_ttft",
        "throughput",
        "throughput",
        "throughput",
        "throughput",
        "repeated_prefix",
        "long_in_short_out",
        "short_in_long_out",
    ]
    assert [c.concurrency for c in full if c.workload == "throughput"] == [1, 8, 32, 128]
    assert next(c for c in full if c.workload == "single_ttft").concurrency == 1
    # long input, short output and the reverse, by their own sizes
    long_in = next(c for c in full if c.workload == "long_in_short_out")
    long_out = next(c for c in full if c.workload == "short_in_long_out")
    assert long_in.prompt > 10 * long_in.output and long_out.output > 5 * long_out.prompt
    assert [c.prefix > 0 for c in full] == [c.workload == "repeated_prefix" for c in full]
    assert len({c.key for c in full}) == len(full)
    # B's --max-model-len (4,096) must hold every request, or B would refuse the long ones
    assert all(c.prefix + c.prompt + c.output + 100 < 4096 for c in full)


def _texts(plan: m.Plan) -> list[tuple[str | None, str]]:
    out = []
    for _, bodies in plan:
        for b in bodies:
            msgs = b["messages"]
            system = msgs[0]["content"] if msgs[0]["role"] == "system" else None
            out.append((system, msgs[-1]["content"]))
    return out


def test_prompts_share_a_leading_block_only_where_the_cell_says_and_change_every_round() -> None:
    cell = m.Cell("throughput", 8, 2, 64, 16)
    r1 = _texts(m.plan_for(cell, "x", 1))
    assert len(r1) == 16 and all(s is None for s, _ in r1)
    # each request's own tag first: no two share even their first 3 words
    assert len({u.split(":")[0] for _, u in r1}) == 16
    assert all(30 < len(u.split()) - 4 <= 64 + 1 for _, u in r1)  # the tag, then the words asked for
    assert m.plan_for(cell, "x", 1) == m.plan_for(cell, "x", 1)  # the same prompts on every engine of a round
    r2 = _texts(m.plan_for(cell, "x", 2))
    assert not {u for _, u in r1} & {u for _, u in r2}

    shared = m.Cell("repeated_prefix", 4, 2, 16, 8, prefix=300)
    p1 = _texts(m.plan_for(shared, "x", 1))
    systems = {s for s, _ in p1}
    assert len(systems) == 1 and len(next(iter(systems)).split()) == 300  # type: ignore[union-attr]
    assert systems.isdisjoint({s for s, _ in _texts(m.plan_for(shared, "x", 2))})
    body = m.plan_for(shared, "x", 1)[0][1][0]
    assert body["max_tokens"] == 8 and body["stream"] and body["temperature"] == 0


def _by(runs: dict[str, list[float]], metric: str) -> dict[str, dict[str, Any]]:
    return {
        p: {metric: {"runs": v, "mean": sum(v) / len(v) if v else None, "spread_pct": None}} for p, v in runs.items()
    }


@pytest.mark.parametrize(
    ("higher", "runs", "winner", "tied"),
    [
        # lower wins: A's worst (110) is better than B's best (120): A alone
        (False, {"A": [100.0, 110.0], "B": [120.0, 130.0], "C": [300.0, 310.0]}, "A", []),
        # lower wins: A's worst (125) reaches B's best (120): a tie
        (False, {"A": [100.0, 125.0], "B": [120.0, 130.0], "C": [300.0, 310.0]}, "A", ["B"]),
        # higher wins: C's worst (50) above A's best (45)
        (True, {"A": [40.0, 45.0], "B": [10.0, 12.0], "C": [50.0, 60.0]}, "C", []),
        # higher wins: C's worst (44) under A's best (45): a tie
        (True, {"A": [40.0, 45.0], "B": [10.0, 12.0], "C": [44.0, 60.0]}, "C", ["A"]),
    ],
)
def test_a_winner_is_named_only_when_its_rounds_do_not_reach_the_runner_ups(
    higher: bool, runs: dict[str, list[float]], winner: str, tied: list[str]
) -> None:
    metric = "output_tok_s" if higher else "ttft_ms.p95"
    cell = m.Cell("w", 1, 1, 1, 1, metric=metric, higher_is_better=higher)
    assert m.winner(cell, _by(runs, metric)) == {"winner": winner, "tie_with": tied}


def _row(pipeline: str, cell: m.Cell, rnd: int, value: float) -> dict[str, Any]:
    d = {"p50": value, "p95": value * 1.5, "p99": value * 2}
    return {
        "engine": pipeline,
        "pipeline": pipeline,
        "cell": cell.key,
        "round": rnd,
        "requests": {"total": 2, "ok": 2, "failed": 0},
        "ttft_ms": d,
        "itl_ms": d,
        "tpot_ms": d,
        "e2e_ms": d,
        "output_tok_s": value,
        "prefix_hit_rate": 0.0,
        "preemptions": 0.0,
        "engine_cpu_s": 1.0,
        "prompt_tokens": {"min": 60, "max": 70},
    }


def test_report_writes_the_winners_every_cell_note_and_plot(tmp_path: Path) -> None:
    cs = m.cells(quick=True)
    base = {"A": 100.0, "B": 200.0, "C": 300.0}
    rows = [_row(p, c, r, base[p] + r) for c in cs for p in m.PIPELINES for r in (1, 2)]
    launches = {k: v for k, v in m.launches_of_pipelines().items() if k in m.PIPELINES}
    out = m.report(tmp_path, "cmd", cs, rows, launches, 0.0, 1.0, True)
    doc = json.loads((out / "results.json").read_text())["rows"]
    # lower-is-better cells go to A (100 ms), higher-is-better ones to C (300 tok/s)
    for c in cs:
        assert doc["winners"][c.key] == {"winner": "C" if c.higher_is_better else "A", "tie_with": []}
    table = (out / "table.md").read_text()
    ttft = next(c for c in cs if c.workload == "single_ttft")
    # means 101.5, 201.5, 301.5 (round half to even)
    line = f"| {ttft.label} | 1 | TTFT p50 (ms), lower wins | 102 (101, 102) | 202 (201, 202) | 302 (301, 302) "
    assert line in table
    assert "| throughput | 8 | B | 70 (70, 70) |" in table
    assert (out / "plot.png").stat().st_size > 0
    assert "single_ttft@1: A" in (out / "NOTE.md").read_text()


def test_the_twins_side_by_side_is_per_cell_pipeline_and_metric_against_the_real_value() -> None:
    from llmlab_experiments import twin_engines as t

    cs = [m.Cell("single_ttft", 1, 2, 8, 4), m.Cell("throughput", 8, 1, 8, 4, metric="output_tok_s")]

    def summary(ttft: float, tok_s: float) -> dict[str, Any]:
        cell = {"ttft_ms.p50": {"mean": ttft}, "output_tok_s": {"mean": tok_s}}
        return {c.key: dict.fromkeys(m.PIPELINES, cell) for c in cs}

    rows = t.side_by_side(summary(120.0, 45.0), summary(100.0, 50.0), cs)
    assert len(rows) == len(cs) * len(m.PIPELINES) * 2  # metrics neither run has are left out
    assert rows[0] == {
        "cell": "single_ttft@1 A",
        "metric": "ttft_ms.p50",
        "twin": 120.0,
        "real": 100.0,
        "error_pct": 20.0,  # (120 - 100) / 100
    }
    assert {r["error_pct"] for r in rows if r["metric"] == "output_tok_s"} == {-10.0}


def test_the_twin_names_the_same_winner_only_with_the_same_pipelines_at_the_top() -> None:
    from llmlab_experiments import twin_engines as t

    real = {"a": {"winner": "A", "tie_with": []}, "b": {"winner": "B", "tie_with": ["C"]}, "c": {"winner": "C",
            "tie_with": []}}  # fmt: skip
    twin = {"a": {"winner": "A", "tie_with": []}, "b": {"winner": "C", "tie_with": ["B"]}, "c": {"winner": "C",
            "tie_with": ["A"]}}  # fmt: skip
    assert t.same_winners(twin, real) == {"a": True, "b": True, "c": False}
