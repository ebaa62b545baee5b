"""Gateway transport: FastAPI routes, body limits, SSE framing. Domain work is in
:mod:`llmlab_gateway.service`, NATS in :mod:`llmlab_gateway.dispatch`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from llmlab_common import openai_wire as wire
from llmlab_common.errors import EngineError, InvalidRequest, LLMLabError, NotFound, PayloadTooLarge
from llmlab_common.logging import request_id_var
from llmlab_common.messages import Endpoint, Principal, StreamEnd, TokenChunk
from llmlab_common.metrics import Metrics
from llmlab_common.natsio import connect, ensure_streams
from llmlab_common.runtime import ServiceState, ops_router
from llmlab_common.subjects import Topology
from llmlab_routing.config import CatalogHolder, watch_catalog
from llmlab_routing.core import RouterCore
from llmlab_routing.feed import LiveFeed
from llmlab_routing.records import DecisionLog
from llmlab_routing.state import LiveState
from pydantic import ValidationError

from llmlab_gateway.auth import AdmissionRequest, Admitter, StaticKeyAuthenticator, require_key
from llmlab_gateway.budget_client import BudgetAdmitter
from llmlab_gateway.dispatch import NatsDispatcher
from llmlab_gateway.routing import EmbeddedRouter, RemoteRouter, Router
from llmlab_gateway.schemas import ChatCompletionRequest, CompletionRequest
from llmlab_gateway.service import CallContext, CompletionService, OpenedStream, RouteHints, estimate_prompt
from llmlab_gateway.settings import GatewaySettings

log = logging.getLogger(__name__)

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class GatewayMetrics:
    def __init__(self, m: Metrics) -> None:
        self.requests = m.counter(
            "gateway_requests_total", "Requests by endpoint, model and status", ("endpoint", "model", "status")
        )
        self.ttft = m.histogram("gateway_ttft_seconds", "Accepted to first token sent", ("model",))
        self.e2e = m.histogram("gateway_e2e_seconds", "Accepted to last byte", ("model",))
        self.in_flight = m.gauge("gateway_in_flight_requests", "Requests being served")
        self.attempts = m.counter("gateway_retries_total", "Attempts beyond the first", ("model",))
        self.tokens = m.counter("gateway_completion_tokens_total", "Completion tokens relayed", ("model",))
        self.router_degraded = m.counter(
            "gateway_router_fallbacks_total",
            "Routes decided in the gateway because the router did not answer",
            ("why",),
        )


def _float_header(request: Request, name: str, lo: float, hi: float) -> float | None:
    raw = request.headers.get(name)
    if raw is None:
        return None
    try:
        v = float(raw)
    except ValueError:
        v = float("nan")
    if not lo <= v <= hi:
        raise InvalidRequest(f"Header {name} must be a number in [{lo}, {hi}], got {raw!r}.", code="invalid_header")
    return v


def route_hints(request: Request) -> RouteHints:
    """Optional per-request routing constraints; they can only tighten the plan's."""
    return RouteHints(
        slo_class=request.headers.get("x-llmlab-slo-class"),
        quality_floor=_float_header(request, "x-llmlab-quality-floor", 0.0, 1.0),
        max_cost_usd=_float_header(request, "x-llmlab-max-cost-usd", 1e-12, 1e6),
        policy=request.headers.get("x-llmlab-route-policy"),
    )


def _new_request_id() -> str:
    return secrets.token_hex(12)


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"Request body of {declared} bytes exceeds the limit of {limit} bytes.")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"Request body exceeds the limit of {limit} bytes.")
        chunks.append(chunk)
    return b"".join(chunks)


def _validation_error(exc: ValidationError) -> InvalidRequest:
    first = exc.errors()[0]
    param = ".".join(str(p) for p in first["loc"]) or None
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "missing":
        msg = f"Missing required parameter: '{param}'."
    else:
        msg = f"Invalid value for '{param}': {msg}"
    return InvalidRequest(
        msg, param=param, code="missing_required_parameter" if first["type"] == "missing" else "invalid_value"
    )


def _error_response(err: LLMLabError, request_id: str) -> JSONResponse:
    headers = {"X-Request-Id": request_id, **err.headers}
    return JSONResponse(err.to_openai(), status_code=err.status, headers=headers)


