"""The pure parts of the real-pipelines experiment: which flags reach vLLM on this CPU, the SLO check, goodput
and A's choice of batch limit. (The run itself, on real vLLM: ``make pipelines``.)"""

from __future__ import annotations

from typing import Any

import pytest
from llmlab_experiments import real_pipelines as m
from llmlab_experiments.pipelines import load_pipelines
from llmlab_loadtest.sse_client import RequestRecord


def test_gpu_only_flags_are_skipped_with_a_reason_and_the_rest_launch_as_written() -> None:
    pipes = load_pipelines()
    a = m.cpu_launch(pipes["A"])
    assert [x["flag"] for x in a.skipped] == ["--gpu-memory-utilization"]
    assert "VLLM_CPU_KVCACHE_SPACE" in a.skipped[0]["reason"]
    assert a.flags["--max-num-seqs"] == 128 and a.flags["--max-num-batched-tokens"] == 8192
    assert a.flags["--enable-chunked-prefill"] is True and a.changed == []
    c = m.cpu_launch(pipes["C"])
    assert {x["flag"] for x in c.skipped} == {"--gpu-memory-utilization", "--tensor-parallel-size"}
    assert c.flags["--max-model-len"] == 8192
    assert c.changed == [
        {"flag": "--max-model-len", "from": 32768, "to": 8192, "reason": "SmolLM2-135M has 8,192 positions"}
    ]
    assert c.flags["--long-prefill-token-threshold"] == 2048
    b = m.cpu_launch(pipes["B"])
    assert b.flags["--scheduling-policy"] == "priority" and b.flags["--stream-interval"] == 1


def test_the_engine_command_takes_the_pipelines_values_once(monkeypatch: pytest.MonkeyPatch) -> None:
    base = ["python", "-m", "vllm.entrypoints.openai.api_server", "--dtype", "float32", "--max-model-len", "2048"]
    monkeypatch.setattr(m, "vllm_base_command", lambda port: list(base))
    launch = m.cpu_launch(load_pipelines()["C"], prefix_caching=False)
    cmd = m.engine_command(8000, launch)
    assert cmd.count("--max-model-len") == 1 and cmd[cmd.index("--max-model-len") + 1] == "8192"
    assert "--no-enable-prefix-caching" in cmd and "--enable-prefix-caching" not in cmd
    assert cmd[cmd.index("--max-num-seqs") + 1] == "128"
    assert "--gpu-memory-utilization" not in cmd and "--tensor-parallel-size" not in cmd


def _rec(ttft: float | None, tokens: int, e2e: float, ok: bool = True) -> RequestRecord:
    r = RequestRecord(index=0, stream=0, sent_at=0.0, status=200 if ok else 500)
    r.chunk_times = [] if ttft is None else [ttft]
    r.end_at = e2e
    r.finish_reason = "length" if ok else None
    r.usage = {"completion_tokens": tokens, "prompt_tokens": 10}
    return r


def test_a_request_meets_its_slo_only_with_both_ttft_and_tpot_within_it() -> None:
    slo = m.Slo(ttft_s=1.0, tpot_s=0.2)
    assert m.meets(_rec(0.9, 11, 0.9 + 10 * 0.19), slo)  # TPOT 0.19
    assert not m.meets(_rec(1.1, 11, 1.1 + 10 * 0.1), slo)  # TTFT over
    assert not m.meets(_rec(0.5, 11, 0.5 + 10 * 0.25), slo)  # TPOT 0.25 over
    assert m.meets(_rec(0.5, 1, 0.5), slo)  # one token: TTFT alone
    assert not m.meets(_rec(0.5, 11, 1.0, ok=False), slo)  # failed


def test_goodput_counts_the_requests_within_the_slo_per_second_of_the_window() -> None:
    slo = m.Slo(ttft_s=1.0, tpot_s=0.2)
    recs = [_rec(0.5, 11, 1.5), _rec(0.5, 11, 1.5), _rec(2.0, 11, 3.0), _rec(0.5, 11, 5.0)]  # 2 of 4 meet
    assert m.goodput(recs, slo, 4.0) == (0.5, 0.5)
    assert m.goodput([], slo, 4.0) == (None, None)


def _row(limit: int, goodput: float, tpot_p95_ms: float) -> dict[str, Any]:
    return {"batch_limit": limit, "goodput_rps": goodput, "tpot_ms": {"p95": tpot_p95_ms}, "slo": {"tpot_s": 0.25}}


def test_a_chooses_the_best_goodput_within_the_slo_not_the_best_overall() -> None:
    rows = [_row(2, 0.5, 100), _row(4, 0.9, 200), _row(8, 1.2, 300)]  # 8 has more goodput but breaks TPOT p95
    assert m.choose_rung(rows) == {"batch_limit": 4, "goodput_rps": 0.9, "within_slo": True}
    broken = [_row(2, 0.3, 900), _row(4, 0.4, 800)]
    assert m.choose_rung(broken) == {"batch_limit": 4, "goodput_rps": 0.4, "within_slo": False}


def test_workloads_are_what_each_pipeline_asks_for() -> None:
    s = m.QUICK
    a = m.a_plan("x", s, 1, 2)
    assert len(a) == s.a_streams and all(at == 0.0 and len(seq) == s.a_requests_per_stream for at, seq in a)
    b = m.b_plan("x", s, 1)
    offsets = [at for at, _ in b]
    assert offsets == sorted(offsets) and offsets[0] == 0.0 and offsets[-1] > 0  # open loop: spread arrivals
    assert all(seq[0]["max_tokens"] == s.b_max_tokens for _, seq in b)
    c = m.c_plans("x", s, 1)
    docs = [seq for _, seq in c if seq[0]["max_tokens"] == s.c_max_tokens]
    assert len(docs) == s.c_documents and all(len(seq) == s.c_questions for seq in docs)
    # the questions of one document share its text as the system prompt: the prefix caching can reuse
    for seq in docs:
        assert len({body["messages"][0]["content"] for body in seq}) == 1
    assert m.b_plan("x", s, 1) == b and m.b_plan("x", s, 2) != b  # seeded per round
