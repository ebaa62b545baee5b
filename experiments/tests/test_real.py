"""The real-engine experiments, quick versions, on REAL vLLM on this CPU (and llama.cpp via xllamacpp).

Slow by nature (each starts real engines: ~1-2.5 min on this shared 2-core machine), hence their own timeouts.
They check that every output is written and that the before/after rows exist with sane values, not the
absolute numbers (the machine is shared; those are in results/)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.vllm_cpu]

OUTPUTS = ("results.json", "table.md", "command.txt", "NOTE.md", "plot.png")


def _outputs(d: Path) -> dict:
    for f in OUTPUTS:
        assert (d / f).is_file() and (d / f).stat().st_size > 0, f"{f} missing in {d}"
    doc = json.loads((d / "results.json").read_text())
    assert doc["label"].startswith("MEASURED")
    assert "MEASURED" in (d / "table.md").read_text()
    note = (d / "NOTE.md").read_text()
    for section in ("## Hypothesis", "## Actual", "## Interpretation", "## Unverified", "## Command"):
        assert section in note
    assert doc["meta"]["simulated"] is False and doc["meta"]["git_commit"]
    return doc


@pytest.mark.timeout(900)
def test_caching_and_batching_before_after_through_the_stack(tmp_path: Path) -> None:
    from llmlab_experiments import real_caching_batching as m

    d = m.run(tmp_path, quick=True, command="pytest quick")
    doc = _outputs(d)
    runs = doc["rows"]["runs"]
    for exp, engines in (("caching", m.CACHING), ("batching", m.BATCHING)):
        for eng in engines:
            assert sorted(r["round"] for r in runs if r["experiment"] == exp and r["engine"] == eng) == [1, 2]
    assert all(r["requests"]["failed"] == 0 and r["requests"]["ok"] > 0 for r in runs)
    assert all(r["output_tokens_pinned"] for r in runs)
    assert all(r["client"]["cpu_util"] is not None and len(r["loadavg_before"]) == 3 for r in runs)

    def row(exp: str, eng: str, rnd: int) -> dict:
        return next(r for r in runs if r["experiment"] == exp and r["engine"] == eng and r["round"] == rnd)

    for rnd in (1, 2):
        on, off = row("caching", "pc-on", rnd), row("caching", "pc-off", rnd)
        assert on["prefix_hit_rate"] > 0.3 and off["prefix_hit_rate"] == 0.0
        assert on["ttft_ms"]["p50"] < off["ttft_ms"]["p50"]
        b_on, b_off = row("batching", "pc-off", rnd), row("batching", "batch-1", rnd)
        assert b_on["output_tok_s"] > b_off["output_tok_s"]
    s = doc["rows"]["summary"]
    assert s["ratios"]["caching_ttft_p50_off_over_on"] > 1 and s["ratios"]["batching_tok_s_on_over_off"] > 1
    assert s["caching"]["pc-on"]["ttft_ms.p50"]["spread_pct"] is not None


@pytest.mark.timeout(900)
def test_quant_quality_bf16_vllm_vs_q4_llamacpp(tmp_path: Path) -> None:
    from llmlab_experiments import real_quant_quality as m

    d = m.run(tmp_path, quick=True, command="pytest quick")
    doc = _outputs(d)
    rows = doc["rows"]
    n = len(m.items(quick=True))
    assert {it.layer for it in m.items(quick=True)} == {"knowledge", "korean", "service"}
    for eng in m.ENGINES:
        sc = rows["score"][eng]
        answers = [a for a in rows["answers"] if a["engine"] == eng]
        assert len(answers) == n and all(a["failure"] in (None, *m.FAILURE_TYPES) for a in answers)
        # The score is the answers' own judgement, counted again here (not 0 <= passed <= n).
        assert sc["n"] == n and sc["passed"] == sum(a["failure"] is None for a in answers)
        for kind in m.FAILURE_TYPES:
            assert sc["failures"].get(kind, 0) == sum(a["failure"] == kind for a in answers)
        assert sum(bool(a["text"].strip()) for a in answers) >= n // 2  # the engine really answered
        assert rows["engines"][eng]["rss_mib"] > 0
        speeds = [s for s in rows["speed"] if s["engine"] == eng]
        assert len(speeds) == 2 and all(s["ok"] and s["decode_tok_s"] > 0 for s in speeds)
    assert rows["engines"]["q4_1-llamacpp"]["weights_mb"] < rows["engines"]["bf16-vllm"]["weights_mb"]


@pytest.mark.timeout(900)
def test_edge_onnx_runs_the_exported_graph_against_llamacpp(tmp_path: Path) -> None:
    from llmlab_experiments import edge_onnx as m

    try:
        d = m.run(tmp_path, quick=True, command="pytest quick")
    except m.ExportRefused as e:
        pytest.fail(f"the exported graph does not compute the checkpoint's model: {e}")
    res = _outputs(d)["rows"]
    n, max_tokens = len(m.knowledge(quick=True)), res["max_tokens"]
    # The graph computes the checkpoint's model: its logits against transformers' own forward, at export.
    assert res["prep"]["export_dynamic"]["max_abs_logit_diff_vs_transformers"] < 1e-3
    lc = res["servers"]["llamacpp"]["answers"]
    assert len(lc) == n and all(len(a) == max_tokens for a in lc)
    assert set(res["edge"]) == {v.key for v in m.variants(quick=True)}
    for key, r in res["edge"].items():
        assert len(r["answers"]) == n, key
        for ids in r["answers"]:
            assert len(ids) == max_tokens and not set(ids) & set(m.BANNED), (key, ids)
        # Same weights, other runtime (4-bit blocks there): a wrong graph (rotary, masks, heads) would part
        # from llama.cpp at the first token; greedy may part later where their numerics round apart.
        assert all(a[0] == b[0] for a, b in zip(r["answers"], lc, strict=True)), (key, r["answers"], lc)
        assert r["quality"]["passed"] >= 1, r["quality"]  # "The capital of France is Paris." at 8 tokens
        assert 0 < r["session_s"] < r["cold_first_token_s"] and r["warm_decode_tok_s"] > 0
        assert r["rss_peak_mib"] > r["size_mb"] / 2  # the weights are resident (fp32, not mapped lazily)
    assert res["servers"]["llamacpp"]["size_mb"] < res["edge"]["dyn-fp32-all"]["size_mb"] / 4  # Q4_1 vs fp32


# The last two tests share pipelines A, B and C's engines (a vLLM start is most of each test's time here):
# started once for both, stopped after the second, the last test of this module.
@pytest.fixture(scope="module")
def engines_abc() -> Iterator[dict]:
    from llmlab_experiments import real_pipelines as rp

    launches = rp.launches_of_pipelines()
    with rp.engines({k: launches[k] for k in ("A", "B", "C")}) as served:
        yield served


@pytest.mark.timeout(900)
def test_the_section2_table_launches_pipelines_a_b_c_for_real(tmp_path: Path, engines_abc: dict) -> None:
    """The §2 table's code (make pipelines-table) at CI size: A, B and C started for real from their configs."""
    import itertools
    import time

    from llmlab_experiments import real_engines as m

    tput = m.Cell("throughput", 4, 1, 32, 8, metric="output_tok_s", higher_is_better=True)
    cs = (m.Cell("single_ttft", 1, 2, 128, 4), tput, m.Cell("long_in_short_out", 2, 1, 512, 4, metric="ttft_ms.p95"))
    t0 = time.time()
    rows, launches = m.execute(cs, rounds=1, running=engines_abc)  # make pipelines-table: m.ROUNDS
    doc = _outputs(m.report(tmp_path, "pytest ci-sized", cs, rows, launches, t0, time.time() - t0, True))
    runs = doc["rows"]["runs"]
    assert doc["meta"]["rounds"] == 1 and "mean over 1 rounds" in (tmp_path / m.NAME / "table.md").read_text()
    expected = itertools.product(m.PIPELINES, [c.key for c in cs], [1])
    assert sorted((r["engine"], r["cell"], r["round"]) for r in runs) == sorted(expected)
    for r in runs:
        c = next(c for c in cs if c.key == r["cell"])
        n = c.concurrency * c.per_stream
        assert r["requests"] == {"total": n, "ok": n, "failed": 0}, r["errors"]
        assert r["output_tokens"] == n * c.output  # end tokens banned: every request its full length
        # the engine's own count: the words asked for (about a token each) plus the tag and chat template
        assert c.prompt < r["prompt_tokens"]["max"] < 1.5 * c.prompt + 80
    for p in m.PIPELINES:
        # a prompt four times longer takes longer to prefill, on every pipeline's settings
        by = {r["cell"]: r for r in runs if r["engine"] == p and r["round"] == 1}
        assert by["long_in_short_out@2"]["ttft_ms"]["p50"] > by["single_ttft@1"]["ttft_ms"]["p50"]
    assert set(doc["rows"]["winners"]) == {c.key for c in cs}
    assert "## Winner per workload" in (tmp_path / m.NAME / "table.md").read_text()


