"""The worker contract, run against any engine: the real vLLM on CPU (worker-vllm), the
simulator's SGLang flavour (worker-sglang) and real GPU engines (make gpu-smoke).

Each check drives a worker over NATS exactly as the gateway does and asserts what the gateway
relies on: ordered messages, usage, finish reasons, timings, cancel reaching the engine,
heartbeats with the engine's load, one event per attempt.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from llmlab_common.messages import AttemptEvent, StreamEnd, StreamStarted, TokenChunk

from llmlab_testkit.natsclient import WorkerClient
from llmlab_testkit.procs import ManagedProcess, Stack


@dataclass
class EngineUnderTest:
    engine: str  # what the worker reports: "vllm" | "sglang" | "llamacpp" | ...
    pool: str
    url: str
    model: str  # served model name
    running: Callable[[], float]  # the engine's own running-requests gauge
    worker: str = ""  # the worker package's suffix (llmlab_worker_<worker>) when not the engine's name
    env: dict[str, str] = field(default_factory=dict)  # more worker settings (a backend, a catalog)

    def start_worker(self, stack: Stack, **kw: Any) -> ManagedProcess:
        return stack.worker(self.worker or self.engine, self.pool, self.url, env=self.env or None, **kw)


async def streams_tokens_usage_and_timings(stack: Stack, e: EngineUnderTest) -> None:
    w = e.start_worker(stack, max_concurrency=4)
    async with WorkerClient(stack.namespace) as client:
        req = client.request(
            "r1",
            e.pool,
            e.model,
            messages=[{"role": "user", "content": "Name three colours."}],
            max_tokens=12,
            temperature=0.0,
        )
        await client.publish(req)
        msgs = await client.collect("r1", timeout=60)
        assert isinstance(msgs[0], StreamStarted) and msgs[0].engine == e.engine
        chunks = [m for m in msgs if isinstance(m, TokenChunk)]
        end = msgs[-1]
        assert isinstance(end, StreamEnd), msgs
        assert [m.seq for m in msgs] == list(range(len(msgs)))
        assert "".join(c.text for c in chunks).strip()
        # max_tokens=12 and a question that needs more: the engine stops on length.
        assert end.finish_reason == "length"
        assert end.usage.completion_tokens == 12
        # Each token message says how many tokens it carries, as the engine counted them (the
        # running usage of continuous_usage_stats): they add up to the engine's own total.
        assert sum(c.tokens or 0 for c in chunks) == 12, [(c.text, c.tokens) for c in chunks]
        assert end.usage.prompt_tokens > 5
        assert end.usage.total_tokens == end.usage.prompt_tokens + 12
        times = [t for c in chunks for t in c.token_times]
        assert times == sorted(times) and len(times) >= 10
        assert end.timings.ttft_s is not None and 0 < end.timings.ttft_s < 30
        assert end.timings.itl_p50_s is not None and end.timings.tpot_s is not None
        assert end.timings.nats_queue_s >= 0

        raw = await client.events(client.topo.attempt_event_subject)
        events = [AttemptEvent.model_validate_json(r) for r in raw]
        assert [(ev.request_id, ev.outcome, ev.source) for ev in events] == [("r1", "completed", "worker")]
        assert events[0].usage == end.usage
    assert w.alive()


async def stop_sequence_on_completions(stack: Stack, e: EngineUnderTest, prompt: str, stop: str) -> None:
    e.start_worker(stack)
    async with WorkerClient(stack.namespace) as client:
        req = client.request("r2", e.pool, e.model, prompt=prompt, max_tokens=40, temperature=0.0, stop=[stop])
        await client.publish(req)
        end = (await client.collect("r2"))[-1]
        assert isinstance(end, StreamEnd)
        assert end.finish_reason == "stop"
        assert end.usage.completion_tokens < 40


def _tail(proc: ManagedProcess) -> str:
    return proc.log_path.read_text(errors="replace")[-3000:]


async def cancel_stops_generation_on_the_engine(stack: Stack, e: EngineUnderTest) -> None:
    worker = e.start_worker(stack)
    async with WorkerClient(stack.namespace) as client:
        # The attempt must still be generating when the cancel lands. Greedy output differs between
        # CPU instruction sets, so the end-of-text tokens (ids 0-2 in SmolLM2's vocabulary) are
        # banned instead of trusting this prompt never to end early.
        req = client.request(
            "r3",
            e.pool,
            e.model,
            prompt="Once upon a time, in a land far away,",
            max_tokens=1500,
            temperature=0.0,
            logit_bias={"0": -100.0, "1": -100.0, "2": -100.0},
        )
        await client.publish(req)
        assert isinstance(await client.next("r3"), StreamStarted)
        for _ in range(2):
            assert isinstance(await client.next("r3"), TokenChunk)
        # The engine's gauge may trail its first tokens on a loaded host (CI of 2026-12-05 read 0
        # once, with no log to say why): wait for it, and say what the worker did if it never comes.
        seen_at = time.monotonic()
        while e.running() < 1:
            if time.monotonic() - seen_at > 20:
                raise AssertionError(f"the engine never counted the request running; worker log:\n{_tail(worker)}")
            await asyncio.sleep(0.2)
        # The worker's own word first: its attempt event. A cancel is a core NATS message (at most
        # once), so it is sent again every 5 s until the event comes. The engine's gauge alone is no
        # witness: CI of 2d34355 read it 0 while the request still generated its 1,500 tokens.
        assert client.nc is not None
        events = await client.nc.jetstream().subscribe(client.topo.attempt_event_subject, ordered_consumer=True)
        try:
            sent = 0
            while True:
                await client.cancel("r3")
                sent += 1
                try:
                    raw = (await events.next_msg(timeout=5)).data
                    break
                except TimeoutError:
                    if sent >= 6:
                        raise AssertionError(
                            f"no attempt event after {sent} cancels; worker log:\n{_tail(worker)}"
                        ) from None
        finally:
            await events.unsubscribe()
        ev = AttemptEvent.model_validate_json(raw)
        assert ev.outcome == "cancelled", f"{ev}\nworker log:\n{_tail(worker)}"
        # Then the engine: it stops generating once the worker drops the stream (the request left
        # alone runs for a minute on this CPU).
        stopped_at = time.monotonic()
        while e.running() > 0:
            if time.monotonic() - stopped_at > 20:
                raise AssertionError(f"engine still running the cancelled request; worker log:\n{_tail(worker)}")
            await asyncio.sleep(0.2)
        assert ev.usage is not None and 0 < ev.usage.completion_tokens < 1500, ev


async def heartbeat_carries_engine_load(stack: Stack, e: EngineUnderTest) -> None:
    e.start_worker(stack, heartbeat_s=0.2)
    async with WorkerClient(stack.namespace) as client:
        await asyncio.sleep(1.0)
        hbs = [h for h in client.heartbeats if h.pool == e.pool]
        assert hbs, "no heartbeat"
        hb = hbs[-1]
        assert hb.engine == e.engine and hb.ready and hb.models == [e.model]
        assert hb.load.running is not None and hb.load.waiting is not None
        assert hb.load.kv_cache_usage is not None and 0 <= hb.load.kv_cache_usage <= 1
