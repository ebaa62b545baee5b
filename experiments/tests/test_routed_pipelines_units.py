"""The pure parts of the routed-pipelines experiment: the mixed trace's parts, each part judged by its own SLO,
the route matrix read back from a decision log, and the verdict. (The run itself: ``make pipelines-routed``.)"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from llmlab_experiments import routed_pipelines as m
from llmlab_loadtest.sse_client import RequestRecord


def _rec(ttft: float, tokens: int, e2e: float, ok: bool = True) -> RequestRecord:
    r = RequestRecord(index=0, stream=0, sent_at=0.0, status=200 if ok else 500)
    r.chunk_times = [ttft]
    r.end_at = e2e
    r.finish_reason = "length" if ok else None
    r.usage = {"completion_tokens": tokens, "prompt_tokens": 10}
    return r


def test_the_mixed_trace_has_four_parts_and_only_batch_asks_its_class() -> None:
    trace = m.mixed_trace("m", m.FULL, 1)
    assert list(trace) == ["batch", "interactive", "documents", "chats"]
    assert [trace[p][1] for p in trace] == ["batch", None, None, None]
    plans = {p: trace[p][0] for p in trace}
    assert sum(len(seq) for _, seq in plans["batch"]) == m.FULL.a_streams * m.FULL.a_requests_per_stream
    assert len(plans["interactive"]) == m.FULL.b_requests
    assert len(plans["documents"]) == m.FULL.c_documents
    assert all(len(seq) == m.FULL.c_questions for _, seq in plans["documents"])
    assert len(plans["chats"]) == m.FULL.c_short_chats
    # a document is long enough for the catalog's long-context class by the gateway's own estimate
    from llmlab_common.tokens import estimate_chat
    from llmlab_routing.config import load_router_catalog

    long_at = load_router_catalog(m.CATALOG).routing.class_long_prompt_tokens
    assert all(estimate_chat(seq[0]["messages"]).total >= long_at for _, seq in plans["documents"])
    assert all(estimate_chat(seq[0]["messages"]).total < long_at for _, seq in plans["chats"])


def test_each_part_is_judged_by_its_own_slo_and_goodput_is_over_the_runs_window() -> None:
    # chats are short interactive requests: B's SLO (TTFT 1.5 s), not C's (10 s)
    assert m.PARTS["chats"][1] == m.CPU_SLO["B"] and m.PARTS["documents"][1] == m.CPU_SLO["C"]
    recs = [_rec(1.0, 4, 1.3), _rec(2.0, 4, 2.3), _rec(0.5, 4, 0.8, ok=False)]
    got = m.part_metrics(recs, m.CPU_SLO["B"], window_s=10.0)
    assert (got["requests"], got["ok"], got["met"]) == (3, 2, 1)
    assert got["attainment"] == round(1 / 3, 4) and got["goodput_rps"] == 0.1
    assert got["ttft_ms"]["p95"] == 2000.0


def test_the_route_matrix_counts_first_targets_by_request_class_after_the_warm_up(tmp_path: Path) -> None:
    def rec(cls: str, dep: str | None) -> str:
        targets = [{"deployment": dep, "pool": "p", "worker_id": "w"}] if dep else []
        return json.dumps({"inputs": {"request_class": cls}, "decision": {"targets": targets}})

    log = tmp_path / "d.jsonl"
    log.write_text(
        "\n".join([rec("latency", "b"), rec("latency", "b"), rec("long_context", "c"), rec("latency", "a"),
                   rec("throughput", None)]) + "\n"
    )  # fmt: skip
    assert m.route_matrix(log, skip=1) == {
        "latency": {"b": 1, "a": 1},
        "long_context": {"c": 1},
        "throughput": {"(refused)": 1},
    }


def _summary(**goodputs: list[float]) -> dict[str, Any]:
    def cell(runs: list[float]) -> dict[str, Any]:
        return {"runs": runs, "mean": sum(runs) / len(runs)}

    return {k.replace("_", " "): {"goodput_rps": cell(v), "slo_attainment": cell(v)} for k, v in goodputs.items()}


def test_the_verdict_needs_by_class_above_every_single_pipeline() -> None:
    v = m.verdict(_summary(by_class=[0.7, 0.6], A_only=[0.3, 0.5], B_only=[0.2, 0.2]))
    assert v["goodput"] and v["attainment"] and v["every_round"] and v["best_single"] == "A only"
    v = m.verdict(_summary(by_class=[0.7, 0.4], A_only=[0.3, 0.5]))  # higher mean, not in every round
    assert v["goodput"] and not v["every_round"]
    v = m.verdict(_summary(by_class=[0.3, 0.3], A_only=[0.3, 0.5]))
    assert not v["goodput"]


def test_report_writes_the_table_note_plot_and_verdict(tmp_path: Path) -> None:
    def row(variant: str, rnd: int, met: int) -> dict[str, Any]:
        part = {"attainment": met / 10, "ttft_ms": {"p95": 100.0 * (11 - met)}}
        return {"variant": variant, "round": rnd, "goodput_rps": met / 20, "slo_attainment": met / 10,
                "parts": dict.fromkeys(m.PARTS, part), "prefix_hit_rate": 0.3, "preemptions": 0, "window_s": 20.0,
                "routes": {"latency": {variant: 10}}, "requests": 10, "ok": 10}  # fmt: skip

    rows = [row(v, r, 9 if v == "by class" else 4 + r) for v in m.VARIANTS for r in (1, 2)]
    out = m.report(tmp_path, "cmd", m.QUICK, rows, 0.0, 1.0)
    doc = json.loads((out / "results.json").read_text())["rows"]
    assert doc["verdict"]["goodput"] and doc["verdict"]["every_round"]
    table = (out / "table.md").read_text()
    assert "| by class | 0.450 (0.450, 0.450) | 0.90 (0.90, 0.90) " in table
    assert "| A only | latency | A only: 20 |" in table
    assert (out / "plot.png").stat().st_size > 0 and "beats every single pipeline on goodput: True" in (
        out / "NOTE.md"
    ).read_text()


def test_the_real_run_has_no_batch_part_and_two_engines_per_variant() -> None:
    from llmlab_experiments import real_routed_pipelines as r

    trace = m.mixed_trace("m", r.FULL, 1, r.DESIGN.parts)
    assert list(trace) == ["interactive", "documents", "chats"]
    # the parts it keeps are the twin's, request for request
    twin = m.mixed_trace("m", r.FULL, 1)
    assert all(trace[p] == twin[p] for p in trace)
    assert all(len(engines) == 2 for engines in r.DESIGN.variants.values())
    assert r.DESIGN.variants["by class"] == ("B", "C")
    header = m.table({}, r.DESIGN).splitlines()[0]
    assert "batch" not in header and "documents met" in header and "chats TTFT p95 (ms)" in header


def test_each_real_engine_runs_on_a_core_of_its_own() -> None:
    from llmlab_experiments import real_routed_pipelines as r
    from llmlab_experiments.real_pipelines import launches_of_pipelines

    assert [r.core_of(k, [0, 1]) for k in ("B1", "C2", "B3")] == [0, 1, 0]
    assert [r.core_of(k, [2, 5]) for k in ("C1", "C2")] == [2, 5]
    launch = launches_of_pipelines()["B"]
    cores = sorted(os.sched_getaffinity(0))
    p = r.pinned_vllm_process("C2", 8123, launch)
    core = str(cores[1 % len(cores)])
    assert p.cmd[:3] == ["taskset", "-c", core] and "vllm.entrypoints.openai.api_server" in p.cmd
    assert p.env["VLLM_CPU_OMP_THREADS_BIND"] == core
    assert p.cmd[p.cmd.index("--max-num-seqs") + 1] == str(launch.flags["--max-num-seqs"])


def test_the_a_b_pair_runs_the_batch_and_interactive_parts_as_the_twin_does() -> None:
    from llmlab_experiments.real_routed_pipelines_ab import AB

    d = AB.design
    assert d.variants == {"by class": ("A", "B"), "A only": ("A", "A"), "B only": ("B", "B")}
    trace = m.mixed_trace("m", AB.full, 1, d.parts)
    assert list(trace) == ["batch", "interactive"] and trace["batch"][1] == "batch"
    twin = m.mixed_trace("m", m.FULL, 1)
    assert trace["batch"] == twin["batch"] and trace["interactive"] == twin["interactive"]
    header = m.table({}, d).splitlines()[0]
    assert "batch met" in header and "documents" not in header
