"""Domain logic of the gateway with an in-memory dispatcher (pure unit tests; the same paths
run against real NATS and workers in tests/e2e)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

import httpx
import pytest
from llmlab_common.errors import (
    EngineError,
    InvalidRequest,
    ModelNotFound,
    RateLimited,
    ServiceUnavailable,
    UpstreamTimeout,
)
from llmlab_common.messages import (
    AttemptEvent,
    ErrorInfo,
    InferenceRequest,
    Principal,
    RequestEvent,
    RouteQuery,
    RouteReply,
    RouteTarget,
    StreamEnd,
    StreamError,
    StreamStarted,
    Timings,
    TokenChunk,
    Usage,
)
from llmlab_common.settings import DEFAULT_CATALOG
from llmlab_gateway.routing import EmbeddedRouter
from llmlab_gateway.schemas import ChatCompletionRequest
from llmlab_gateway.service import AttemptMessage, CallContext, CompletionService, WorkerLost
from llmlab_gateway.settings import GatewaySettings
from llmlab_routing.config import load_router_catalog
from llmlab_routing.core import RouterCore
from llmlab_routing.state import LiveState
from llmlab_testkit.routing import heartbeat

pytestmark = pytest.mark.unit
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


@dataclass
class _Handle:
    attempt: int
    script: list[AttemptMessage | None]
    taken: bool = False  # a worker's message came (as the dispatcher's handle: any stream message)

    def _pop(self) -> AttemptMessage | None:
        m = self.script.pop(0)
        self.taken = self.taken or isinstance(m, StreamStarted | TokenChunk | StreamEnd)
        return m

    def next_nowait(self) -> AttemptMessage | None:
        if self.script and self.script[0] is not None:
            return self._pop()
        return None

    async def next(self, timeout: float) -> AttemptMessage | None:
        if not self.script:
            await asyncio.sleep(min(timeout, 0.01))
            return None
        return self._pop()


@dataclass
class FakeDispatcher:
    workers: int = 1
    scripts: list[list[AttemptMessage | None]] = field(default_factory=list)
    dispatched: list[InferenceRequest] = field(default_factory=list)
    targets: list[RouteTarget] = field(default_factory=list)
    cancels: list[tuple[str, int | None, str]] = field(default_factory=list)
    attempt_events: list[AttemptEvent] = field(default_factory=list)
    request_events: list[RequestEvent] = field(default_factory=list)

    waits: dict[tuple[str, int], float] = field(default_factory=dict)
    asked: list[tuple[str, int]] = field(default_factory=list)
    ready_ids: list[str] | None = None  # the live ready workers by id, where a test names them

    def live_workers(self, pool: str, excluding: str | None = None) -> int:
        if self.ready_ids is None:
            return self.workers
        return sum(1 for w in self.ready_ids if w != excluding)

    def predicted_wait(self, pool: str, priority: int = 0) -> float | None:
        self.asked.append((pool, priority))
        return self.waits.get((pool, priority))

    async def wait_discovery(self) -> None:
        return None

    async def dispatch(self, req: InferenceRequest, target: RouteTarget) -> _Handle:
        self.dispatched.append(req)
        self.targets.append(target)
        return _Handle(req.attempt, self.scripts.pop(0))

    def cancel(self, request_id: str, attempt: int | None, reason: str) -> None:
        self.cancels.append((request_id, attempt, reason))

    def release(self, request_id: str) -> None: ...

    def record_attempt(self, event: AttemptEvent) -> None:
        self.attempt_events.append(event)

    def record_request(self, event: RequestEvent) -> None:
        self.request_events.append(event)


def _started(a: int, w: str = "w1") -> StreamStarted:
    return StreamStarted(request_id="r", attempt=a, seq=0, worker_id=w, engine="vllm", nats_queue_s=0.0)


def _tok(a: int, seq: int, text: str) -> TokenChunk:
    return TokenChunk(request_id="r", attempt=a, seq=seq, text=text, token_times=[0.1])


def _end(a: int, seq: int) -> StreamEnd:
    return StreamEnd(
        request_id="r",
        attempt=a,
        seq=seq,
        finish_reason="length",
        usage=Usage(completion_tokens=2),
        timings=Timings(nats_queue_s=0, e2e_s=0.1),
    )


def _service(d: FakeDispatcher, **kw: object) -> CompletionService:
    settings = GatewaySettings(**{"queue_timeout_s": 0.05, "first_token_timeout_s": 0.05, **kw})  # type: ignore[arg-type]
    rc = load_router_catalog(DEFAULT_CATALOG)
    live = LiveState()
    for pool in ("gpu-vllm", "gpu-sglang", "cpu-vllm"):
        for i in range(d.workers):
            live.on_heartbeat(heartbeat(f"{pool}-{i}", pool, interval=60))
    return CompletionService(settings, rc, EmbeddedRouter(RouterCore(rc, live)), d)


def _ctx(model: str = MODEL, **body: object) -> CallContext:
    req = ChatCompletionRequest.model_validate(
        {"model": model, "messages": [{"role": "user", "content": "hi"}], **body}
    )
    return CallContext("r", "chat", req, Principal(plan="free"), time.time())


async def _drain(opened: object) -> list[str]:
    return [m.text async for m in opened if isinstance(m, TokenChunk)]  # type: ignore[attr-defined]


async def test_happy_path_uses_plan_default_max_tokens_and_relays_in_order() -> None:
    d = FakeDispatcher(scripts=[[_started(1), _tok(1, 1, "a"), _tok(1, 2, "b"), _end(1, 3)]])
    opened = await _service(d).open(_ctx())
    assert await _drain(opened) == ["a", "b"]
    assert opened.end is not None and opened.end.finish_reason == "length"
    req = d.dispatched[0]
    assert req.params.max_tokens == 256  # plan "free" default
    assert req.start_deadline - req.dispatched_at == pytest.approx(0.05)
    assert req.model == MODEL and req.pool == "gpu-vllm"
    assert req.priority == 0  # plan "free"


async def test_queue_timeout_is_429_with_retry_after_and_cancels_the_attempt() -> None:
    d = FakeDispatcher(scripts=[[None]])
    with pytest.raises(RateLimited) as exc:
        await _service(d).open(_ctx())
    assert "Retry-After" in exc.value.headers
    assert d.cancels == [("r", 1, "queue_timeout")]
    assert [e.outcome for e in d.attempt_events] == ["abandoned"]
    # Marked as a queue timeout: the router's health rule does not count it against the deployment.
    assert d.attempt_events[0].error is not None and d.attempt_events[0].error.code == "queue_timeout"


async def test_no_worker_is_503() -> None:
    with pytest.raises(ServiceUnavailable):
        await _service(FakeDispatcher(workers=0)).open(_ctx())


async def test_unknown_model_is_404() -> None:
    with pytest.raises(ModelNotFound):
        await _service(FakeDispatcher()).open(_ctx(model="gpt-9"))


async def test_worker_lost_before_first_token_retries_as_next_attempt() -> None:
    d = FakeDispatcher(
        workers=2, scripts=[[_started(1), WorkerLost(1, "w1")], [_started(2, "w2"), _tok(2, 1, "x"), _end(2, 2)]]
    )
    opened = await _service(d).open(_ctx())
    assert await _drain(opened) == ["x"]
    assert [r.attempt for r in d.dispatched] == [1, 2]
    assert opened.attempts == 2
    assert ("r", 1, "retry") in d.cancels
    assert [e.outcome for e in d.attempt_events] == ["worker_lost"]


async def test_fallback_chain_is_bounded_and_never_repeats_a_target() -> None:
    # An explicit model with one deployment of 3 workers: the chain is the chosen worker plus
    # replica_retries (1) other worker, then a clear 503.
    lost = [[_started(a), WorkerLost(a, "w")] for a in (1, 2, 3)]
    d = FakeDispatcher(workers=3, scripts=lost)
    with pytest.raises(ServiceUnavailable, match="All 2 routes failed") as exc:
        await _service(d, max_attempts=5).open(_ctx())
    assert exc.value.code == "all_routes_failed"
    assert len(d.dispatched) == 2
    pairs = [(t.deployment, t.worker_id) for t in d.targets]
    assert len(set(pairs)) == 2 and all(w is not None for _, w in pairs)
    # What the client reads names no internal worker (the log has them).
    assert not any(w and w in exc.value.message for _, w in pairs), exc.value.message
    assert [r.route.position for r in d.dispatched if r.route] == [1, 2]
    assert d.dispatched[1].route and d.dispatched[1].route.fallback_from == "llama-8b-vllm"


async def test_single_worker_retries_through_its_pool_then_another_deployment() -> None:
    # "auto" with one worker per deployment: chosen worker, then its pool (a worker started since
    # the decision can take it), then the next deployment.
    lost = [[_started(1), WorkerLost(1, "w")], [_started(2, "w2"), _tok(2, 1, "x"), _end(2, 2)]]
    d = FakeDispatcher(scripts=[list(x) for x in lost])
    opened = await _service(d).open(_ctx(model="auto"))
    assert await _drain(opened) == ["x"]
    first, second = d.targets
    assert second.deployment == first.deployment and first.worker_id and second.worker_id is None

    # The pool's worker is gone and none replaces it: after a short wait, the next deployment.
    ok = [_started(3, "w3"), _tok(3, 1, "y"), _end(3, 2)]
    d = FakeDispatcher(scripts=[[_started(1), WorkerLost(1, "w")], [None], ok])
    opened = await _service(d).open(_ctx(model="auto"))
    assert await _drain(opened) == ["y"]
    assert len({t.deployment for t in d.targets}) == 2 and opened.attempts == 3
    assert [e.outcome for e in d.attempt_events] == ["worker_lost", "abandoned"]
    assert d.dispatched[2].route and d.dispatched[2].route.fallback_from == d.targets[0].deployment


async def test_an_attempt_its_worker_left_before_taking_moves_to_the_pool() -> None:
    """Catches: a scale-down that fails requests (issue 18's demo: 503 "All 2 routes failed ...
    worker lost"): attempts addressed to workers that drained without taking them go to the same
    deployment's pool, not down a chain of other draining workers."""
    untaken = [WorkerLost(a, "w") for a in (1, 2)]
    ok = [_started(3, "w9"), _tok(3, 1, "x"), _end(3, 2)]
    d = FakeDispatcher(workers=3, scripts=[[untaken[0]], [untaken[1]], list(ok)])
    try:
        opened = await _service(d).open(_ctx())
    except ServiceUnavailable as exc:
        pytest.fail(f"the untaken attempts were not moved: {exc.message}")
    assert await _drain(opened) == ["x"]
    first, second, third = d.targets
    assert first.worker_id and second.worker_id is None and second.pool == first.pool
    assert third.worker_id and third.worker_id != first.worker_id  # the chain goes on after the pool
    assert d.dispatched[1].route and d.dispatched[1].route.reason.startswith("moved to pool")
    # No live worker left in the pool (both killed, say): nothing to move to; the chain goes on and
    # its message counts its own routes.
    d = FakeDispatcher(workers=3, scripts=[[WorkerLost(1, "w")], [WorkerLost(2, "w")]])
    service = _service(d)
    d.workers = 0  # the router's view is older than the dispatcher's
    with pytest.raises(ServiceUnavailable, match="All 2 routes failed"):
        await service.open(_ctx())
    assert all(t.worker_id for t in d.targets)
    # Taken and then lost is a failure of that route, as before: the next target, not the pool.
    d = FakeDispatcher(workers=3, scripts=[[_started(1), WorkerLost(1, "w")], list(ok)])
    opened = await _service(d).open(_ctx())
    assert await _drain(opened) == ["x"]
    assert all(t.worker_id for t in d.targets)


async def test_route_carries_a_prompt_hash_equal_for_equal_prompts() -> None:
    d = FakeDispatcher(scripts=[[_started(1), _end(1, 1)] for _ in range(3)])
    svc = _service(d)
    for text in ("same question", "same question", "another one"):
        req = ChatCompletionRequest.model_validate({"model": MODEL, "messages": [{"role": "user", "content": text}]})
        await svc.open(CallContext("r", "chat", req, Principal(plan="free"), time.time()))
    hashes = [r.route.prompt_hash for r in d.dispatched if r.route]
    assert len(hashes) == 3 and hashes[0] == hashes[1] != hashes[2] and len(hashes[0] or "") == 32


async def test_max_attempts_caps_the_chain() -> None:
    lost = [[_started(a), WorkerLost(a, "w")] for a in (1, 2, 3)]
    d = FakeDispatcher(workers=3, scripts=lost)
    with pytest.raises(ServiceUnavailable, match="All 1 routes failed"):
        await _service(d, max_attempts=1).open(_ctx())
    assert len(d.dispatched) == 1


async def test_engine_rejection_is_not_retried() -> None:
    err = StreamError(
        request_id="r",
        attempt=1,
        seq=1,
        before_first_token=True,
        retryable=False,
        error=ErrorInfo(status=400, type="invalid_request_error", code="engine_rejected", message="prompt too long"),
    )
    d = FakeDispatcher(scripts=[[_started(1), err]])
    with pytest.raises(InvalidRequest):
        await _service(d).open(_ctx())
    assert len(d.dispatched) == 1


def _end_with(a: int, seq: int, prompt: int, completion: int) -> StreamEnd:
    usage = Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)
    return StreamEnd(
        request_id="r", attempt=a, seq=seq, finish_reason="stop", usage=usage, timings=Timings(nats_queue_s=0, e2e_s=1)
    )


