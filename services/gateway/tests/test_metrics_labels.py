"""The gateway's request metrics (docs/observability.md): the label fallbacks (model, plan, code),
TPOT and token counters, through the completion routes with an in-memory dispatcher."""

from __future__ import annotations

import asyncio
import functools
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from llmlab_common import rules
from llmlab_common.catalog import load_catalog
from llmlab_common.codes import Code
from llmlab_common.errors import EngineError, InvalidRequest, LLMLabError
from llmlab_common.http import unexpected_error
from llmlab_common.messages import (
    AttemptEvent,
    InferenceRequest,
    Principal,
    RequestEvent,
    RouteTarget,
    StreamEnd,
    StreamStarted,
    Timings,
    TokenChunk,
    Usage,
)
from llmlab_common.metrics import Metrics, check_exposition
from llmlab_common.settings import DEFAULT_CATALOG
from llmlab_gateway.auth import StaticKeyAuthenticator
from llmlab_gateway.deps import Gateway
from llmlab_gateway.metrics import GatewayMetrics, code_label, model_label, plan_label
from llmlab_gateway.relay import _Done, _unary
from llmlab_gateway.routes import fast_routes
from llmlab_gateway.routing import EmbeddedRouter
from llmlab_gateway.schemas import ChatCompletionRequest
from llmlab_gateway.service import CallContext, CompletionService
from llmlab_gateway.settings import GatewaySettings
from llmlab_gateway.sse import RawSendApp
from llmlab_routing.config import CatalogHolder
from llmlab_routing.core import RouterCore
from llmlab_routing.state import LiveState
from llmlab_testkit.e2e import samples
from llmlab_testkit.routing import heartbeat

pytestmark = pytest.mark.unit
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
KEY = "sk-metrics-test"


def test_label_fallbacks_keep_every_value_in_the_catalog_or_the_code_enum() -> None:
    """Catches: a client-chosen model name, an unknown plan or a peer's unknown code becoming a
    label value (unbounded series), or an unauthenticated request counted under some plan."""
    catalog = load_catalog(DEFAULT_CATALOG)
    assert model_label(catalog, MODEL) == MODEL
    assert model_label(catalog, "llama-8b-vllm") == MODEL  # a deployment id stands for its model
    assert model_label(catalog, "made-up/model-123") == "other"
    assert model_label(catalog, None) == "other"
    assert plan_label(catalog, None) == "unknown"
    assert plan_label(catalog, Principal(plan="pro")) == "pro"
    assert plan_label(catalog, Principal(plan="legacy-2019")) == "other"
    assert code_label(None) == "ok"
    assert code_label(InvalidRequest("x")) == Code.INVALID_REQUEST
    assert code_label(EngineError("x", code=Code.WORKER_LOST)) == "worker_lost"
    assert code_label(LLMLabError("x", code="some_future_code")) == "internal_error"


# -- through the routes ---------------------------------------------------------------------------


@dataclass
class _Handle:
    attempt: int
    script: list[Any]
    taken: bool = True

    def next_nowait(self) -> Any:
        return None

    async def next(self, timeout: float) -> Any:
        if not self.script:
            await asyncio.sleep(min(timeout, 0.01))
            return None
        item = self.script.pop(0)
        if isinstance(item, float):
            await asyncio.sleep(item)
            return self.script.pop(0)
        return item


@dataclass
class _Dispatcher:
    scripts: list[list[Any]] = field(default_factory=list)

    def live_workers(self, pool: str, excluding: str | None = None) -> int:
        return 1

    def predicted_wait(self, pool: str, priority: int = 0) -> float | None:
        return None

    async def wait_discovery(self) -> None:
        return None

    async def dispatch(self, req: InferenceRequest, target: RouteTarget) -> _Handle:
        return _Handle(req.attempt, self.scripts.pop(0) if self.scripts else [])

    def cancel(self, request_id: str, attempt: int | None, reason: str) -> None: ...

    def release(self, request_id: str) -> None: ...

    def record_attempt(self, event: AttemptEvent) -> None: ...

    def record_request(self, event: RequestEvent) -> None: ...


def _answer(tokens: int, gap_s: float = 0.0) -> list[Any]:
    out: list[Any] = [StreamStarted(request_id="r", attempt=1, seq=0, worker_id="w", engine="vllm", nats_queue_s=0)]
    for i in range(tokens):
        if gap_s and i:
            out.append(gap_s)
        out.append(TokenChunk(request_id="r", attempt=1, seq=i + 1, text="x", token_times=[0.0]))
    out.append(
        StreamEnd(
            request_id="r",
            attempt=1,
            seq=tokens + 1,
            finish_reason="stop",
            usage=Usage(prompt_tokens=7, completion_tokens=tokens, total_tokens=7 + tokens),
            timings=Timings(nats_queue_s=0, e2e_s=0.1),
        )
    )
    return out


def _gateway(plan: str, scripts: list[list[Any]]) -> tuple[Gateway, Metrics]:
    settings = GatewaySettings(queue_timeout_s=0.05, first_token_timeout_s=0.5, router="embedded")
    holder = CatalogHolder(DEFAULT_CATALOG)
    live = LiveState()
    for pool in ("gpu-vllm", "gpu-sglang", "cpu-vllm"):
        live.on_heartbeat(heartbeat(f"{pool}-0", pool, interval=60))
    service = CompletionService(settings, holder, EmbeddedRouter(RouterCore(holder, live)), _Dispatcher(scripts))
    metrics = Metrics("llmlab")
    admitter = StaticKeyAuthenticator([rules.hash_key(KEY)], plan)
    return Gateway(settings, holder, admitter, service, GatewayMetrics(metrics)), metrics