def create_app(settings: GatewaySettings, admitter: Admitter | None = None) -> FastAPI:
    metrics = Metrics("llmlab")
    gm = GatewayMetrics(metrics)
    state = ServiceState()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        holder = CatalogHolder(settings.infra.catalog_path)
        topo = Topology(settings.infra.namespace)
        nc = await connect(settings.infra.nats_url, f"gateway-{settings.gateway_id}")
        js = nc.jetstream()
        await ensure_streams(js, topo)
        dispatcher = NatsDispatcher(
            nc,
            js,
            topo,
            settings.gateway_id,
            metrics,
            settings.worker_discovery_grace_s,
            settings.worker_sweep_interval_s,
        )
        live = LiveState()
        dispatcher.heartbeat_listeners.append(live.on_heartbeat)  # the dispatcher already parses them
        await dispatcher.start()
        feed = LiveFeed(nc, js, topo, live, heartbeats=False)
        await feed.start()
        dlog = DecisionLog(settings.decision_log) if settings.decision_log is not None else None
        core = RouterCore(holder, live, dlog)
        embedded = EmbeddedRouter(core)
        router: Router = (
            embedded
            if settings.router == "embedded"
            else RemoteRouter(nc, topo, settings.router_timeout_s, embedded, gm.router_degraded)
        )
        reloader = asyncio.create_task(watch_catalog(holder, settings.catalog_reload_interval_s), name="catalog-reload")
        app.state.holder = holder
        app.state.dispatcher = dispatcher
        if admitter is not None:
            app.state.admitter = admitter
        elif settings.auth == "static":
            app.state.admitter = StaticKeyAuthenticator(
                settings.api_key_sha256, settings.dev_plan, settings.auth_enabled
            )
        else:
            app.state.admitter = BudgetAdmitter(nc, topo, settings.budget_timeout_s)
        app.state.service = CompletionService(settings, holder, router, dispatcher)
        state.checks["nats"] = lambda: nc.is_connected
        state.checks["workers_discovered"] = dispatcher.discovery_done
        log.info(
            "gateway %s up on %s:%d (namespace %s)",
            settings.gateway_id,
            settings.host,
            settings.port,
            settings.infra.namespace,
        )
        try:
            yield
        finally:
            reloader.cancel()
            await feed.stop()
            await dispatcher.stop()
            if dlog is not None:
                dlog.close()
            with contextlib.suppress(Exception):
                await nc.drain()

    app = FastAPI(title="llm-inference-lab gateway", lifespan=lifespan)
    app.state.service_state = state
    app.include_router(ops_router(state, metrics))

    @app.exception_handler(LLMLabError)
    async def _on_error(request: Request, exc: LLMLabError) -> JSONResponse:
        return _error_response(exc, request_id_var.get() or _new_request_id())

    @app.exception_handler(404)
    async def _not_found(request: Request, exc: Exception) -> JSONResponse:
        return _error_response(NotFound(f"Unknown path {request.url.path}"), _new_request_id())

    @app.exception_handler(405)
    async def _bad_method(request: Request, exc: Exception) -> JSONResponse:
        err = InvalidRequest(f"Method {request.method} not allowed on {request.url.path}", code="method_not_allowed")
        err.status = 405
        return _error_response(err, _new_request_id())

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return _error_response(LLMLabError("Internal error; see gateway logs."), request_id_var.get() or "")

    @app.get("/v1/models")
    async def list_models(request: Request) -> JSONResponse:
        await request.app.state.admitter.authenticate(_bearer(request))
        catalog = request.app.state.holder.current.catalog
        created = int(time.time())
        data = [
            {"id": m, "object": "model", "created": created, "owned_by": "llm-inference-lab"}
            for m in catalog.public_models()
        ]
        return JSONResponse({"object": "list", "data": data})

    @app.get("/v1/models/{model:path}")
    async def get_model(model: str, request: Request) -> JSONResponse:
        await request.app.state.admitter.authenticate(_bearer(request))
        _require_model(request, model)
        return JSONResponse(
            {"id": model, "object": "model", "created": int(time.time()), "owned_by": "llm-inference-lab"}
        )

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await _handle(request, "chat")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _handle(request, "completions")

    async def _handle(request: Request, endpoint: Endpoint) -> Response:
        request_id = _new_request_id()
        request_id_var.set(request_id)
        service: CompletionService = request.app.state.service
        created_at = time.time()
        model_label = "unknown"
        principal: Principal | None = None
        model: str | None = None
        try:
            api_key = require_key(_bearer(request))
            raw = await _read_body(request, settings.max_body_bytes)
            try:
                payload = json.loads(raw)
            except (ValueError, UnicodeDecodeError) as exc:
                raise InvalidRequest(f"Request body is not valid JSON: {exc}", code="invalid_json") from exc
            if not isinstance(payload, dict):
                raise InvalidRequest("Request body must be a JSON object.", code="invalid_json")
            model = payload.get("model") if isinstance(payload.get("model"), str) else None
            try:
                body: ChatCompletionRequest | CompletionRequest = (
                    ChatCompletionRequest.model_validate(payload)
                    if endpoint == "chat"
                    else CompletionRequest.model_validate(payload)
                )
            except ValidationError as exc:
                raise _validation_error(exc) from exc
            _require_model(request, body.model)
            hints = route_hints(request)
            # Authenticate and reserve (budget) before routing: over-budget work never reaches a worker.
            admission = await request.app.state.admitter.admit(
                api_key,
                AdmissionRequest(
                    request_id=request_id,
                    endpoint=endpoint,
                    model=body.model,
                    prompt=estimate_prompt(body),
                    requested_max_tokens=body.requested_max_tokens(),
                    deadline=created_at + settings.request_timeout_s,
                ),
            )
            principal = admission.principal
            ctx = CallContext(request_id, endpoint, body, principal, created_at, admission.max_tokens, hints)
            opened = await service.open(ctx)
        except LLMLabError as err:
            found = request.app.state.holder.current.catalog.resolve(model) if model is not None else []
            if found:
                model_label = found[0].model
            gm.requests.labels(endpoint, model_label, str(err.status)).inc()
            log.info("refused %s: %d %s", endpoint, err.status, err.message)
            service.record_failure(request_id, err, created_at, model, principal)
            return _error_response(err, request_id)
        model_label = opened.deployment.model
        gm.ttft.labels(model_label).observe(time.time() - created_at)
        if opened.attempts > 1:
            gm.attempts.labels(model_label).inc(opened.attempts - 1)
        headers = {"X-Request-Id": request_id, "X-LLMLab-Deployment": opened.deployment.id}
        if opened.route is not None:
            headers["X-LLMLab-Route-Policy"] = opened.route.policy
        if opened.attempts > 1:
            headers["X-LLMLab-Attempts"] = str(opened.attempts)
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(
                _sse(service, opened, ctx, include_usage, gm),
                media_type="text/event-stream",
                headers={**headers, **SSE_HEADERS},
            )
        return await _unary(request, service, opened, ctx, gm, headers)

    return app


