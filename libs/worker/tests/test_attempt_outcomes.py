"""The worker's per-attempt logic (:func:`llmlab_worker.attempt.run_attempt`, run by
``Worker._run``) with a scripted engine and fake NATS plumbing: which terminal message goes out,
what the attempt event says, that the message is acked and the slot given back, for each way an
attempt ends."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

import pytest
from llmlab_common.catalog import load_catalog
from llmlab_common.messages import (
    AttemptEvent,
    InferenceRequest,
    SamplingParams,
    StreamEnd,
    StreamError,
    StreamStarted,
    TokenChunk,
    Usage,
)
from llmlab_common.metrics import Metrics
from llmlab_common.settings import DEFAULT_CATALOG
from llmlab_testkit.e2e import samples
from llmlab_worker.engine import EngineEvent, EngineRequestError, OpenAIEngineAdapter
from llmlab_worker.lifecycle import Worker, _Running
from llmlab_worker.settings import WorkerSettings
from pydantic import TypeAdapter

pytestmark = pytest.mark.unit
Reply = TypeAdapter(StreamStarted | TokenChunk | StreamEnd | StreamError)


class ScriptedEngine(OpenAIEngineAdapter):
    """Yields ``script`` items: text, an EngineEvent, an exception to raise, or a float to sleep."""

    engine = "vllm"

    def __init__(self, script: list[Any]) -> None:
        self.script = script
        self.closed = False

    async def stream(self, req: InferenceRequest) -> AsyncGenerator[EngineEvent, None]:
        try:
            for item in self.script:
                if isinstance(item, BaseException):
                    raise item
                if isinstance(item, float):
                    await asyncio.sleep(item)
                elif isinstance(item, EngineEvent):
                    yield item
                else:
                    yield EngineEvent(at=time.monotonic(), text=item)
        finally:
            self.closed = True


@dataclass
class FakeMsg:
    num_delivered: int = 1
    acks: int = 0

    @property
    def metadata(self) -> Any:
        return type("Meta", (), {"num_delivered": self.num_delivered})()

    async def ack(self) -> None:
        self.acks += 1


@dataclass
class FakeJS:
    events: list[AttemptEvent] = field(default_factory=list)

    async def publish(self, subject: str, payload: bytes, **_: Any) -> None:
        self.events.append(AttemptEvent.model_validate_json(payload))


def _worker(script: list[Any], pool: str = "gpu-vllm") -> tuple[Worker, list[Any], FakeJS]:
    settings = WorkerSettings(pool=pool, worker_id="w1", max_concurrency=2, coalesce_ms=0)
    w = Worker(settings, ScriptedEngine(script), load_catalog(DEFAULT_CATALOG), Metrics("llmlab"))
    sent: list[Any] = []
    w._attempt_ctx = dataclasses.replace(
        w._attempt_ctx, publish=lambda _s, payload: sent.append(Reply.validate_json(payload))
    )
    js = FakeJS()
    w.js = js  # type: ignore[assignment]
    return w, sent, js


def _req(**kw: Any) -> InferenceRequest:
    now = time.time()
    fields: dict[str, Any] = {
        "request_id": "r1",
        "attempt": 1,
        "gateway_id": "g1",
        "reply_subject": "tok",
        "endpoint": "chat",
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "deployment": "llama-8b-vllm",
        "pool": "gpu-vllm",
        "messages": [{"role": "user", "content": "hi"}],
        "params": SamplingParams(max_tokens=8),
        "created_at": now,
        "dispatched_at": now,
        "start_deadline": now + 5,
        "deadline": now + 60,
    }
    return InferenceRequest(**(fields | kw))


async def _run(w: Worker, req: InferenceRequest, msg: FakeMsg | None = None) -> _Running:
    await w.capacity.take_up_to(1)  # as the pull feeder does before the handler
    run = _Running(req=req, msg=msg or FakeMsg(), received_at=time.monotonic())  # type: ignore[arg-type]
    w.running[(req.request_id, req.attempt)] = run
    run.task = asyncio.create_task(w._run(run))
    return run


async def _cancel_after(w: Worker, sent: list[Any], messages: int) -> _Running:
    """Run an attempt and cancel it once ``messages`` stream messages went out."""
    run = await _run(w, _req())
    assert run.task is not None
    while len(sent) < messages:
        await asyncio.sleep(0.01)
    run.task.cancel()
    await asyncio.gather(run.task, return_exceptions=True)
    return run


def _kinds(sent: list[Any]) -> list[str]:
    return [type(m).__name__ for m in sent]


async def test_completed_attempt_ends_with_usage_and_one_completed_event() -> None:
    """Catches: a completed attempt without StreamEnd, with lost usage, unacked, or holding its slot."""
    usage = Usage(prompt_tokens=5, completion_tokens=3, total_tokens=8)
    w, sent, js = _worker(["a", "b", "c", EngineEvent(at=time.monotonic(), finish_reason="stop", usage=usage)])
    run = await _run(w, _req())
    assert run.task is not None
    await run.task
    assert _kinds(sent) == ["StreamStarted", "TokenChunk", "TokenChunk", "TokenChunk", "StreamEnd"]
    assert [m.seq for m in sent] == [0, 1, 2, 3, 4]
    assert sent[-1].usage == usage and sent[-1].finish_reason == "stop"
    assert [(e.outcome, e.usage) for e in js.events] == [("completed", usage)]
    assert run.msg.acks == 1 and w.capacity.free == 2 and not w.running  # type: ignore[attr-defined]


async def test_cancel_mid_stream_counts_the_delivered_tokens_and_closes_the_engine_stream() -> None:
    """Catches: a cancelled attempt reported without usage (nothing to charge for what was
    delivered), a StreamEnd sent after a cancel, or an engine stream left open."""
    w, sent, js = _worker(["a", "b", 5.0, "never"])
    run = await _cancel_after(w, sent, 3)
    assert _kinds(sent) == ["StreamStarted", "TokenChunk", "TokenChunk"]
    assert [(e.outcome, e.usage.completion_tokens if e.usage else None) for e in js.events] == [("cancelled", 2)]
    assert w.adapter.closed and run.msg.acks == 1  # type: ignore[attr-defined]


async def test_chunks_that_carry_several_tokens_are_counted_as_such() -> None:
    """Catches: tokens counted as chunks. An engine chunk may carry several tokens (vLLM merges
    deltas when its consumer lags): each token message says how many it carries, and a cancelled
    attempt reports the tokens generated, not the chunks."""
    three = EngineEvent(at=time.monotonic(), text=" a b c", tokens=3)
    w, sent, js = _worker([three, EngineEvent(at=time.monotonic(), text=" d", tokens=1), 5.0, "never"])
    await _cancel_after(w, sent, 3)
    assert [m.tokens for m in sent if type(m).__name__ == "TokenChunk"] == [3, 1]
    assert [(e.outcome, e.usage.completion_tokens if e.usage else None) for e in js.events] == [("cancelled", 4)]


@pytest.mark.parametrize(
    ("script", "retryable", "before_first", "code"),
    [
        ([EngineRequestError(503, "overloaded")], True, True, "engine_error"),
        (["a", EngineRequestError(503, "died")], False, False, "engine_error"),
        ([EngineRequestError(400, "prompt too long")], False, True, "engine_rejected"),
        ([EngineRequestError(0, "connection refused")], True, True, "engine_error"),
    ],
)
async def test_engine_errors_are_retryable_only_before_the_first_token_and_if_not_the_clients(
    script: list[Any], retryable: bool, before_first: bool, code: str
) -> None:
    """Catches: a retry after tokens reached the client (duplicated text), or a retry of a request
    the engine rejected as invalid (the same error again, on another GPU)."""
    w, sent, js = _worker(script)
    run = await _run(w, _req())
    assert run.task is not None
    await run.task
    end = sent[-1]
    assert isinstance(end, StreamError)
    assert (end.retryable, end.before_first_token, end.error.code) == (retryable, before_first, code)
    assert [e.outcome for e in js.events] == ["engine_error"] and run.msg.acks == 1  # type: ignore[attr-defined]


async def _stalled(script: list[Any], **ctx: Any) -> tuple[Worker, list[Any], FakeJS, float]:
    w, sent, js = _worker(script)
    w._attempt_ctx = dataclasses.replace(w._attempt_ctx, **({"engine_lost": lambda: False} | ctx))
    t0 = time.monotonic()
    run = await _run(w, _req())
    assert run.task is not None
    await asyncio.wait_for(run.task, 5)
    return w, sent, js, time.monotonic() - t0


async def test_an_engine_silent_after_its_first_token_fails_the_attempt_so_the_gateway_resumes_it() -> None:
    """Catches: a stream left hanging until the request's deadline by an engine that stalls
    without closing its connection (a hung engine process); a stall reported as the client's
    error or as retryable (tokens were delivered: only a continuation may follow), or the
    engine stream left open."""
    w, sent, js, took = await _stalled(["a", "b", 30.0, "never"], stall_timeout_s=0.3)
    end = sent[-1]
    assert _kinds(sent) == ["StreamStarted", "TokenChunk", "TokenChunk", "StreamError"]
    assert end.error.status == 502 and "stalled" in end.error.message and not end.retryable
    assert [(e.outcome, e.usage.completion_tokens if e.usage else None) for e in js.events] == [("engine_error", 2)]
    assert 0.3 <= took < 2.0 and w.adapter.closed  # type: ignore[attr-defined]


async def test_a_slow_engine_that_keeps_sending_is_not_a_stall() -> None:
    """Catches: the stall bound applied to the whole attempt instead of the silence between tokens."""
    usage = Usage(prompt_tokens=1, completion_tokens=5, total_tokens=6)
    done = EngineEvent(at=time.monotonic(), finish_reason="stop", usage=usage)
    script: list[Any] = [x for t in "abcde" for x in (0.15, t)] + [done]
    _, sent, js, took = await _stalled(script, stall_timeout_s=0.3)
    assert isinstance(sent[-1], StreamEnd) and [e.outcome for e in js.events] == ["completed"] and took > 0.6


async def test_once_the_engine_is_given_up_a_silent_attempt_fails_before_its_first_token_too() -> None:
    """Catches: attempts queued inside a hung engine waiting for the gateway's first-token bound
    (minutes) although the worker's health checks already gave that engine up."""
    _, sent, js, took = await _stalled(
        [30.0, "never"], stall_timeout_s=60.0, engine_lost=lambda: True, lost_stall_s=0.2
    )
    end = sent[-1]
    assert isinstance(end, StreamError) and end.before_first_token and end.retryable
    assert [e.outcome for e in js.events] == ["engine_error"] and took < 2.0


