from __future__ import annotations

import asyncio
import json
import time

import pytest
from llmlab_common.messages import InferenceRequest, Resume, SamplingParams, TokenChunk
from llmlab_common.stats import quantile
from llmlab_worker.attempt import Coalescer
from llmlab_worker.engine import EngineEvent, OpenAIEngineAdapter
from llmlab_worker.outbox import Outbox
from llmlab_worker.stats import AttemptClock
from llmlab_worker_sglang.adapter import SglangAdapter
from llmlab_worker_vllm.adapter import VllmAdapter

pytestmark = pytest.mark.unit


def test_quantile_matches_linear_interpolation() -> None:
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert quantile([5.0], 0.99) == 5.0


def test_timings_follow_the_vllm_benchmark_convention() -> None:
    clock = AttemptClock(
        nats_queue_s=0.002,
        taken_at=100.0,
        engine_start=100.0,
        token_times=[100.2, 100.25, 100.30, 100.40],
        engine_queue_s=0.05,
    )
    t = clock.timings(completion_tokens=4, ended_at=100.5)
    assert t.ttft_s == pytest.approx(0.2)
    assert t.prefill_s == pytest.approx(0.15)
    assert t.decode_s == pytest.approx(0.2)
    assert t.tpot_s == pytest.approx(0.2 / 3)  # (e2e - ttft) / (tokens - 1)
    assert t.itl_p50_s == pytest.approx(0.05)
    assert t.e2e_s == pytest.approx(0.5)


def test_parse_chunk_reads_text_finish_and_usage() -> None:
    ev = OpenAIEngineAdapter.parse_chunk(
        {"choices": [{"delta": {"content": "Hi"}, "finish_reason": None}]}, 1.0, chat=True
    )
    assert ev is not None and ev.text == "Hi"
    assert (
        OpenAIEngineAdapter.parse_chunk({"choices": [{"delta": {"role": "assistant", "content": ""}}]}, 1.0, chat=True)
        is None
    )
    ev = OpenAIEngineAdapter.parse_chunk(
        {
            "choices": [],
            "usage": {
                "prompt_tokens": 3,
                "completion_tokens": 2,
                "total_tokens": 5,
                "prompt_tokens_details": {"cached_tokens": 1},
            },
        },
        1.0,
        chat=False,
    )
    assert ev is not None and ev.usage is not None and ev.usage.cached_tokens == 1
    # continuous_usage_stats: a content chunk's running usage is not the attempt's usage; the
    # chunk that closes the stream is (its finish_reason, or the usage chunk above).
    running = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
    ev = OpenAIEngineAdapter.parse_chunk({"choices": [{"delta": {"content": "Hi"}}], "usage": running}, 1.0, chat=True)
    assert ev is not None and ev.text == "Hi" and ev.usage is None
    last = {"choices": [{"delta": {"content": "!"}, "finish_reason": "stop"}], "usage": running}
    ev = OpenAIEngineAdapter.parse_chunk(last, 1.0, chat=True)
    assert ev is not None and ev.usage is not None and ev.usage.completion_tokens == 1


def test_engine_load_from_each_engines_metric_names() -> None:
    v = VllmAdapter("http://x", 4)
    base = {
        "vllm:num_requests_running": 3,
        "vllm:num_requests_waiting": 1,
        "vllm:kv_cache_usage_perc": 0.5,
        "vllm:prefix_cache_hits_total": 10,
        "vllm:prefix_cache_queries_total": 20,
        "vllm:request_queue_time_seconds_sum": 1.0,
        "vllm:request_queue_time_seconds_count": 4,
    }
    first = v.load_from_metrics(base)
    assert (first.running, first.waiting, first.kv_cache_usage) == (3, 1, 0.5)
    assert first.prefix_cache_hit_rate is None  # rates need two readings
    later = v.load_from_metrics(
        {
            **base,
            "vllm:prefix_cache_hits_total": 25,
            "vllm:prefix_cache_queries_total": 40,
            "vllm:request_queue_time_seconds_sum": 2.0,
            "vllm:request_queue_time_seconds_count": 6,
        }
    )
    assert later.prefix_cache_hit_rate == pytest.approx(15 / 20)
    assert later.mean_queue_time_s == pytest.approx(0.5)
    s = SglangAdapter("http://x", 4).load_from_metrics(
        {
            "sglang:num_running_reqs": 2,
            "sglang:num_queue_reqs": 0,
            "sglang:token_usage": 0.1,
            "sglang:cache_hit_rate": 0.4,
        }
    )
    assert (s.running, s.kv_cache_usage, s.prefix_cache_hit_rate) == (2, 0.1, 0.4)


