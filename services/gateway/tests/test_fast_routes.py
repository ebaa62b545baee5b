"""The completion routes served as plain ASGI (``RawSendApp.fast_routes``)."""

from __future__ import annotations

import functools

import httpx
import pytest
from fastapi import Request, Response
from fastapi.responses import JSONResponse
from llmlab_common.http import unexpected_error
from llmlab_gateway.app import create_app
from llmlab_gateway.settings import GatewaySettings
from llmlab_gateway.sse import RawSendApp

pytestmark = pytest.mark.unit


def test_fast_routes_are_the_completion_routes_of_the_app() -> None:
    """Catches: a completion route added or renamed on one side only (served without the fast
    path, or a fast path with no documented route behind it)."""
    app = create_app(GatewaySettings())
    posted = {path for path, ops in app.openapi()["paths"].items() if "post" in ops}
    assert set(app.fast_routes) == {"/v1/chat/completions", "/v1/completions"} == posted


async def test_a_fast_route_answers_its_own_way_and_anything_unexpected_in_openai_shape() -> None:
    """Catches: a fast handler's exception escaping as the server's bare 500 (no OpenAI error body),
    and other methods on a fast path not reaching FastAPI (405 in OpenAI's shape there)."""
    app = RawSendApp()

    async def ok(request: Request) -> Response:
        return JSONResponse({"path": request.url.path, "body": (await request.body()).decode()})

    async def boom(request: Request) -> Response:
        raise RuntimeError("bug")

    app.fast_routes = {"/ok": ok, "/boom": boom}
    app.unexpected = functools.partial(unexpected_error, "gateway", request_ids=True)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        r = await c.post("/ok", content=b"hi")
        assert r.json() == {"path": "/ok", "body": "hi"}
        r = await c.post("/boom")
        assert r.status_code == 500 and r.json()["error"]["message"].startswith("Internal error")
        assert r.headers["x-request-id"]
        r = await c.get("/ok")  # not a fast route: FastAPI's own 404
        assert r.status_code == 404