def _engine_failed(a: int, seq: int, status: int = 503) -> StreamError:
    info = ErrorInfo(status=status, type="server_error", code="engine_error", message="engine went away")
    return StreamError(request_id="r", attempt=a, seq=seq, before_first_token=False, retryable=False, error=info)


async def test_worker_lost_mid_stream_is_continued_by_the_next_attempt() -> None:
    first = [_started(1), _tok(1, 1, "One"), _tok(1, 2, " two"), WorkerLost(1, "w1")]
    # The continuation's engine counted the delivered text (2 tokens) in its prompt of 12 + 2.
    second = [_started(2, "w2"), _tok(2, 1, " three"), _end_with(2, 2, prompt=14, completion=1)]
    d = FakeDispatcher(workers=2, scripts=[first, second])
    opened = await _service(d).open(_ctx())
    assert await _drain(opened) == ["One", " two", " three"]
    cont = d.dispatched[1]
    assert cont.attempt == 2 and cont.resume is not None
    assert (cont.resume.from_attempt, cont.resume.text, cont.resume.tokens) == (1, "One two", 2)
    assert cont.params.max_tokens == 256 - 2  # the plan's 256, less what was delivered
    # One priority above the request's: ahead of what is addressed to the pool's workers at its own.
    assert (d.dispatched[0].priority, cont.priority) == (0, 1)
    assert cont.messages == d.dispatched[0].messages  # the worker appends the delivered text
    # Any worker of the same deployment's pool, not the one that died.
    assert d.targets[1].deployment == d.targets[0].deployment and d.targets[1].worker_id is None
    assert ("r", 1, "retry") in d.cancels
    # The client's usage counts its three tokens once and the original prompt once.
    assert opened.end is not None
    assert (opened.end.usage.prompt_tokens, opened.end.usage.completion_tokens) == (12, 3)
    assert opened.resumes == 1 and opened.attempts == 2 and opened.delivered_tokens == 3
    # Attempt 1 is recorded as lost, with the two tokens it delivered carried to attempt 2's bill.
    (lost,) = d.attempt_events
    assert (lost.attempt, lost.outcome, lost.carried_tokens) == (1, "worker_lost", 2)
    assert lost.usage is not None and lost.usage.completion_tokens == 2