@pytest.mark.parametrize(
    ("why", "outcome"),
    [("cancelled", "cancelled"), ("expired", "expired")],
)
async def test_attempts_dropped_before_start_never_reach_the_engine(why: str, outcome: str) -> None:
    """Catches: an attempt cancelled (or past its start deadline) before it was pulled that still
    runs on the engine, or one dropped without an ack (it would be redelivered)."""
    w, sent, js = _worker(["a"])
    req = _req(start_deadline=time.time() - 1) if why == "expired" else _req()
    if why == "cancelled":
        w.cancelled[(req.request_id, None)] = time.monotonic() + 60
    run = await _run(w, req)
    assert run.task is not None
    await run.task
    assert sent == [] and not w.adapter.closed  # type: ignore[attr-defined]
    assert [(e.outcome, e.usage) for e in js.events] == [(outcome, None)]
    assert run.msg.acks == 1 and w.capacity.free == 2  # type: ignore[attr-defined]


async def test_admission_figures_and_engine_queue_reach_the_attempt_event() -> None:
    """Catches: the gateway's admission figures dropped on the way to the accounting row, the
    engine's own per-request queue time overwritten by the window estimate, or the estimate
    presented as if the engine had reported it."""
    usage = Usage(prompt_tokens=5, completion_tokens=2, total_tokens=7)
    now = time.time()
    req = _req(created_at=now - 0.3, dispatched_at=now - 0.1, auth_s=0.12, route_s=0.05)

    w, _, js = _worker(["a", EngineEvent(at=time.monotonic(), engine_queue_s=0.04), "b", usage_event(usage)])
    w._load = w._load.model_copy(update={"mean_queue_time_s": 0.9})
    run = await _run(w, req)
    assert run.task is not None
    await run.task
    t = js.events[0].timings
    assert t is not None
    assert (t.auth_s, t.route_s) == (0.12, 0.05)
    assert t.dispatch_offset_s == pytest.approx(0.2, abs=1e-6)
    assert (t.engine_queue_s, t.engine_queue_method) == (0.04, "engine")

    w, _, js = _worker(["a", "b", usage_event(usage)])
    w._load = w._load.model_copy(update={"mean_queue_time_s": 0.9})
    run = await _run(w, req)
    assert run.task is not None
    await run.task
    t = js.events[0].timings
    assert t is not None and (t.engine_queue_s, t.engine_queue_method) == (0.9, "window_mean")

    w, _, js = _worker(["a", "b", usage_event(usage)])  # no window figure either: unknown, not 0
    run = await _run(w, req)
    assert run.task is not None
    await run.task
    t = js.events[0].timings
    assert t is not None and (t.engine_queue_s, t.engine_queue_method, t.prefill_s) == (None, None, None)


