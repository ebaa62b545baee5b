"""worker-vllm with REAL vLLM inside its own process (engine_mode=inproc) on this CPU: the worker
contract, the same answers as vLLM's OpenAI server, what only the in-process mode can tell (the
engine's per-request queue time) and what it refuses. One worker (one engine start) serves the module."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import pytest
from llmlab_common.messages import AttemptEvent, Resume, StreamEnd, StreamError, StreamStarted, TokenChunk
from llmlab_testkit.e2e import client
from llmlab_testkit.natsclient import WorkerClient
from llmlab_testkit.procs import ManagedProcess, Stack, unique_namespace, url
from llmlab_testkit.vllm import SERVED_NAME, inproc_worker, vllm_gauge

pytestmark = [pytest.mark.integration, pytest.mark.vllm_cpu]

POOL = "cpu-vllm"


@pytest.fixture(scope="module")
def ns_stack() -> Iterator[Stack]:
    s = Stack(namespace=unique_namespace())
    try:
        yield s
    finally:
        crashed = [p for p in s.procs if p.crashed()]
        s.close()
        assert not crashed, "\n".join(f"{p.name} crashed:\n{p.tail()}" for p in crashed)


@pytest.fixture(scope="module")
def worker(ns_stack: Stack) -> ManagedProcess:
    return inproc_worker(ns_stack, POOL)


def running(w: ManagedProcess) -> float:
    # vLLM's own gauge, on the worker's /metrics: nothing else serves it in this mode.
    return vllm_gauge(url(w), "vllm:num_requests_running")


def generated(w: ManagedProcess) -> float:
    """vLLM's count of tokens it has generated, all requests together."""
    return vllm_gauge(url(w), "vllm:generation_tokens_total")


async def _events_of(c: WorkerClient, request_id: str) -> list[AttemptEvent]:
    for _ in range(20):
        raw = await c.events(c.topo.attempt_event_subject, timeout=0.5)
        found = [e for e in (AttemptEvent.model_validate_json(r) for r in raw) if e.request_id == request_id]
        if found:
            return found
    return []


async def test_streams_tokens_usage_and_the_engines_own_timings(ns_stack: Stack, worker: ManagedProcess) -> None:
    async with WorkerClient(ns_stack.namespace) as c:
        req = c.request(
            "ip-1",
            POOL,
            SERVED_NAME,
            messages=[{"role": "user", "content": "Name three colours."}],
            max_tokens=12,
            temperature=0.0,
        )
        await c.publish(req)
        msgs = await c.collect("ip-1", timeout=120)
        assert isinstance(msgs[0], StreamStarted) and msgs[0].engine == "vllm"
        assert [m.seq for m in msgs] == list(range(len(msgs)))
        chunks = [m for m in msgs if isinstance(m, TokenChunk)]
        end = msgs[-1]
        assert isinstance(end, StreamEnd), msgs
        assert "".join(ch.text for ch in chunks).strip()
        assert end.finish_reason == "length"
        assert end.usage.completion_tokens == 12 and end.usage.prompt_tokens > 5
        assert end.usage.total_tokens == end.usage.prompt_tokens + 12
        # Each token message carries its count of token ids: they add up to the engine's total.
        assert sum(ch.tokens or 0 for ch in chunks) == 12, [(ch.text, ch.tokens) for ch in chunks]
        times = [t for ch in chunks for t in ch.token_times]
        assert times == sorted(times) and len(times) >= 10
        t = end.timings
        assert t.ttft_s is not None and 0 < t.ttft_s < 60
        # Only the in-process engine tells a request's own queue time, so prefill = TTFT - queue.
        assert t.engine_queue_s is not None and 0 <= t.engine_queue_s < t.ttft_s
        assert t.prefill_s is not None and t.prefill_s == pytest.approx(t.ttft_s - t.engine_queue_s)
        events = await _events_of(c, "ip-1")
        assert [(e.outcome, e.source) for e in events] == [("completed", "worker")]
        assert events[0].usage == end.usage


async def test_same_answers_as_the_vllm_server(ns_stack: Stack, worker: ManagedProcess, vllm_url: str) -> None:
    """Catches: a chat template, tokenization or sampling default that differs from what vLLM's
    OpenAI server does (greedy decoding on the same weights must give the same tokens)."""
    messages = [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "Which colour is the sky on a clear day?"},
    ]
    async with httpx.AsyncClient(timeout=120) as h:
        chat = (
            await h.post(
                vllm_url + "/v1/chat/completions",
                json={"model": SERVED_NAME, "messages": messages, "max_tokens": 10, "temperature": 0},
            )
        ).json()
        comp = (
            await h.post(
                vllm_url + "/v1/completions",
                json={"model": SERVED_NAME, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0},
            )
        ).json()
        # Mid-stream failover's continuation: the server's continue_final_message.
        partial = [*messages, {"role": "assistant", "content": "On a clear day, the"}]
        cont_options = {"continue_final_message": True, "add_generation_prompt": False}
        cont = (
            await h.post(
                vllm_url + "/v1/chat/completions",
                json={"model": SERVED_NAME, "messages": partial, "max_tokens": 6, "temperature": 0, **cont_options},
            )
        ).json()
    async with WorkerClient(ns_stack.namespace) as c:
        await c.publish(c.request("ip-2", POOL, SERVED_NAME, messages=messages, max_tokens=10, temperature=0.0))
        await c.publish(
            c.request("ip-3", POOL, SERVED_NAME, prompt="The capital of France is", max_tokens=8, temperature=0.0)
        )
        # (ids are unique in this module: JetStream deduplicates a repeated request id and attempt)
        resumed = c.request("ip-2c", POOL, SERVED_NAME, messages=messages, max_tokens=6, temperature=0.0)
        resumed.resume = Resume(from_attempt=1, text="On a clear day, the", tokens=6)
        await c.publish(resumed)
        got: dict[str, tuple[str, StreamEnd]] = {}
        for rid in ("ip-2", "ip-3", "ip-2c"):
            msgs = await c.collect(rid, timeout=120)
            end = msgs[-1]
            assert isinstance(end, StreamEnd), msgs
            got[rid] = ("".join(m.text for m in msgs if isinstance(m, TokenChunk)), end)
    text, end = got["ip-2"]
    assert text == chat["choices"][0]["message"]["content"]
    assert end.usage.prompt_tokens == chat["usage"]["prompt_tokens"]
    assert end.usage.completion_tokens == chat["usage"]["completion_tokens"]
    text, end = got["ip-3"]
    assert text == comp["choices"][0]["text"]
    assert end.usage.prompt_tokens == comp["usage"]["prompt_tokens"]
    text, end = got["ip-2c"]
    assert text == cont["choices"][0]["message"]["content"]
    assert end.usage.prompt_tokens == cont["usage"]["prompt_tokens"]