async def test_an_engine_failure_or_silence_mid_stream_is_resumed_up_to_max_resumes() -> None:
    def scripts() -> list[list[AttemptMessage | None]]:
        return [
            [_started(1), _tok(1, 1, "a"), _engine_failed(1, 2)],
            [_started(2), _tok(2, 1, " b"), None],  # then silent past the idle timeout
            [_started(3), _tok(3, 1, " c"), _end_with(3, 2, prompt=20, completion=1)],
        ]

    d = FakeDispatcher(workers=2, scripts=scripts())
    opened = await _service(d, stream_idle_timeout_s=0.05).open(_ctx())
    assert await _drain(opened) == ["a", " b", " c"]
    assert [r.resume.text if r.resume else None for r in d.dispatched] == [None, "a", "a b"]
    assert [e.outcome for e in d.attempt_events] == ["engine_error", "abandoned"]
    assert [e.carried_tokens for e in d.attempt_events] == [1, 1]
    assert opened.end is not None and opened.end.usage.completion_tokens == 3

    # max_resumes=1: the second interruption ends the stream with the in-band error.
    d = FakeDispatcher(workers=2, scripts=scripts())
    opened = await _service(d, max_resumes=1, stream_idle_timeout_s=0.05).open(_ctx())
    with pytest.raises(UpstreamTimeout):
        await _drain(opened)
    assert len(d.dispatched) == 2