def usage_event(usage: Usage) -> EngineEvent:
    return EngineEvent(at=time.monotonic(), finish_reason="stop", usage=usage)


async def test_an_attempt_is_counted_under_its_pool_with_one_itl_per_gap() -> None:
    """Catches: the ITL of an attempt reduced to one figure, or a family without the pool label."""
    usage = Usage(prompt_tokens=4, completion_tokens=3, total_tokens=7)
    script: list[Any] = ["a", 0.01, "b", 0.01, "c", usage_event(usage)]
    w, _, _ = _worker(script, pool="gpu-sglang")
    run = await _run(w, _req(model="Qwen/Qwen3-32B", deployment="qwen-32b-sglang", pool="gpu-sglang"))
    assert run.task is not None
    await run.task
    s = samples(w.metrics)
    assert s['llmlab_worker_attempts_total{outcome="completed",pool="gpu-sglang"}'] == 1
    assert s['llmlab_worker_itl_seconds_count{pool="gpu-sglang"}'] == 2
    assert s['llmlab_worker_completion_tokens_total{pool="gpu-sglang"}'] == 3
    assert s['llmlab_worker_tpot_seconds_count{pool="gpu-sglang"}'] == 1
    assert s['llmlab_worker_intake_seconds_count{pool="gpu-sglang"}'] == 1  # handler -> attempt running
    # The fake message has no JetStream timestamp: that leg is not guessed.
    assert s['llmlab_worker_jetstream_wait_seconds_count{pool="gpu-sglang"}'] == 0
    assert [k for k in s if k.startswith("llmlab_worker_") and 'pool="gpu-sglang"' not in k] == []