def _app(gw: Gateway) -> RawSendApp:
    app = RawSendApp()
    app.fast_routes = fast_routes()
    app.unexpected = functools.partial(unexpected_error, "gateway", request_ids=True)
    app.state.gateway = gw
    return app


def _requests(s: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in s.items() if k.startswith("llmlab_gateway_requests_total{")}


def _key(endpoint: str, model: str, plan: str, status: int, code: str) -> str:
    return (
        f'llmlab_gateway_requests_total{{code="{code}",endpoint="{endpoint}",model="{model}",'
        f'plan="{plan}",status="{status}"}}'
    )


async def test_requests_are_counted_with_plan_and_code_and_refusals_before_auth_as_unknown() -> None:
    """Catches: a refusal before authentication counted under a plan, an unknown model's name as
    a label, the error's code missing, or a success without ``ok``."""
    gw, metrics = _gateway("pro", [_answer(3)])
    auth = {"Authorization": f"Bearer {KEY}"}
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=_app(gw)), base_url="http://t") as c:
        assert (await c.post("/v1/chat/completions", json=chat, headers=auth)).status_code == 200
        assert (await c.post("/v1/chat/completions", json=chat)).status_code == 401
        bad_key = {"Authorization": "Bearer sk-wrong"}
        assert (await c.post("/v1/chat/completions", json=chat, headers=bad_key)).status_code == 401
        unknown = chat | {"model": "someone/their-own-model"}
        assert (await c.post("/v1/chat/completions", json=unknown, headers=auth)).status_code == 404
        # Authenticated, then nobody takes it (no script left): the plan is known by then.
        assert (await c.post("/v1/completions", json={"model": MODEL, "prompt": "x"}, headers=auth)).status_code == 429
    s = samples(metrics)
    assert _requests(s) == {
        _key("chat", MODEL, "pro", 200, "ok"): 1,
        _key("chat", "other", "unknown", 401, "missing_api_key"): 1,
        # A bad key is refused before the body is read: its model is not known either.
        _key("chat", "other", "unknown", 401, "invalid_api_key"): 1,
        _key("chat", "other", "unknown", 404, "model_not_found"): 1,
        _key("completions", MODEL, "pro", 429, "queue_timeout"): 1,
    }
    mp = f'{{model="{MODEL}",plan="pro"}}'
    assert s[f"llmlab_gateway_completion_tokens_total{mp}"] == 3
    assert s[f"llmlab_gateway_prompt_tokens_total{mp}"] == 7
    assert s[f"llmlab_gateway_ttft_seconds_count{mp}"] == 1
    assert s[f"llmlab_gateway_e2e_seconds_count{mp}"] == 1
    # Admission: the two authenticated requests were admitted and routed (the 429 one too); the
    # refusals before authentication and the unknown model never reached either step.
    assert s['llmlab_gateway_admission_seconds_count{step="auth_reserve"}'] == 2
    assert s['llmlab_gateway_admission_seconds_count{step="route"}'] == 2
    assert check_exposition(metrics.render()[0].decode()) == []


async def test_tpot_is_first_to_last_token_over_the_tokens_after_the_first() -> None:
    """Catches: TPOT divided by all the tokens (or by the chunks), observed for a one-token
    answer (no interval to divide), or counted per token instead of per request."""
    gw, metrics = _gateway("enterprise", [_answer(3, gap_s=0.05), _answer(1)])
    auth = {"Authorization": f"Bearer {KEY}"}
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=_app(gw)), base_url="http://t") as c:
        assert (await c.post("/v1/chat/completions", json=body, headers=auth)).status_code == 200
        assert (await c.post("/v1/chat/completions", json=body, headers=auth)).status_code == 200
    s = samples(metrics)
    mp = f'{{model="{MODEL}",plan="enterprise"}}'
    assert s[f"llmlab_gateway_tpot_seconds_count{mp}"] == 1
    assert 0.045 <= s[f"llmlab_gateway_tpot_seconds_sum{mp}"] <= 0.2  # (2 gaps of 50 ms) / 2
    assert s[_key("chat", MODEL, "enterprise", 200, "ok")] == 2


async def test_a_plan_the_catalog_does_not_name_is_counted_as_other() -> None:
    """Catches: a principal's plan string (a stale plan in the budget's directory) as a label."""
    gw, metrics = _gateway("legacy-2019", [])
    auth = {"Authorization": f"Bearer {KEY}"}
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=_app(gw)), base_url="http://t") as c:
        r = await c.post("/v1/chat/completions", json=body, headers=auth)
    code = r.json()["error"]["code"]
    assert _requests(samples(metrics)) == {_key("chat", MODEL, "other", r.status_code, code): 1}


class _GoneRequest:
    async def receive(self) -> dict[str, Any]:
        return {"type": "http.disconnect"}


async def test_a_client_that_leaves_is_counted_as_client_closed() -> None:
    """Catches: a 499 counted with an error code or as a success."""
    gw, metrics = _gateway("free", [_answer(3, gap_s=1.0)])
    body = ChatCompletionRequest.model_validate({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    ctx = CallContext("r", "chat", body, Principal(plan="free"), time.time())
    opened = await gw.service.open(ctx)
    done = _Done(gw.metrics, gw.metrics.of(MODEL, "free"), "chat", MODEL, "free", time.time())
    response = await _unary(_GoneRequest(), gw.service, opened, ctx, done, {})  # type: ignore[arg-type]
    assert response.status_code == 499
    s = samples(metrics)
    assert _requests(s) == {_key("chat", MODEL, "free", 499, "client_closed"): 1}
    assert s[f'llmlab_gateway_tpot_seconds_count{{model="{MODEL}",plan="free"}}'] == 0
