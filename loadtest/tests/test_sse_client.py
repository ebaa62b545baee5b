"""The SSE load client: percentile/summary math (unit) and real runs against a simulator (integration)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from llmlab_loadtest import sse_client as sc
from llmlab_testkit.procs import Stack, free_port, url

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
CLIENT = Path(sc.__file__).resolve()


def _rec(
    index: int,
    sent: float,
    chunks: list[float],
    tokens: int | None,
    *,
    end: float | None = None,
    finish: str | None = "stop",
    status: int = 200,
    kind: str | None = None,
) -> sc.RequestRecord:
    r = sc.RequestRecord(
        index=index,
        stream=index,
        sent_at=sent,
        status=status,
        chunk_times=chunks,
        end_at=end if end is not None else (chunks[-1] if chunks else 0.0) + 0.001,
        finish_reason=finish,
        done=True,
        error_kind=kind,
        error=kind and f"{kind} error",
    )
    if tokens is not None:
        r.usage = {"prompt_tokens": 12, "completion_tokens": tokens, "total_tokens": tokens + 12}
    return r


# -- percentile / distribution -------------------------------------------------------------------
@pytest.mark.unit
def test_percentile_interpolates_linearly_like_numpy() -> None:
    data = [4.0, 1.0, 3.0, 2.0]  # unsorted on purpose
    assert sc.percentile(data, 0) == 1.0
    assert sc.percentile(data, 100) == 4.0
    assert sc.percentile(data, 50) == pytest.approx(2.5)
    assert sc.percentile(data, 99) == pytest.approx(3.97)  # numpy.percentile([1,2,3,4], 99)
    assert sc.percentile(list(range(1, 101)), 95) == pytest.approx(95.05)
    assert sc.percentile([7.0], 99) == 7.0
    assert sc.percentile([], 50) is None
    with pytest.raises(ValueError):
        sc.percentile(data, 101)


@pytest.mark.unit
def test_distribution_reports_milliseconds() -> None:
    d = sc.distribution_ms([0.1, 0.2, 0.3])
    assert d["p50"] == pytest.approx(200.0)
    assert d["mean"] == pytest.approx(200.0)
    assert d["max"] == pytest.approx(300.0)
    assert d["n"] == 3
    empty = sc.distribution_ms([])
    assert empty["p50"] is None and empty["n"] == 0


# -- SSE parsing ------------------------------------------------------------------------------------
@pytest.mark.unit
def test_sse_parser_splits_events_across_reads_and_line_endings() -> None:
    p = sc.SSEParser()
    assert p.feed(b'data: {"a":1}\n\ndata: {"b"') == [b'{"a":1}']
    assert p.feed(b":2}\n\n: comment\n\ndata: [DONE]\r\n\r\n") == [b'{"b":2}', b"[DONE]"]
    assert p.feed(b"event: x\ndata: line1\ndata: line2\n\n") == [b"line1\nline2"]
    assert p.feed(b"data: tail-without-blank-line") == []
    assert p.close() == [b"tail-without-blank-line"]


def _chunk(
    content: str | None = None,
    *,
    role: bool = False,
    finish: str | None = None,
    usage: dict[str, int] | None = None,
    compact: bool = True,
) -> bytes:
    if usage is not None:
        obj: dict[str, object] = {"id": "x", "object": "chat.completion.chunk", "choices": [], "usage": usage}
    else:
        delta: dict[str, object] = {"role": "assistant"} if role else {}
        if content is not None:
            delta["content"] = content
        obj = {
            "id": "x",
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
            "usage": None,
        }
    return json.dumps(obj, separators=(",", ":") if compact else (", ", ": ")).encode()


@pytest.mark.unit
@pytest.mark.parametrize("compact", [True, False])
def test_apply_event_counts_only_content_chunks(compact: bool) -> None:
    r = sc.RequestRecord(index=0, stream=0, sent_at=0.0)
    sc.apply_event(r, _chunk("", role=True, compact=compact), 0.10)  # role-only opener: no content
    sc.apply_event(r, _chunk("Hello", compact=compact), 0.11)
    sc.apply_event(r, _chunk(' "quoted" \\ "finish_reason":null', compact=compact), 0.16)  # tricky text
    sc.apply_event(r, _chunk(None, finish="length", compact=compact), 0.17)  # finish without content
    sc.apply_event(
        r, _chunk(usage={"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}, compact=compact), 0.17
    )
    assert not r.done
    sc.apply_event(r, b"[DONE]", 0.18)
    assert r.chunk_times == [0.11, 0.16]
    assert r.finish_reason == "length" and r.done and r.usage is not None and r.output_tokens == 2
    assert r.error_kind is None


@pytest.mark.unit
def test_fast_path_agrees_with_json_parsing() -> None:
    cases = [
        _chunk("tok"),
        _chunk(""),
        _chunk("", role=True),
        _chunk("end", finish="stop"),
        _chunk(None, finish="stop"),
        _chunk(usage={"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}),
        _chunk('x"usage":{'),
        b'{"error":{"message":"boom","code":500}}',
    ]
    for payload in cases:
        fast = sc.RequestRecord(index=0, stream=0, sent_at=0.0)
        sc.apply_event(fast, payload, 1.0)
        obj = json.loads(payload)
        choices = obj.get("choices") or []
        has_text = bool(choices and (choices[0].get("delta") or {}).get("content"))
        assert bool(fast.chunk_times) == has_text, payload


@pytest.mark.unit
def test_in_band_error_and_garbage_are_stream_errors() -> None:
    r = sc.RequestRecord(index=0, stream=0, sent_at=0.0)
    sc.apply_event(r, b'{"error":{"message":"worker lost","type":"server_error","code":"worker_lost"}}', 1.0)
    assert r.error_kind == "stream" and "worker lost" in (r.error or "")
    g = sc.RequestRecord(index=0, stream=0, sent_at=0.0)
    sc.apply_event(g, b"{not json", 1.0)
    assert g.error_kind == "stream"


# -- per-request and summary math -------------------------------------------------------------------
@pytest.mark.unit
def test_request_ttft_itl_tpot() -> None:
    r = _rec(0, 0.0, [0.100, 0.150, 0.210, 0.250], 4, end=0.260)
    assert r.ttft == pytest.approx(0.100)
    assert r.itls() == pytest.approx([0.050, 0.060, 0.040])
    assert r.tpot() == pytest.approx((0.260 - 0.100) / 3)
    assert r.ok
    assert _rec(1, 0.0, [0.1], 1).tpot() is None  # one token: TPOT undefined


@pytest.mark.unit
def test_summary_figures_and_error_classes() -> None:
    records = [
        _rec(0, 0.00, [0.10, 0.15, 0.20], 3, end=0.21),
        _rec(1, 0.01, [0.12, 0.22, 0.32], 3, end=0.33),
        _rec(2, 0.02, [], None, finish=None, status=503, kind="http"),
        _rec(3, 0.03, [], None, finish=None, status=None, kind="connection"),  # type: ignore[arg-type]
        _rec(4, 0.04, [], None, finish=None, status=None, kind="timeout"),  # type: ignore[arg-type]
        _rec(5, 0.05, [0.2], 1, finish=None, kind="stream"),  # broke after its usage: tokens still count
    ]
    cpu = sc.ClientUsage(cpu_user_s=0.2, cpu_sys_s=0.05, max_rss_mb=50.0)
    s = sc.summarize(records, cpu=cpu, cpu_total=cpu)
    assert s["requests"] == {"total": 6, "ok": 2, "failed": 4}
    assert s["errors"] == {"timeout": 1, "http": 1, "connection": 1, "stream": 1}
    assert s["ttft_ms"]["p50"] == pytest.approx(110.0)
    assert s["itl_ms"]["n"] == 4  # pooled gaps of the successful requests
    assert s["itl_ms"]["max"] == pytest.approx(100.0)
    assert s["tpot_ms"]["p50"] == pytest.approx(((0.21 - 0.10) / 2 + (0.33 - 0.12) / 2) / 2 * 1000)
    # window: first send (0.00) to last end (0.01 + 0.33 = 0.34; record 5 ends at 0.05 + 0.201)
    assert s["window_s"] == pytest.approx(0.34)
    assert s["output_tokens"] == 7
    assert s["output_tokens_per_s"] == pytest.approx(7 / 0.34, rel=1e-3)
    assert s["client"]["cpu_s"] == pytest.approx(0.25)
    assert s["client"]["cpu_util"] == pytest.approx(0.25 / 0.34, rel=1e-2)
    assert s["prompt_tokens"] == {"min": 12, "max": 12}


@pytest.mark.unit
def test_summary_of_nothing() -> None:
    s = sc.summarize([])
    assert s["requests"] == {"total": 0, "ok": 0, "failed": 0}
    assert s["output_tokens_per_s"] is None and s["ttft_ms"]["p50"] is None


# -- against a real simulator process --------------------------------------------------------------
@pytest.mark.integration
async def test_real_run_records_every_chunk(stack: Stack) -> None:
    sim = stack.sim("vllm", LLAMA, ttft_ms=30, itl_ms=5, output_len=16)
    cfg = sc.LoadConfig(
        url=url(sim) + "/v1/chat/completions", model=LLAMA, concurrency=5, requests_per_stream=2, max_tokens=16
    )
    res = await sc.run_load(cfg)
    s = res.summary
    assert s["requests"] == {"total": 10, "ok": 10, "failed": 0}
    assert [r.index for r in res.records] == list(range(10))
    for r in res.records:
        assert r.status == 200 and r.done and r.finish_reason in ("stop", "length")
        assert r.output_tokens == 16
        assert 1 <= len(r.chunk_times) <= 16 and r.chunk_times == sorted(r.chunk_times)
        assert r.ttft is not None and r.ttft >= 0.025
    assert s["output_tokens"] == 160
    assert s["ttft_ms"]["p50"] >= 25
    assert s["client"]["cpu_s"] > 0 and s["client"]["max_rss_mb"] > 0
    # Requests of one stream run one after the other.
    first, second = res.records[0], res.records[1]
    assert second.sent_at >= first.sent_at + (first.end_at or 0) - 1e-6


@pytest.mark.integration
async def test_more_than_100_streams_run_at_once(stack: Stack) -> None:
    """aiohttp's default pool would cap this at 100 connections and run the rest afterwards.

    A request streams (from its first token to its end) only while it holds a connection, so under a cap of
    100 no instant has more than 100 requests streaming, whatever the machine's speed. Without a cap, each
    streams for three ITLs (1.2 s), longer than the client takes to start all 150 on a loaded machine, so
    one instant has all 150 streaming. ``sent_at`` cannot tell: it is taken before the pool is asked.
    """
    sim = stack.sim("vllm", LLAMA, ttft_ms=300, itl_ms=400, output_len=4, max_num_seqs=400)
    cfg = sc.LoadConfig(url=url(sim) + "/v1/chat/completions", model=LLAMA, concurrency=150, max_tokens=4)
    res = await sc.run_load(cfg)
    s = res.summary
    assert s["requests"]["ok"] == 150
    streaming = [(r.sent_at + (r.ttft or 0.0), r.sent_at + (r.end_at or 0.0)) for r in res.records]
    assert peak_overlap(streaming) == 150


def peak_overlap(intervals: list[tuple[float, float]]) -> int:
    """The most intervals that hold one instant (ends sort before starts at a tie: a freed connection)."""
    events = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])
    peak = cur = 0
    for _, d in events:
        cur += d
        peak = max(peak, cur)
    return peak


@pytest.mark.unit
def test_peak_overlap_counts_the_most_intervals_at_one_instant() -> None:
    assert peak_overlap([]) == 0
    assert peak_overlap([(0.0, 1.0), (0.5, 2.0), (1.5, 3.0)]) == 2
    assert peak_overlap([(0.0, 1.0), (1.0, 2.0)]) == 1  # one ends as the next starts
    assert peak_overlap([(0.0, 5.0), (1.0, 2.0), (1.5, 4.0), (3.0, 6.0)]) == 3


@pytest.mark.integration
async def test_errors_are_classified(stack: Stack) -> None:
    sim = stack.sim("vllm", LLAMA, ttft_ms=1500, itl_ms=10, output_len=4)
    base = url(sim) + "/v1/chat/completions"
    http = await sc.run_load(sc.LoadConfig(url=base, model="no-such-model", max_tokens=4))
    assert http.records[0].error_kind == "http" and http.records[0].status == 404
    dead = await sc.run_load(
        sc.LoadConfig(
            url=f"http://127.0.0.1:{free_port()}/v1/chat/completions", model=LLAMA, max_tokens=4, connect_timeout_s=2
        )
    )
    assert dead.records[0].error_kind == "connection"
    slow = await sc.run_load(sc.LoadConfig(url=base, model=LLAMA, max_tokens=4, read_timeout_s=0.3))
    assert slow.records[0].error_kind == "timeout"
    assert slow.summary["errors"]["timeout"] == 1 and slow.summary["requests"]["failed"] == 1


@pytest.mark.integration
def test_cli_writes_raw_records_and_summary(stack: Stack, tmp_path: Path) -> None:
    sim = stack.sim("vllm", LLAMA, ttft_ms=20, itl_ms=5, output_len=8)
    out = tmp_path / "run.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(CLIENT),
            "--url",
            url(sim) + "/v1/chat/completions",
            "--model",
            LLAMA,
            "--api-key",
            "sk-test",
            "--concurrency",
            "3",
            "--requests-per-stream",
            "1",
            "--max-tokens",
            "8",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert data["summary"]["requests"] == {"total": 3, "ok": 3, "failed": 0}
    assert len(data["requests"]) == 3 and all(len(r["chunk_times"]) >= 1 for r in data["requests"])
    assert data["config"]["concurrency"] == 3
    assert json.loads(proc.stdout)["requests"]["ok"] == 3  # the printed summary