@dataclass
class OrderedMsg(FakeMsg):
    log: list[str] = field(default_factory=list)

    async def ack(self) -> None:
        self.log.append("ack")
        await super().ack()


@dataclass
class FlakyJS(FakeJS):
    """Fails the first ``failures`` publishes (JetStream unreachable or full), then confirms."""

    failures: int = 0
    log: list[str] = field(default_factory=list)

    async def publish(self, subject: str, payload: bytes, **kw: Any) -> None:
        if self.failures:
            self.failures -= 1
            self.log.append("publish failed")
            raise TimeoutError("no JetStream ack")
        self.log.append("publish")
        await super().publish(subject, payload, **kw)


async def test_the_attempt_event_is_confirmed_before_the_request_is_acked() -> None:
    """Catches: the worker acking the request before its attempt event was stored (dd4f538): a
    crash in between lost the charge, since the acked request is never redelivered. A publish
    that fails is retried (the message id makes it land once) before the ack."""
    usage = Usage(prompt_tokens=5, completion_tokens=1, total_tokens=6)
    w, _sent, _ = _worker(["a", EngineEvent(at=time.monotonic(), finish_reason="stop", usage=usage)])
    log: list[str] = []
    js = FlakyJS(failures=2, log=log)
    w.js = js  # type: ignore[assignment]
    run = await _run(w, _req(), OrderedMsg(log=log))
    assert run.task is not None
    await run.task
    assert log == ["publish failed", "publish failed", "publish", "ack"]
    assert [e.outcome for e in js.events] == ["completed"]
    assert (
        samples(w.metrics, "llmlab_worker_event_publish_failures").get(
            'llmlab_worker_event_publish_failures_total{pool="gpu-vllm"}'
        )
        == 0
    )