class _FakeWorker:
    def __init__(self) -> None:
        self.sent: list[TokenChunk] = []

    def publish_nowait(self, subject: str, payload: bytes) -> None:
        self.sent.append(TokenChunk.model_validate_json(payload))


def _req() -> InferenceRequest:
    now = time.time()
    return InferenceRequest(
        request_id="r",
        attempt=1,
        gateway_id="g",
        reply_subject="x",
        endpoint="chat",
        model="m",
        deployment="d",
        pool="p",
        messages=[],
        params=SamplingParams(max_tokens=4),
        created_at=now,
        dispatched_at=now,
        start_deadline=now + 5,
        deadline=now + 60,
    )


def test_a_resumed_attempt_asks_the_engine_to_continue_the_delivered_text() -> None:
    hi = [{"role": "user", "content": "hi"}]
    req = _req().model_copy(update={"messages": hi, "resume": Resume(from_attempt=1, text="Hello the", tokens=2)})
    vllm = VllmAdapter("http://e", 1).build_body(req)
    # The delivered text as a final assistant message, continued rather than answered (vLLM's
    # chat-template options; SGLang has only continue_final_message and adds no generation prompt).
    assert vllm["messages"] == [*hi, {"role": "assistant", "content": "Hello the"}]
    assert vllm["continue_final_message"] is True and vllm["add_generation_prompt"] is False
    sglang = SglangAdapter("http://e", 1).build_body(req)
    assert sglang["messages"] == vllm["messages"] and sglang["continue_final_message"] is True
    assert "add_generation_prompt" not in sglang
    assert req.messages == hi  # the request itself is left as the gateway sent it
    # Completions: the prompt, then what the client received.
    comp = req.model_copy(update={"endpoint": "completions", "messages": None, "prompt": "Once upon"})
    assert VllmAdapter("http://e", 1).build_body(comp)["prompt"] == "Once uponHello the"
    # Not resumed: the conversation as it is, no template options.
    plain = VllmAdapter("http://e", 1).build_body(_req().model_copy(update={"messages": hi}))
    assert plain["messages"] == hi and "continue_final_message" not in plain


async def test_coalescer_sends_sparse_tokens_at_once_and_bursts_together() -> None:
    w = _FakeWorker()
    c = Coalescer(_req(), w.publish_nowait, window=0.05)
    c.engine_start = time.monotonic()
    c.add("a", None, time.monotonic())
    assert [m.text for m in w.sent] == ["a"]  # first token never waits
    c.add("b", None, time.monotonic())
    c.add("c", None, time.monotonic())
    assert len(w.sent) == 1  # burst inside the window waits
    await asyncio.sleep(0.08)
    assert [m.text for m in w.sent] == ["a", "bc"]
    assert len(w.sent[1].token_times) == 2  # per-token arrival times survive coalescing
    assert [m.seq for m in w.sent] == [1, 2]


async def test_priority_takers_go_before_the_pool_feeder() -> None:
    from llmlab_worker.pull import Capacity

    cap = Capacity(2)
    assert await cap.take_up_to(5) == 2  # the pool feeder reserves everything
    assert not cap.try_take()
    targeted = asyncio.create_task(cap.take_up_to(1, level=1))
    pool = asyncio.create_task(cap.take_up_to(5))
    await asyncio.sleep(0)
    await cap.release(1)
    await asyncio.sleep(0.01)
    assert targeted.done() and targeted.result() == 1
    assert not pool.done()  # the pool waits for the next slot
    await cap.release(1)
    assert await asyncio.wait_for(pool, 1) == 1


