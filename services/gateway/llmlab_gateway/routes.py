"""The gateway's OpenAI routes, declared at module level: model listing and the two completion
routes. Each is thin: authentication, admission and the relay are elsewhere
(:mod:`llmlab_gateway.relay`, :mod:`llmlab_gateway.service`)."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from llmlab_common.errors import error_responses
from pydantic import BaseModel

from llmlab_gateway.deps import Gateway, GatewayDep
from llmlab_gateway.relay import handle_completion
from llmlab_gateway.schemas import ChatCompletionRequest, CompletionRequest
from llmlab_gateway.sse import FastHandler

# What the gateway answers besides 200, each with OpenAI's error object.
_AUTH_ERRORS = {
    401: "Missing, invalid or revoked API key",
    429: "Too many authentication failures from this address (Retry-After)",
    503: "The budget service is unavailable",
}
_MODEL_ERRORS = {**_AUTH_ERRORS, 404: "Unknown model"}
# A completion answers one JSON body, or an SSE stream with "stream": true.
_COMPLETION_OK: dict[int | str, dict[str, Any]] = {
    200: {
        "description": 'The completion: one JSON body, or with "stream": true a text/event-stream of chunks',
        "content": {"application/json": {}, "text/event-stream": {}},
    }
}
_COMPLETION_ERRORS = {
    **_MODEL_ERRORS,
    400: "Invalid request (the param is named), or the engine refused it",
    403: "Not allowed for this key's plan",
    413: "Request body or prompt too large",
    429: "Rate limited, over budget, no capacity within the queue timeout, or too many authentication "
    "failures from this address (Retry-After)",
    500: "Internal error (no detail; the log has it under the request id)",
    502: "The engine failed",
    504: "The engine did not answer in time",
}
router = APIRouter(responses=error_responses({422: "Not sent by the gateway (its 400 covers invalid bodies)"}))

# Checked by the handler beyond what the request models' JSON schema says (documented on each route).
_BEYOND_SCHEMA = (
    "Besides the schema: objects and arrays nested at most 32 levels deep, and a prompt plus "
    "max_tokens that fit the model's context (the catalog's). Errors: 400 with OpenAI's error "
    "object naming the param."
)


def _request_body(model: type[BaseModel]) -> dict[str, Any]:
    """The OpenAPI requestBody of a completion route: the JSON schema of the very model the
    handler validates the body with (:func:`~llmlab_gateway.relay.handle_completion`), its
    definitions inlined. The handler reads the raw body itself, on the fast path and here."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return inline(defs[ref.removeprefix("#/$defs/")])
            return {k: inline(v) for k, v in node.items()}
        if isinstance(node, list):
            return [inline(v) for v in node]
        return node

    return {"requestBody": {"required": True, "content": {"application/json": {"schema": inline(schema)}}}}


@router.get("/v1/models", responses=error_responses(_AUTH_ERRORS))
async def list_models(request: Request, gw: GatewayDep) -> JSONResponse:
    await gw.authenticate_first(request, known_suffices=False)
    created = int(time.time())
    data = [
        {"id": m, "object": "model", "created": created, "owned_by": "llm-inference-lab"}
        for m in gw.holder.current.catalog.public_models()
    ]
    return JSONResponse({"object": "list", "data": data})


@router.get("/v1/models/{model:path}", responses=error_responses(_MODEL_ERRORS))
async def get_model(model: str, request: Request, gw: GatewayDep) -> JSONResponse:
    await gw.authenticate_first(request, known_suffices=False)
    gw.require_model(model)
    return JSONResponse({"id": model, "object": "model", "created": int(time.time()), "owned_by": "llm-inference-lab"})


@router.post(
    "/v1/chat/completions",
    openapi_extra=_request_body(ChatCompletionRequest),
    description=_BEYOND_SCHEMA,
    responses={**_COMPLETION_OK, **error_responses(_COMPLETION_ERRORS)},
)
async def chat_completions(request: Request, gw: GatewayDep) -> Response:
    return await handle_completion(request, gw, "chat")


@router.post(
    "/v1/completions",
    openapi_extra=_request_body(CompletionRequest),
    description=_BEYOND_SCHEMA,
    responses={**_COMPLETION_OK, **error_responses(_COMPLETION_ERRORS)},
)
async def completions(request: Request, gw: GatewayDep) -> Response:
    return await handle_completion(request, gw, "completions")


def fast_routes() -> dict[str, FastHandler]:
    """The completion routes as plain ASGI handlers (:class:`~llmlab_gateway.sse.RawSendApp`):
    the same :func:`handle_completion` as the routes above, without FastAPI's routing,
    dependencies and middleware on every request."""

    async def chat(request: Request) -> Response:
        gw: Gateway = request.app.state.gateway
        return await handle_completion(request, gw, "chat")

    async def legacy(request: Request) -> Response:
        gw: Gateway = request.app.state.gateway
        return await handle_completion(request, gw, "completions")

    return {"/v1/chat/completions": chat, "/v1/completions": legacy}