@pytest.mark.timeout(900)
def test_make_pipelines_at_ci_size_runs_a_b_c_through_the_whole_stack(tmp_path: Path, engines_abc: dict) -> None:
    """`make pipelines` at CI size: A, B and C (and C without prefix caching) launched for real from their
    configs, each behind a worker and a gateway, one round of each workload, and the report written."""
    import time

    from llmlab_experiments import real_pipelines as m

    tiny = m.Sizes(a_streams=2, a_requests_per_stream=1, a_max_tokens=6, a_rungs=(1, 2),
                   b_requests=3, b_rate_per_s=2.0, b_max_tokens=4,
                   c_documents=1, c_questions=2, c_doc_sentences=20, c_max_tokens=4, c_short_chats=1)  # fmt: skip
    launches = m.launches_of_pipelines()
    t0 = time.time()
    rows, servers = m.execute(tiny, launches, rounds=1, running=engines_abc)  # C-no-cache started here
    doc = _outputs(m.report(tmp_path, "pytest ci-sized", tiny, rows, servers, launches, t0, time.time() - t0))
    assert sorted(s["engine"] for s in servers) == ["A", "B", "C", "C-no-cache"]
    # Each engine got its pipeline's flags: C's prefix caching on, its twin's off, on the command line.
    cmds = {s["engine"]: " ".join(s["command"]) for s in servers}
    assert "--no-enable-prefix-caching" in cmds["C-no-cache"] and "--no-enable-prefix-caching" not in cmds["C"]
    assert f"--max-num-seqs {launches['A'].flags['--max-num-seqs']}" in cmds["A"]
    for r in rows:  # every request answered in full (end tokens banned) through gateway, NATS and worker
        assert r["requests"]["failed"] == 0 and r["requests"]["ok"] == r["requests"]["total"] > 0, r["errors"]
    walk = [r["batch_limit"] for r in rows if r["engine"] == "A"]
    assert walk[0] == 1 and set(walk) <= {1, 2}
    summary = doc["rows"]["summary"]
    assert summary["rounds"] == 1 and summary["A"]["chosen_batch_limit"] in walk
    # The second question on the one document reuses its prefix with caching on, never with it off.
    assert summary["C"]["prefix_hit_rate"]["mean"] > 0.2
    assert summary["C-no-cache"]["prefix_hit_rate"]["mean"] == 0
    assert "batch limit" in (tmp_path / m.NAME / "table.md").read_text()