async def test_an_event_that_never_lands_is_counted_and_the_request_still_acked() -> None:
    """A JetStream that stays away past event_publish_retry_s: the loss is counted (an alert can
    see it) and the request acked, not redelivered to run again."""
    w, _sent, _ = _worker(["a", EngineEvent(at=time.monotonic(), finish_reason="stop")])
    w.settings = w.settings.model_copy(update={"event_publish_retry_s": 0.3})
    log: list[str] = []
    w.js = FlakyJS(failures=10**6, log=log)  # type: ignore[assignment]
    run = await _run(w, _req(), OrderedMsg(log=log))
    assert run.task is not None
    await run.task
    assert log[-1] == "ack" and log.count("publish failed") >= 2
    assert (
        samples(w.metrics, "llmlab_worker_event_publish_failures").get(
            'llmlab_worker_event_publish_failures_total{pool="gpu-vllm"}'
        )
        == 1
    )


@dataclass
class TermMsg(FakeMsg):
    data: bytes = b""
    terms: int = 0

    async def term(self) -> None:
        self.terms += 1


@dataclass
class DeadLetterJS:
    published: list[tuple[str, bytes]] = field(default_factory=list)

    async def publish(self, subject: str, payload: bytes, **_: Any) -> None:
        self.published.append((subject, payload))


@pytest.mark.parametrize(
    "reply_subject",
    ["llmlab.budget.reserve", "llmlab.evt.attempt", "llmlab.tok.g1.another-request", "llmlab.tok.g2.r1", ""],
)
async def test_a_request_naming_another_reply_subject_is_dead_lettered_not_run(reply_subject: str) -> None:
    """Catches: a worker publishing its stream wherever the request says (dd4f538): a forged
    request could make it answer budget.reserve, forge events or write into another stream."""
    w, sent, _ = _worker(["a", EngineEvent(at=time.monotonic(), finish_reason="stop")])
    js = DeadLetterJS()
    w.js = js  # type: ignore[assignment]
    msg = TermMsg(data=_req(reply_subject=reply_subject).model_dump_json().encode())
    await w.capacity.take_up_to(1)
    w.engine_ready = True
    await w._on_request(msg, held_slot=True)  # type: ignore[arg-type]
    assert sent == [] and not w.running and msg.terms == 1
    assert [s for s, _ in js.published] == [w.topo.dead_letter_subject]
    assert w.capacity.free == 2


async def test_the_request_s_own_token_subject_is_accepted() -> None:
    w, _sent, js = _worker(["a", EngineEvent(at=time.monotonic(), finish_reason="stop")])
    req = _req(reply_subject=w.topo.token_subject("g1", "r1"))
    msg = TermMsg(data=req.model_dump_json().encode())
    await w.capacity.take_up_to(1)
    w.engine_ready = True
    await w._on_request(msg, held_slot=True)  # type: ignore[arg-type]
    run = w.running.get(("r1", 1))
    assert run is not None and run.task is not None
    await run.task
    assert msg.terms == 0 and [e.outcome for e in js.events] == ["completed"]


async def _probe_times_out() -> bool:
    return False  # as OpenAIEngineAdapter.healthy answers when /health is late


async def test_a_health_probe_failing_while_the_engine_streams_does_not_give_the_engine_up() -> None:
    """Catches: an engine busy serving streams (its /health answered late on a loaded host) taken
    for lost after three failed probes, which would stop the worker pulling and end its streams as
    stalled after one quiet second: a healthy stream failed over for nothing. Once the engine has
    sent nothing for a check period, failed probes count again and it is given up."""
    script: list[Any] = [x for t in "abcdefghij" for x in (0.05, t)]
    w, sent, _ = _worker(script)
    w.settings = w.settings.model_copy(update={"heartbeat_interval_s": 0.2})
    w.adapter.healthy = _probe_times_out  # type: ignore[method-assign]
    w.engine_ready = True
    run = await _run(w, _req())
    assert run.task is not None
    await asyncio.sleep(0.12)  # the first tokens are out
    checks = 0
    while not run.task.done():
        await w._check_engine()
        checks += 1
        assert w.engine_ready, f"engine given up while streaming, after {checks} probes"
        await asyncio.sleep(0.05)
    assert checks >= w.settings.engine_fail_threshold
    assert sum(isinstance(m, TokenChunk) for m in sent) >= 1 and isinstance(sent[-1], StreamEnd)
    await asyncio.sleep(0.25)  # silent for longer than a check period
    for _ in range(w.settings.engine_fail_threshold):
        await w._check_engine()
    assert not w.engine_ready
