"""A completion's HTTP side: the request in (body, key, routing headers), the answer out as
server-sent events or as one JSON body, with the gateway's metrics. The work in between
(admission, routing, attempts and retries) is :class:`~llmlab_gateway.service.CompletionService`'s;
the two completion routes (:mod:`llmlab_gateway.routes`) call :func:`handle_completion`."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request, Response
from fastapi.responses import JSONResponse
from llmlab_common import openai_wire as wire
from llmlab_common.codes import Code
from llmlab_common.errors import AuthenticationFailed, EngineError, InvalidRequest, LLMLabError, invalid_request
from llmlab_common.http import error_response, new_request_id
from llmlab_common.logging import request_id_var
from llmlab_common.messages import Endpoint, Principal, StreamEnd, TokenChunk
from pydantic import ValidationError

from llmlab_gateway.auth import AdmissionRequest
from llmlab_gateway.deps import Gateway, read_body, route_hints
from llmlab_gateway.metrics import (
    CLIENT_CLOSED,
    OK,
    GatewayMetrics,
    ModelPlanMetrics,
    code_label,
    model_label,
    plan_label,
)
from llmlab_gateway.schemas import MAX_JSON_DEPTH, ChatCompletionRequest, CompletionRequest, json_depth_exceeds
from llmlab_gateway.service import CallContext, CompletionService, OpenedStream, estimate_prompt
from llmlab_gateway.sse import SseResponse

log = logging.getLogger(__name__)

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
TOO_DEEP = f"Request body nests objects or arrays deeper than {MAX_JSON_DEPTH} levels."


async def handle_completion(request: Request, gw: Gateway, endpoint: Endpoint) -> Response:
    """One completion request: read and validate the body, admit it (key and budget), open the
    answer through the router's chain, then relay it as SSE or as one JSON body. Every refusal
    is counted and recorded as a request event before the OpenAI-shaped error goes out."""
    request_id = new_request_id()
    request_id_var.set(request_id)
    service, settings, gm = gw.service, gw.settings, gw.metrics
    created_at = time.time()
    principal: Principal | None = None
    model: str | None = None
    ctx: CallContext | None = None
    key_sha: str | None = None  # set once the key passed the check before the body
    try:
        # The key is checked from the headers before the body is read or parsed.
        api_key, key_sha = await gw.authenticate_first(request, known_suffices=True)
        raw = await read_body(request, settings.max_body_bytes)
        try:
            payload = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise InvalidRequest(f"Request body is not valid JSON: {exc}", code=Code.INVALID_JSON) from exc
        except RecursionError as exc:  # nesting past the parser's own limit
            raise InvalidRequest(TOO_DEEP, code=Code.INVALID_JSON) from exc
        if not isinstance(payload, dict):
            raise InvalidRequest("Request body must be a JSON object.", code=Code.INVALID_JSON)
        if json_depth_exceeds(payload):
            raise InvalidRequest(TOO_DEEP, code=Code.INVALID_JSON)
        model = payload.get("model") if isinstance(payload.get("model"), str) else None
        try:
            body: ChatCompletionRequest | CompletionRequest = (
                ChatCompletionRequest.model_validate(payload)
                if endpoint == "chat"
                else CompletionRequest.model_validate(payload)
            )
        except ValidationError as exc:
            raise invalid_request(exc.errors()) from exc
        gw.require_model(body.model)
        hints = route_hints(request)
        # Authenticate and reserve (budget) before dispatching: over-budget work never reaches a
        # worker. A key admitted moments ago is routed meanwhile, on its last admission's plan
        # (route-ahead; CompletionService.route_ahead), and its request waits for its own.
        parse_s = time.time() - created_at
        t_admit = time.perf_counter()
        keys, bound = gw.admitted_keys, settings.route_ahead_max_admitting
        # Not in a burst: there the cores are the bottleneck, and overlapping the two round trips
        # made the 1,000-stream burst slower (docs/benchmarks.md).
        last = keys.get(key_sha) if keys.admitting < bound else None
        ahead = None
        if last is not None:
            ahead = service.route_ahead(CallContext(request_id, endpoint, body, last, created_at, None, hints))
        keys.admitting += 1
        try:
            admission = await gw.admitter.admit(
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
        except BaseException:
            keys.discard(key_sha)
            if ahead is not None:
                gm.route_ahead.labels("refused").inc()
            raise
        finally:
            keys.admitting -= 1
        principal = admission.principal
        if bound:  # off (0): nothing to remember
            keys.put(key_sha, principal)
        ctx = CallContext(request_id, endpoint, body, principal, created_at, admission.max_tokens, hints)
        ctx.auth_s = time.perf_counter() - t_admit
        ctx.parse_s = parse_s
        try:
            opened = await service.open(ctx, ahead)
        finally:
            if ahead is not None and ahead.used is not None:
                gm.route_ahead.labels("used" if ahead.used else "rerouted").inc()
    except Exception as exc:
        if isinstance(exc, LLMLabError):
            err = exc
            log.info("refused %s: %d %s", endpoint, err.status, err.message)
            if isinstance(err, AuthenticationFailed) and key_sha is not None:
                gw.auth_failed(request, key_sha)  # refused at the reserve (revoked meanwhile)
        else:
            # A bug, not a refusal: still one request event (the budget settles the reservation
            # by it instead of holding it until the reaper) and OpenAI's 500 shape, with no
            # internal detail for the client (the log has it, under the request id).
            log.exception("unexpected error serving %s", endpoint)
            err = LLMLabError("The server had an error while processing your request.")
        if ctx is not None:
            gm.admitted(ctx.auth_s, ctx.route_s)
        catalog = gw.holder.current.catalog
        gm.request(endpoint, model_label(catalog, model), plan_label(catalog, principal), err.status, code_label(err))
        service.record_failure(request_id, err, created_at, model, principal)
        return error_response(err, request_id)
    gm.admitted(ctx.auth_s, ctx.route_s)
    plan = plan_label(gw.holder.current.catalog, principal)
    mp = gm.of(opened.deployment.model, plan)
    first_at = time.time()
    mp.ttft.observe(first_at - created_at)
    if opened.attempts > 1:
        gm.attempts.labels(opened.deployment.model).inc(opened.attempts - 1)
    headers = {"X-Request-Id": request_id, "X-LLMLab-Deployment": opened.deployment.id}
    if opened.route is not None:
        headers["X-LLMLab-Route-Policy"] = opened.route.policy
    if opened.attempts > 1:
        headers["X-LLMLab-Attempts"] = str(opened.attempts)
    done = _Done(gm, mp, endpoint, opened.deployment.model, plan, first_at)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return SseResponse(_sse(service, opened, ctx, include_usage, done), headers={**headers, **SSE_HEADERS})
    return await _unary(request, service, opened, ctx, done, headers)


class _Done:
    """A relayed request's metrics, all at its end: the request counter, e2e, tokens, TPOT."""

    __slots__ = ("endpoint", "first_at", "gm", "model", "mp", "plan")

    def __init__(
        self, gm: GatewayMetrics, mp: ModelPlanMetrics, endpoint: Endpoint, model: str, plan: str, first_at: float
    ) -> None:
        self.gm, self.mp, self.endpoint, self.model, self.plan, self.first_at = gm, mp, endpoint, model, plan, first_at

    def __call__(
        self, ctx: CallContext, opened: OpenedStream, status: int | str, code: str, last_at: float | None = None
    ) -> None:
        now = time.time()
        self.gm.request(self.endpoint, self.model, self.plan, status, code)
        if opened.resumes:
            self.gm.resumes.labels(self.model, str(status)).inc(opened.resumes)
        last = last_at if last_at is not None else now
        self.mp.finished(opened.end, self.first_at, last, now - ctx.created_at, code == OK)