async def test_stop_sequence_on_completions(ns_stack: Stack, worker: ManagedProcess) -> None:
    async with WorkerClient(ns_stack.namespace) as c:
        req = c.request("ip-4", POOL, SERVED_NAME, prompt="1, 2, 3, 4,", max_tokens=40, temperature=0.0, stop=[","])
        await c.publish(req)
        end = (await c.collect("ip-4", timeout=120))[-1]
        assert isinstance(end, StreamEnd) and end.finish_reason == "stop"
        assert end.usage.completion_tokens < 40


async def test_cancel_aborts_the_request_inside_the_engine(ns_stack: Stack, worker: ManagedProcess) -> None:
    async with WorkerClient(ns_stack.namespace) as c:
        # End-of-text tokens (ids 0-2 in SmolLM2's vocabulary) banned: still generating when the cancel lands.
        req = c.request(
            "ip-5",
            POOL,
            SERVED_NAME,
            prompt="Once upon a time, in a land far away,",
            max_tokens=1500,
            temperature=0.0,
            logit_bias={"0": -100.0, "1": -100.0, "2": -100.0},
        )
        await c.publish(req)
        assert isinstance(await c.next("ip-5", 120), StreamStarted)
        for _ in range(2):
            assert isinstance(await c.next("ip-5", 60), TokenChunk)
        assert running(worker) >= 1
        await c.cancel("ip-5")
        # The engine stops generating: its token counter stands still for two seconds (the remaining ~1,500
        # tokens would take a minute or more here). Its running gauge, updated a step later, is only reported.
        cancelled_at = time.monotonic()
        while True:
            before = generated(worker)
            await asyncio.sleep(2.0)
            if generated(worker) == before:
                break
            assert time.monotonic() < cancelled_at + 30, (
                f"the engine still generates for the cancelled request (running gauge {running(worker)}); "
                f"the worker's log:\n{worker.tail(30)}"
            )
        events = await _events_of(c, "ip-5")
        assert events and events[0].outcome == "cancelled", events
        assert events[0].usage is not None and 0 < events[0].usage.completion_tokens < 1500


async def test_refuses_what_needs_the_servers_parsers(ns_stack: Stack, worker: ManagedProcess) -> None:
    """Tools and structured outputs are 400 (the client's request, not a worker failure); an
    unknown model is 404, as the server answers."""
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
    async with WorkerClient(ns_stack.namespace) as c:
        cases = {
            "ip-6": (
                c.request("ip-6", POOL, SERVED_NAME, messages=[{"role": "user", "content": "hi"}], tools=[tool]),
                400,
            ),
            "ip-7": (
                c.request(
                    "ip-7",
                    POOL,
                    SERVED_NAME,
                    messages=[{"role": "user", "content": "hi"}],
                    response_format={"type": "json_object"},
                ),
                400,
            ),
            "ip-8": (c.request("ip-8", POOL, "no-such-model", prompt="hi"), 404),
        }
        for req, _ in cases.values():
            await c.publish(req)
        for rid, (_, status) in cases.items():
            msgs = await c.collect(rid, timeout=60)
            err = msgs[-1]
            assert isinstance(err, StreamError), msgs
            assert err.error.status == status and err.error.code == "engine_rejected" and not err.retryable


async def test_heartbeat_carries_the_engines_load(ns_stack: Stack, worker: ManagedProcess) -> None:
    async with WorkerClient(ns_stack.namespace) as c:
        await asyncio.sleep(1.0)
        hbs = [h for h in c.heartbeats if h.pool == POOL]
        assert hbs, "no heartbeat"
        hb = hbs[-1]
        assert hb.engine == "vllm" and hb.ready and hb.models == [SERVED_NAME]
        assert hb.load.running is not None and hb.load.waiting is not None
        assert hb.load.kv_cache_usage is not None and 0 <= hb.load.kv_cache_usage <= 1


async def test_openai_sdk_through_the_gateway(ns_stack: Stack, worker: ManagedProcess) -> None:
    gw = ns_stack.gateway()
    stream = await client(gw).chat.completions.create(
        model="cheap",
        messages=[{"role": "user", "content": "Count: 1, 2, 3"}],
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    parts, usage = [], None
    async for ch in stream:
        if ch.usage:
            usage = ch.usage
        elif ch.choices:
            parts.append(ch.choices[0].delta.content or "")
    assert "".join(parts) and usage is not None and usage.completion_tokens == 8