async def test_what_cannot_be_continued_ends_with_the_in_band_error() -> None:
    lost = [_started(1), _tok(1, 1, "a"), WorkerLost(1, "w1")]
    # Resuming is off.
    d = FakeDispatcher(workers=2, scripts=[list(lost), []])
    opened = await _service(d, max_resumes=0).open(_ctx())
    with pytest.raises(EngineError, match="lost mid-generation"):
        await _drain(opened)
    assert len(d.dispatched) == 1
    # A tool call was streamed: an engine cannot continue half a call.
    call = TokenChunk(request_id="r", attempt=1, seq=1, tool_calls=[{"index": 0, "id": "c"}], token_times=[0.1])
    d = FakeDispatcher(workers=2, scripts=[[_started(1), call, WorkerLost(1, "w1")], []])
    with pytest.raises(EngineError):
        await _drain(await _service(d).open(_ctx()))
    assert len(d.dispatched) == 1
    # The engine refused mid-stream (a 4xx is the request's, not the engine's failure).
    d = FakeDispatcher(workers=2, scripts=[[_started(1), _tok(1, 1, "a"), _engine_failed(1, 2, status=400)], []])
    with pytest.raises(InvalidRequest):
        await _drain(await _service(d).open(_ctx()))
    assert len(d.dispatched) == 1