def _require_model(request: Request, name: str) -> None:
    """404 unless a deployment serves the name or it is a routing alias (auto, fast, cheap, best)."""
    current = request.app.state.holder.current
    if name not in current.routing.aliases:
        current.catalog.require(name)


def _bearer(request: Request) -> str | None:
    header = request.headers.get("authorization")
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


async def _sse(
    service: CompletionService, opened: OpenedStream, ctx: CallContext, include_usage: bool, gm: GatewayMetrics
) -> AsyncIterator[bytes]:
    endpoint, model = ctx.endpoint, opened.deployment.model
    oid, created = wire.object_id(endpoint, ctx.request_id), int(ctx.created_at)
    status = "200"
    client_gone = True  # until proven otherwise: a cancelled generator means the client left
    gm.in_flight.inc()
    try:
        if endpoint == "chat":
            yield wire.sse(
                wire.chunk(endpoint, oid, created, model, role="assistant", text="", include_usage_field=include_usage)
            )
        content = wire.ContentChunkEncoder(endpoint, oid, created, model, include_usage)
        async for batch in opened.batches():
            yield b"".join(_frames(batch, content, endpoint, oid, created, model, include_usage, gm))
        yield wire.SSE_DONE
        client_gone = False
    except LLMLabError as err:
        # Headers are sent: report in-band as OpenAI does, then end the stream.
        status = str(err.status)
        log.warning("stream ended with error: %s", err.message)
        service.record_failure(ctx.request_id, err, ctx.created_at, ctx.body.model, ctx.principal)
        yield wire.sse(err.to_openai())
        yield wire.SSE_DONE
        client_gone = False
    finally:
        gm.in_flight.dec()
        gm.requests.labels(endpoint, model, "499" if client_gone else status).inc()
        gm.e2e.labels(model).observe(time.time() - ctx.created_at)
        service.close(opened, ctx, client_gone)


