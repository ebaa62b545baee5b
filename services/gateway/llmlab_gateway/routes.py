"""The gateway's OpenAI routes, declared at module level: model listing and the two completion
routes. Each is thin: authentication, admission and the relay are elsewhere
(:mod:`llmlab_gateway.relay`, :mod:`llmlab_gateway.service`)."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from llmlab_gateway.deps import Gateway, GatewayDep, bearer_key
from llmlab_gateway.relay import handle_completion
from llmlab_gateway.sse import FastHandler

router = APIRouter()


@router.get("/v1/models")
async def list_models(request: Request, gw: GatewayDep) -> JSONResponse:
    await gw.admitter.authenticate(bearer_key(request))
    created = int(time.time())
    data = [
        {"id": m, "object": "model", "created": created, "owned_by": "llm-inference-lab"}
        for m in gw.holder.current.catalog.public_models()
    ]
    return JSONResponse({"object": "list", "data": data})


@router.get("/v1/models/{model:path}")
async def get_model(model: str, request: Request, gw: GatewayDep) -> JSONResponse:
    await gw.admitter.authenticate(bearer_key(request))
    gw.require_model(model)
    return JSONResponse({"id": model, "object": "model", "created": int(time.time()), "owned_by": "llm-inference-lab"})


@router.post("/v1/chat/completions")
async def chat_completions(request: Request, gw: GatewayDep) -> Response:
    return await handle_completion(request, gw, "chat")


@router.post("/v1/completions")
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