async def test_an_answer_cut_after_its_last_allowed_token_ends_at_length_and_is_billed() -> None:
    """Catches: a stream whose engine died or stalled between its last allowed token and its final
    message ending in an in-band error (the client had everything it asked for), and billed nothing
    (the worker's event is a failure; seen by the chaos suite as free tokens)."""
    from llmlab_common import rules

    lost = [_started(1), _tok(1, 1, "a"), WorkerLost(1, "w1")]
    d = FakeDispatcher(workers=2, scripts=[list(lost), []])
    opened = await _service(d).open(_ctx(max_tokens=1))
    try:
        texts = await _drain(opened)
    except EngineError as exc:
        pytest.fail(f"a complete answer ended with an error: {exc}")
    assert texts == ["a"]
    assert len(d.dispatched) == 1 and ("r", 1, "retry") in d.cancels  # nothing left to generate
    assert opened.end is not None and opened.end.finish_reason == "length"
    # The gateway's prompt estimate (docs/budgets.md): "hi" is 2 bytes -> 1 token, + 4 for the
    # message + 3 for the conversation.
    assert (opened.end.usage.prompt_tokens, opened.end.usage.completion_tokens) == (8, 1)
    (ev,) = d.attempt_events
    assert (ev.attempt, ev.outcome, ev.source, ev.error, ev.finish_reason) == (
        1,
        "completed",
        "gateway",
        None,
        "length",
    )
    assert rules.charge_for(ev) == rules.Charge(8, 1)  # the prompt (estimated) and the one token