async def test_a_freed_slot_goes_to_the_highest_level_waiting() -> None:
    """Catches: plan priority that does not decide who gets a saturated worker's next slot."""
    from llmlab_worker.pull import Capacity

    cap = Capacity(1)
    assert cap.try_take()
    order: list[str] = []

    async def take(name: str, level: int | None) -> None:
        await cap.take_up_to(1, level=level)
        order.append(name)

    tasks = [
        asyncio.create_task(take(name, level))
        for name, level in [("pool", None), ("free", 0), ("enterprise", 4), ("pro", 2), ("pro-addressed", 3)]
    ]
    await asyncio.sleep(0.01)
    assert not cap.try_take(level=4) and cap.priority_waiting == 4
    for _ in tasks:
        await cap.release(1)
        await asyncio.sleep(0.01)
    assert order == ["enterprise", "pro-addressed", "pro", "free", "pool"]
    # A lower waiter does not take a slot while a higher one waits for it.
    await cap.release(1)  # the pool feeder's
    assert cap.try_take()
    high = asyncio.create_task(cap.take_up_to(1, level=2))
    await asyncio.sleep(0.01)
    assert not cap.try_take(level=1) and cap.try_take(level=3) is False
    await cap.release(1)
    assert await asyncio.wait_for(high, 1) == 1


async def test_prefetched_messages_keep_their_place_before_lower_levels() -> None:
    """Catches: a lower waiter (or the pool feeder) taking every slot that frees while a prefetched
    higher-priority message has not asked for one yet."""
    from llmlab_worker.pull import Capacity

    cap = Capacity(2)
    assert cap.try_take() and cap.try_take()
    held = [2]  # two priority-1 messages prefetched, not yet at the handler
    cap.watch_held(2, lambda: held[0])
    assert cap.waiting_by_level() == {2: 2}
    low = asyncio.create_task(cap.take_up_to(1, level=0))
    pool = asyncio.create_task(cap.take_up_to(5))
    await cap.release(2)
    await asyncio.sleep(0.01)
    assert not low.done() and not pool.done()  # both freed slots stay for the held ones
    assert cap.try_take(level=2) and cap.try_take(level=2)
    held[0] = 0
    await cap.release(1)
    assert await asyncio.wait_for(low, 1) == 1
    await cap.release(1)
    assert await asyncio.wait_for(pool, 1) == 1


async def test_a_status_message_a_feeder_held_does_not_leave_the_pool_feeder_waiting() -> None:
    """Catches: the pool feeder of an idle worker waiting forever. A slot freed while a prefetching
    feeder held a message (here a pull's 408) stays for it; once that message is handled and takes
    no slot, the pool feeder must look again (CI of 2026-12-06: a queued request waited 30 s)."""
    from types import SimpleNamespace

    from llmlab_worker.pull import Capacity, PullFeeder

    cap = Capacity(1)
    assert cap.try_take()

    async def handler(msg: object, held_slot: bool) -> None:
        raise AssertionError("a status message never reaches the handler")

    nc = SimpleNamespace(new_inbox=lambda: "_INBOX.t")
    feeder = PullFeeder(nc, "S", "C", cap, handler, max_batch=1, expires_s=2.0, reserve_slots=False)  # type: ignore[arg-type]
    sub = SimpleNamespace(pending_msgs=1)  # the 408 is queued for the feeder's callback
    feeder._sub = sub  # type: ignore[assignment]
    cap.watch_held(4, feeder.held)
    pool = asyncio.create_task(cap.take_up_to(5))
    await cap.release(1)
    await asyncio.sleep(0.01)
    assert not pool.done()  # the freed slot waits for what the priority feeder holds
    sub.pending_msgs = 0
    await feeder._on_msg(SimpleNamespace(headers={"Status": "408"}, data=b""))  # type: ignore[arg-type]
    await asyncio.wait({pool}, timeout=1)
    assert pool.done(), "the pool feeder still waits with a free slot and nothing held"
    assert pool.result() == 1


