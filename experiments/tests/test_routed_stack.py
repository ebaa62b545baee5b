"""Routing by request class through the whole stack at CI size: the code of ``make pipelines-routed-real``
(its design, its trace, the stack on the pipelines' catalog, its report) with the engine twin in place of
real vLLM, whose six engine starts do not fit CI. The real run's figures are in results/real_routed_pipelines."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e


@pytest.mark.timeout(300)
def test_the_real_runs_design_routes_each_class_to_its_pipeline_through_the_stack(tmp_path: Path) -> None:
    from llmlab_experiments import real_routed_pipelines as r
    from llmlab_experiments import routed_pipelines as rp
    from llmlab_experiments.twin_pipelines import twin_process

    s = r.QUICK
    design = rp.Design({k: r.DESIGN.variants[k] for k in ("by class", "B only")}, r.DESIGN.parts, rounds=1)
    t0 = time.time()
    rows = rp.execute(s, spawn=twin_process, design=design)

    assert [x["variant"] for x in rows] == ["by class", "B only"]
    # The trace's requests by the router's class: B's questions and C's chats are latency requests, C's
    # documents (each asked c_questions times) long-context ones.
    latency, long_context = s.b_requests + s.c_short_chats, s.c_documents * s.c_questions
    by, b_only = rows
    assert by["routes"] == {
        "latency": {"smollm2-b-latency": latency},
        "long_context": {"smollm2-c-long-context": long_context},
    }
    # B alone: the pipeline filter is soft, so the documents (still long-context requests) go to B's engines
    assert b_only["routes"] == {
        "latency": {"smollm2-b-latency": latency},
        "long_context": {"smollm2-b-latency": long_context},
    }
    for row in rows:
        assert row["requests"] == row["ok"] == latency + long_context, row["errors"]
        assert set(row["parts"]) == {"interactive", "documents", "chats"}
        assert sum(p["requests"] for p in row["parts"].values()) == row["requests"]
    # By class, C's engine read the documents: it took far more prompt tokens than B's engine
    assert by["engine_tokens"]["C2"]["prompt"] > 3 * by["engine_tokens"]["B1"]["prompt"]

    d = r.report(tmp_path, "pytest", s, rows, t0, time.time() - t0)
    for f in ("results.json", "table.md", "NOTE.md", "plot.png", "command.txt"):
        assert (d / f).stat().st_size > 0, f
    doc = json.loads((d / "results.json").read_text())
    assert set(doc["rows"]["summary"]) == {"by class", "B only"} and doc["rows"]["rounds"] == [1]
    assert set(doc["rows"]["verdict"]) >= {"goodput", "attainment", "every_round"}
    table = (d / "table.md").read_text()
    assert "| by class |" in table and "| B only |" in table and "batch met" not in table