async def test_a_continuation_nobody_takes_gives_way_to_the_chain_then_the_error() -> None:
    # The model has one deployment: when its pool does not take the continuation in time (queue
    # timeout), no other target serves the same model and the stream ends with the error.
    d = FakeDispatcher(workers=2, scripts=[[_started(1), _tok(1, 1, "a"), WorkerLost(1, "w1")], [None]])
    opened = await _service(d).open(_ctx())
    with pytest.raises(EngineError, match="lost mid-generation"):
        await _drain(opened)
    assert len(d.dispatched) == 2 and d.dispatched[1].resume is not None
    assert [e.outcome for e in d.attempt_events] == ["worker_lost", "abandoned"]


@pytest.mark.parametrize(("ready", "short"), [(["w1"], True), (["w1", "w2"], False)])
async def test_a_continuation_waits_briefly_where_only_the_failed_worker_is_ready(
    ready: list[str], short: bool
) -> None:
    """Catches: a stream whose engine died waiting out the whole queue bound for its own pool, where the
    only worker still heartbeating ready is the one whose stream broke (make local-demo: 10 s, until the
    engine came back), instead of a short wait and the next target."""
    failed = [_started(1, "w1"), _tok(1, 1, "a"), _engine_failed(1, 2)]
    d = FakeDispatcher(workers=2, scripts=[failed, [None]], ready_ids=ready)
    opened = await _service(d, queue_timeout_s=5.0, empty_pool_wait_s=0.05).open(_ctx())
    with pytest.raises(ServiceUnavailable):  # nobody took the continuation: the engine's error ends the stream
        await _drain(opened)
    cont = d.dispatched[1]
    assert cont.resume is not None and d.targets[1].worker_id is None  # the same deployment's pool first
    waited = cont.start_deadline - cont.dispatched_at
    assert (waited <= 0.06) if short else (waited >= 4.9), waited


async def test_a_predicted_wait_over_the_bound_is_429_at_once_and_nothing_is_published() -> None:
    d = FakeDispatcher(waits={("gpu-vllm", 0): 7.5})
    with pytest.raises(RateLimited) as exc:
        await _service(d, queue_timeout_s=2.0).open(_ctx())
    assert exc.value.code == "queue_wait_predicted" and exc.value.headers["Retry-After"] == "8"
    assert "7.5s" in exc.value.message and d.dispatched == []  # refused before any wait
    # Within the bound, or unknown: the request goes and waits as before.
    for waits in ({("gpu-vllm", 0): 1.5}, {}):
        d = FakeDispatcher(waits=waits, scripts=[[_started(1), _tok(1, 1, "a"), _end(1, 2)]])
        await _drain(await _service(d, queue_timeout_s=2.0).open(_ctx()))
        assert len(d.dispatched) == 1
    # Admission off: no prediction is consulted.
    d = FakeDispatcher(waits={("gpu-vllm", 0): 7.5}, scripts=[[_started(1), _end(1, 1)]])
    await _service(d, queue_timeout_s=2.0, admission=False).open(_ctx())
    assert len(d.dispatched) == 1


