"""Domain logic of the gateway with an in-memory dispatcher (pure unit tests; the same paths
run against real NATS and workers in tests/e2e)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import pytest
from llmlab_common.errors import EngineError, InvalidRequest, ModelNotFound, RateLimited, ServiceUnavailable
from llmlab_common.messages import (
    AttemptEvent,
    ErrorInfo,
    Heartbeat,
    InferenceRequest,
    Principal,
    RequestEvent,
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

pytestmark = pytest.mark.unit
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


@dataclass
class _Handle:
    attempt: int
    script: list[AttemptMessage | None]

    def next_nowait(self) -> AttemptMessage | None:
        if self.script and self.script[0] is not None:
            return self.script.pop(0)
        return None

    async def next(self, timeout: float) -> AttemptMessage | None:
        if not self.script:
            await asyncio.sleep(min(timeout, 0.01))
            return None
        return self.script.pop(0)


@dataclass
class FakeDispatcher:
    workers: int = 1
    scripts: list[list[AttemptMessage | None]] = field(default_factory=list)
    dispatched: list[InferenceRequest] = field(default_factory=list)
    targets: list[RouteTarget] = field(default_factory=list)
    cancels: list[tuple[str, int | None, str]] = field(default_factory=list)
    attempt_events: list[AttemptEvent] = field(default_factory=list)
    request_events: list[RequestEvent] = field(default_factory=list)

    def live_workers(self, pool: str) -> int:
        return self.workers

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
    settings = GatewaySettings(queue_timeout_s=0.05, first_token_timeout_s=0.05, **kw)  # type: ignore[arg-type]
    rc = load_router_catalog(DEFAULT_CATALOG)
    live = LiveState()
    for pool in ("gpu-vllm", "gpu-sglang", "cpu-vllm"):
        for i in range(d.workers):
            live.on_heartbeat(
                Heartbeat(
                    worker_id=f"{pool}-{i}",
                    pool=pool,
                    engine="vllm",
                    models=[],
                    max_concurrency=8,
                    in_flight=0,
                    ready=True,
                    interval_s=60,
                    sent_at=time.time(),
                )
            )
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


async def test_worker_lost_mid_stream_ends_with_error() -> None:
    d = FakeDispatcher(scripts=[[_started(1), _tok(1, 1, "a"), WorkerLost(1, "w1")]])
    opened = await _service(d).open(_ctx())
    with pytest.raises(EngineError, match="lost mid-generation"):
        await _drain(opened)


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