def _frames(
    batch: list[TokenChunk | StreamEnd],
    content: wire.ContentChunkEncoder,
    endpoint: Endpoint,
    oid: str,
    created: int,
    model: str,
    include_usage: bool,
    gm: GatewayMetrics,
) -> list[bytes]:
    out: list[bytes] = []
    for m in batch:
        if isinstance(m, TokenChunk) and not m.tool_calls:
            out.append(content.encode(m.text))
        elif isinstance(m, TokenChunk):
            out.append(
                wire.sse(
                    wire.chunk(
                        endpoint,
                        oid,
                        created,
                        model,
                        text=m.text,
                        tool_calls=m.tool_calls,
                        include_usage_field=include_usage,
                    )
                )
            )
        else:
            gm.tokens.labels(model).inc(m.usage.completion_tokens)
            out.append(
                wire.sse(
                    wire.chunk(
                        endpoint,
                        oid,
                        created,
                        model,
                        text="" if endpoint == "completions" else None,
                        finish_reason=m.finish_reason,
                        include_usage_field=include_usage,
                    )
                )
            )
            if include_usage:
                out.append(wire.sse(wire.chunk(endpoint, oid, created, model, usage=m.usage)))
    return out


async def _unary(
    request: Request,
    service: CompletionService,
    opened: OpenedStream,
    ctx: CallContext,
    gm: GatewayMetrics,
    headers: dict[str, str],
) -> Response:
    model = opened.deployment.model
    gm.in_flight.inc()
    client_gone = False
    collect = asyncio.ensure_future(_collect(opened))
    watch = asyncio.ensure_future(_wait_disconnect(request))
    try:
        done, _ = await asyncio.wait({collect, watch}, return_when=asyncio.FIRST_COMPLETED)
        if collect not in done:
            client_gone = True
            collect.cancel()
            opened.delivered_tokens = 0  # collected for a body the client never received
            gm.requests.labels(ctx.endpoint, model, "499").inc()
            return Response(status_code=499)
        try:
            text, tools, end = collect.result()
        except LLMLabError as err:
            gm.requests.labels(ctx.endpoint, model, str(err.status)).inc()
            service.record_failure(ctx.request_id, err, ctx.created_at, ctx.body.model, ctx.principal)
            return _error_response(err, ctx.request_id)
        gm.tokens.labels(model).inc(end.usage.completion_tokens)
        gm.requests.labels(ctx.endpoint, model, "200").inc()
        body = wire.completion(
            ctx.endpoint,
            wire.object_id(ctx.endpoint, ctx.request_id),
            int(ctx.created_at),
            model,
            text=text,
            finish_reason=end.finish_reason,
            usage=end.usage,
            tool_calls=tools or None,
        )
        return JSONResponse(body, headers=headers)
    finally:
        watch.cancel()
        gm.in_flight.dec()
        gm.e2e.labels(model).observe(time.time() - ctx.created_at)
        service.close(opened, ctx, client_gone)


async def _collect(opened: OpenedStream) -> tuple[str, list[dict[str, Any]], StreamEnd]:
    parts: list[str] = []
    tools: list[dict[str, Any]] = []
    end: StreamEnd | None = None
    async for m in opened:
        if isinstance(m, TokenChunk):
            parts.append(m.text)
            if m.tool_calls:
                wire.merge_tool_call_deltas(tools, m.tool_calls)
        else:
            end = m
    if end is None:  # OpenedStream ends with StreamEnd or raises; this guards the invariant
        raise EngineError("the stream ended without a terminal message", code="stream_gap")
    return "".join(parts), tools, end


async def _wait_disconnect(request: Request) -> None:
    # The body is consumed, so the next ASGI message can only be the disconnect.
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