async def test_the_wait_is_predicted_for_the_plans_priority() -> None:
    # The free plan's queue is long; the enterprise plan (priority 2) goes before it.
    d = FakeDispatcher(waits={("gpu-vllm", 0): 9.0}, scripts=[[_started(1), _end(1, 1)]])
    svc = _service(d, queue_timeout_s=2.0)
    with pytest.raises(RateLimited):
        await svc.open(_ctx())
    body = ChatCompletionRequest.model_validate({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    await svc.open(CallContext("r", "chat", body, Principal(plan="enterprise"), time.time()))
    assert d.asked == [("gpu-vllm", 0), ("gpu-vllm", 2)]
    assert d.dispatched[0].priority == 2


async def test_admission_skips_targets_over_the_bound_and_keeps_the_chains_order() -> None:
    # "auto" chains two deployments in different pools: the first pool is predicted too slow.
    d = FakeDispatcher(scripts=[[_started(1), _tok(1, 1, "x"), _end(1, 2)]])
    svc = _service(d, queue_timeout_s=2.0)
    chain = (await svc._route(_ctx(model="auto"))).targets
    assert len({t.pool for t in chain}) >= 2
    d.waits = {(chain[0].pool, 0): 30.0}
    await _drain(await svc.open(_ctx(model="auto")))
    assert [t.pool for t in d.targets] == [next(t.pool for t in chain if t.pool != chain[0].pool)]


async def test_tools_and_response_format_pass_through_where_supported() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    body = {
        "tools": tools,
        "tool_choice": "auto",
        "response_format": {"type": "json_object"},
        "seed": 7,
        "stop": "END",
        "user": "u1",
    }
    d = FakeDispatcher(scripts=[[_started(1), _end(1, 1)], [_started(1), _end(1, 1)]])
    svc = _service(d)  # tools: a soft filter, relaxed when no deployment of the model supports them
    await svc.open(_ctx(**body))
    p = d.dispatched[0].params
    assert p.tools == tools and p.tool_choice == "auto" and p.response_format == {"type": "json_object"}
    assert (p.seed, p.stop, p.user) == (7, ["END"], "u1")
    await svc.open(_ctx(model="SmolLM2-135M-Instruct", **body))  # catalog: supports_tools false
    assert d.dispatched[1].params.tools is None and d.dispatched[1].params.tool_choice is None


class _Recording:
    """The embedded router, recording each query as it arrives."""

    def __init__(self, inner: EmbeddedRouter) -> None:
        self.inner = inner
        self.queries: list[RouteQuery] = []
        self.asked = asyncio.Event()

    async def route(self, query: RouteQuery) -> RouteReply:
        self.queries.append(query)
        self.asked.set()
        return await self.inner.route(query)


def _recording(svc: CompletionService) -> _Recording:
    rec = _Recording(svc.router)  # type: ignore[arg-type]
    svc.router = rec
    return rec


async def test_a_decision_routed_ahead_is_used_when_the_admission_confirms_its_inputs() -> None:
    """Catches: a route-ahead decision thrown away and made again (two decisions per request,
    the overlap's saving lost), or used without the prompt hash its context got."""
    d = FakeDispatcher(scripts=[[_started(1), _end(1, 1)]])
    svc = _service(d)
    rec = _recording(svc)
    ahead = svc.route_ahead(_ctx())  # the key's last admission: plan "free", no clamp
    await rec.asked.wait()
    ctx = _ctx()
    ctx.max_tokens = 256  # the budget's allowance: the plan's default, as predicted
    await svc.open(ctx, ahead)
    assert ahead.used is True and len(rec.queries) == 1
    assert d.dispatched[0].params.max_tokens == 256
    assert d.dispatched[0].route is not None
    assert ctx.prompt_hash is not None and d.dispatched[0].route.prompt_hash == ctx.prompt_hash


@pytest.mark.parametrize(("plan", "allowance"), [("free", 8), ("enterprise", 256)])
async def test_a_stale_prediction_is_routed_again_on_the_admissions_inputs(plan: str, allowance: int) -> None:
    """Catches: a route-ahead decision used although the admission clamped max_tokens or the key
    moved to another plan (the router then sized and placed the request on the wrong inputs)."""
    d = FakeDispatcher(scripts=[[_started(1), _end(1, 1)]])
    svc = _service(d)
    rec = _recording(svc)
    ahead = svc.route_ahead(_ctx())
    await rec.asked.wait()  # the decision is made while the budget's answer is on its way
    body = ChatCompletionRequest.model_validate({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    ctx = CallContext("r", "chat", body, Principal(plan=plan), time.time(), allowance)
    await svc.open(ctx, ahead)
    assert ahead.used is False
    assert [(q.plan, q.max_output_tokens) for q in rec.queries] == [("free", 256), (plan, allowance)]
    assert d.dispatched[0].params.max_tokens == allowance


async def test_a_key_admitted_moments_ago_is_routed_while_its_reserve_is_on_the_way() -> None:
    """Catches: routing after the reserve for a key just admitted (the two round trips add up
    again); routing ahead for a key not admitted before, or refused since (unknown keys would
    each cost the router a decision), or in a burst; a refused request's decision dispatched."""
    from llmlab_common.metrics import Metrics
    from llmlab_gateway.auth import Admission
    from llmlab_gateway.deps import Gateway
    from llmlab_gateway.metrics import GatewayMetrics
    from llmlab_gateway.relay import handle_completion
    from llmlab_gateway.sse import RawSendApp
    from llmlab_routing.config import CatalogHolder

    d = FakeDispatcher(scripts=[[_started(1), _tok(1, 1, "a"), _end(1, 2)] for _ in range(4)])
    svc = _service(d, queue_timeout_s=5.0, first_token_timeout_s=5.0, route_ahead_max_admitting=16)
    rec = _recording(svc)
    overlapped: list[bool] = []
    refusing = [False]

    class Admitter:
        async def authenticate(self, api_key: str) -> Principal:
            return Principal(key_id="k", plan="free")

        async def admit(self, api_key: str, req: object) -> Admission:
            # The budget's answer comes when the router was asked meanwhile, or after 0.3 s.
            rec.asked.clear()  # a decision routed ahead has not run yet: its task starts after this
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(rec.asked.wait(), 0.3)
            overlapped.append(rec.asked.is_set())
            if refusing[0]:
                raise RateLimited("Budget exceeded.", retry_after_s=60, code="budget_exceeded")
            return Admission(Principal(key_id="k", plan="free"), max_tokens=256)

    gm = GatewayMetrics(Metrics("t"))
    gw = Gateway(svc.settings, CatalogHolder(DEFAULT_CATALOG), Admitter(), svc, gm)  # type: ignore[arg-type]
    app = RawSendApp()

    async def chat(request: object) -> object:
        return await handle_completion(request, gw, "chat")  # type: ignore[arg-type]

    app.fast_routes = {"/v1/chat/completions": chat}  # type: ignore[dict-item]
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    statuses = []
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        for refusing[0] in (False, False, True, False, False):
            if len(statuses) == 4:  # a burst: as many admissions awaited as the bound allows
                gw.admitted_keys.admitting = svc.settings.route_ahead_max_admitting
            r = await c.post("/v1/chat/completions", json=body, headers={"Authorization": "Bearer sk-a"})
            statuses.append(r.status_code)
    assert statuses == [200, 200, 429, 200, 200]
    # First sight of the key: sequential. Admitted: routed ahead (also when then refused, which
    # forgets the key): sequential again; in a burst too.
    assert overlapped == [False, True, True, False, False]
    assert gw.admitted_keys.admitting == svc.settings.route_ahead_max_admitting  # each admission counted out
    assert len(rec.queries) == 5 and len(d.dispatched) == 4  # one decision each, the refused one unused
    counts = {o: gm.route_ahead.labels(o)._value.get() for o in ("used", "rerouted", "refused")}
    assert counts == {"used": 1, "rerouted": 0, "refused": 1}