async def _sse(
    service: CompletionService, opened: OpenedStream, ctx: CallContext, include_usage: bool, done: _Done
) -> AsyncIterator[bytes]:
    endpoint, model = ctx.endpoint, opened.deployment.model
    oid, created = wire.object_id(endpoint, ctx.request_id), int(ctx.created_at)
    status, code = "200", OK
    last_at: float | None = None
    client_gone = True  # until proven otherwise: a cancelled generator means the client left
    gm = done.gm
    gm.in_flight.inc()
    try:
        if endpoint == "chat":
            yield wire.sse(
                wire.chunk(endpoint, oid, created, model, role="assistant", text="", include_usage_field=include_usage)
            )
        content = wire.ContentChunkEncoder(endpoint, oid, created, model, include_usage)
        async for batch in opened.batches():
            yield b"".join(_frames(batch, content, endpoint, oid, created, model, include_usage))
        last_at = time.time()
        yield wire.SSE_DONE
        client_gone = False
    except LLMLabError as err:
        # Headers are sent: report in-band as OpenAI does, then end the stream.
        status, code = str(err.status), code_label(err)
        log.warning("stream ended with error: %s", err.message)
        service.record_failure(ctx.request_id, err, ctx.created_at, ctx.body.model, ctx.principal)
        yield wire.sse(err.to_openai())
        yield wire.SSE_DONE
        client_gone = False
    finally:
        gm.in_flight.dec()
        if client_gone:
            done(ctx, opened, "499", CLIENT_CLOSED)
        else:
            done(ctx, opened, status, code, last_at)
        service.close(opened, ctx, client_gone)


def _frames(
    batch: list[TokenChunk | StreamEnd],
    content: wire.ContentChunkEncoder,
    endpoint: Endpoint,
    oid: str,
    created: int,
    model: str,
    include_usage: bool,
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
    finish: _Done,
    headers: dict[str, str],
) -> Response:
    model = opened.deployment.model
    gm = finish.gm
    gm.in_flight.inc()
    client_gone = False
    # What the request is counted as; a failure outside LLMLabError is answered 500 by the app.
    status, code, last_at = "500", Code.INTERNAL_ERROR.value, None
    collect = asyncio.ensure_future(_collect(opened))
    watch = asyncio.ensure_future(_wait_disconnect(request))
    try:
        done, _ = await asyncio.wait({collect, watch}, return_when=asyncio.FIRST_COMPLETED)
        if collect not in done:
            client_gone = True
            collect.cancel()
            opened.delivered_tokens = 0  # collected for a body the client never received
            status, code = "499", CLIENT_CLOSED
            return Response(status_code=499)
        try:
            text, tools, end = collect.result()
        except LLMLabError as err:
            status, code = str(err.status), code_label(err)
            service.record_failure(ctx.request_id, err, ctx.created_at, ctx.body.model, ctx.principal)
            return error_response(err, ctx.request_id)
        status, code, last_at = "200", OK, time.time()
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
        finish(ctx, opened, status, code, last_at)
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
        raise EngineError("the stream ended without a terminal message", code=Code.STREAM_GAP)
    return "".join(parts), tools, end


async def _wait_disconnect(request: Request) -> None:
    # The body is consumed, so the next ASGI message can only be the disconnect.
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