class _RecordingNats:
    def __init__(self) -> None:
        self.published: list[tuple[float, str]] = []

    async def publish(self, subject: str, payload: bytes) -> None:
        self.published.append((time.monotonic(), subject))


async def test_outbox_sends_at_once_after_a_quiet_spell_and_batches_under_load() -> None:
    """Catches: an outbox that delays a lone message (latency at low rates), or one that drains
    on every put under load (one socket write per message)."""
    nc = _RecordingNats()
    box = Outbox(window_s=0.05)
    runner = asyncio.create_task(box.run(nc))  # type: ignore[arg-type]
    try:
        t0 = time.monotonic()
        box.put("a", b"1")
        await asyncio.sleep(0.01)
        assert [s for _, s in nc.published] == ["a"] and nc.published[0][0] - t0 < 0.02
        for name in ("b", "c", "d"):  # inside the window: they wait for it and leave together
            box.put(name, b"x")
            await asyncio.sleep(0.005)
        assert len(nc.published) == 1
        await box.flushed(1.0)
        later = [t for t, _ in nc.published[1:]]
        assert [s for _, s in nc.published] == ["a", "b", "c", "d"]  # order kept
        assert min(later) - nc.published[0][0] >= 0.045 and max(later) - min(later) < 0.005
    finally:
        runner.cancel()


def _sse_body(texts: list[str], done: bool) -> bytes:
    """An OpenAI chat stream: a role chunk, one chunk per text with the running usage, the finish."""
    lines = [{"choices": [{"delta": {"role": "assistant", "content": ""}}]}]
    for i, t in enumerate(texts, 1):
        lines.append({"choices": [{"delta": {"content": t}}], "usage": {"completion_tokens": 2 * i}})
    lines.append({"choices": [{"delta": {}, "finish_reason": "stop"}], "usage": {"completion_tokens": 2 * len(texts)}})
    body = b"".join(b"data: " + json.dumps(o).encode() + b"\n\n" for o in lines)
    return body + (b"data: [DONE]\n\n" if done else b"")


@pytest.mark.parametrize("piece", [1, 7, 64, 1 << 16])
@pytest.mark.parametrize("ending", ["done", "done-without-newline", "no-done"])
@pytest.mark.parametrize("mode", ["iterator", "push"])
async def test_the_engine_stream_is_read_whatever_the_network_pieces(piece: int, ending: str, mode: str) -> None:
    """The adapter splits the body into lines itself: an event cut anywhere (inside 'data:', its
    JSON, between the two newlines) arrives whole, once, in order, with its tokens counted from
    the running usage; a last line without its newline still counts; [DONE] ends the stream.
    The same through stream() and through relay(), which pushes each event from the reads."""
    from aiohttp import web

    texts = ["Hel", "lo, ", "wörld", ' "quoted"']
    body = _sse_body(texts, ending != "no-done")
    if ending != "done":  # the body's last line ([DONE], or else the finishing chunk) without its newline
        body = body.rstrip(b"\n")

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(0, len(body), piece):
            await resp.write(body[i : i + piece])
            await asyncio.sleep(0)
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    adapter = OpenAIEngineAdapter(f"http://127.0.0.1:{port}", 4)
    await adapter.start()
    events: list[EngineEvent] = []
    try:
        if mode == "push":
            relay = adapter.push_relay()
            assert relay is not None
            await relay(_req(), events.append)
        else:
            events = [ev async for ev in adapter.stream(_req())]
    finally:
        await adapter.close()
        await runner.cleanup()
    assert [ev.text for ev in events if ev.text] == texts
    assert [ev.tokens for ev in events if ev.text] == [2, 2, 2, 2]
    assert events[-1].finish_reason == "stop" and events[-1].usage is not None
    assert events[-1].usage.completion_tokens == 8
