"""The pure parts of the long-prefill experiment: C's launch with the threshold replaced, and the summary by
threshold. (The run itself, on real vLLM: ``make pipelines-long-prefill``.)"""

from __future__ import annotations

from typing import Any

from llmlab_experiments import real_long_prefill as m
from llmlab_experiments import real_pipelines as rp


def test_each_launch_is_cs_with_only_the_threshold_changed() -> None:
    ls = m.launches((2048, 256))
    assert list(ls) == ["threshold 2048", "threshold 256"]
    c = rp.launches_of_pipelines()["C"]
    assert ls["threshold 2048"].flags == c.flags  # C's configured value
    low = ls["threshold 256"].flags
    assert low["--long-prefill-token-threshold"] == 256
    assert {k: v for k, v in low.items() if k != "--long-prefill-token-threshold"} == {
        k: v for k, v in c.flags.items() if k != "--long-prefill-token-threshold"
    }
    cmd = rp.engine_command(8000, ls["threshold 256"])
    assert cmd[cmd.index("--long-prefill-token-threshold") + 1] == "256"


def _row(threshold: int, rnd: int, chats: float) -> dict[str, Any]:
    return {"threshold": threshold, "round": rnd, "short_ttft_p95_ms": chats}


def test_the_summary_is_by_threshold_configured_value_first() -> None:
    rows = [_row(256, 1, 100.0), _row(2048, 1, 400.0), _row(2048, 2, 600.0), _row(256, 2, 300.0)]
    s = m.summarize(rows)
    assert list(s) == ["2048", "256"]
    assert s["2048"]["short_ttft_p95_ms"]["runs"] == [400.0, 600.0]
    assert s["256"]["short_ttft_p95_ms"]["mean"] == 200.0


def test_document_ttfts_split_each_documents_first_question_from_the_later_ones() -> None:
    from llmlab_loadtest.sse_client import RequestRecord

    # streams 0 and 1: documents of two questions each; stream 2: a short chat
    plan = [
        (0.0, [{"max_tokens": 12}] * 2),
        (0.0, [{"max_tokens": 12}] * 2),
        (1.0, [{"max_tokens": rp.SHORT_MAX_TOKENS}]),
    ]

    def rec(index: int, stream: int, ttft: float) -> RequestRecord:
        r = RequestRecord(index=index, stream=stream, sent_at=0.0, status=200)
        r.chunk_times, r.end_at, r.finish_reason = [ttft], ttft + 1, "length"
        return r

    recs = [rec(0, 0, 5.0), rec(1, 1, 7.0), rec(2, 2, 0.1), rec(3, 0, 0.3), rec(4, 1, 0.2)]
    assert m.document_ttfts(recs, plan) == {"document_cold_ttft_p50_ms": 7000.0, "document_warm_ttft_p50_ms": 300.0}
