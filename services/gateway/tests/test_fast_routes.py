"""The completion routes served as plain ASGI (``RawSendApp.fast_routes``)."""

from __future__ import annotations

import functools
from pathlib import Path

import httpx
import pytest
from fastapi import Request, Response
from fastapi.responses import JSONResponse
from llmlab_common.http import unexpected_error
from llmlab_gateway.app import create_app
from llmlab_gateway.settings import GatewaySettings
from llmlab_gateway.sse import RawSendApp

pytestmark = pytest.mark.unit
CATALOG = Path(__file__).resolve().parents[3] / "configs" / "catalog.yaml"


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


async def test_an_unexpected_error_before_the_answer_is_a_500_with_its_request_event() -> None:
    """Catches: an exception outside the project's error types escaping handle_completion
    (dd4f538): a bare 500 with no request event, so the budget held the request's reservation
    until the reaper; and internal detail (a host or worker name) reaching the client."""
    from llmlab_common.messages import Principal
    from llmlab_common.metrics import Metrics
    from llmlab_gateway.auth import Admission
    from llmlab_gateway.deps import Gateway
    from llmlab_gateway.metrics import GatewayMetrics
    from llmlab_gateway.relay import handle_completion
    from llmlab_routing.config import CatalogHolder

    failures: list[tuple[str, object]] = []

    class Service:
        def route_ahead(self, ctx: object) -> None:
            return None

        async def open(self, ctx: object, ahead: object = None) -> object:
            raise RuntimeError("pool gpu-vllm: worker-7.internal:8091 refused")

        def record_failure(self, request_id: str, err: object, *_: object) -> None:
            failures.append((request_id, err))

    class Admitter:
        async def authenticate(self, api_key: str) -> Principal:
            return Principal(key_id="k", plan="pro")

        async def admit(self, api_key: str, req: object) -> Admission:
            return Admission(principal=Principal(key_id="k", plan="pro"), max_tokens=8)

    holder = CatalogHolder(CATALOG)
    gw = Gateway(GatewaySettings(), holder, Admitter(), Service(), GatewayMetrics(Metrics("t")))  # type: ignore[arg-type]
    app = RawSendApp()

    async def chat(request: Request) -> Response:
        return await handle_completion(request, gw, "chat")

    app.fast_routes = {"/v1/chat/completions": chat}
    app.unexpected = functools.partial(unexpected_error, "gateway", request_ids=True)  # as create_app does
    body = {"model": "meta-llama/Llama-3.1-8B-Instruct", "messages": [{"role": "user", "content": "hi"}]}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        r = await c.post("/v1/chat/completions", json=body, headers={"Authorization": "Bearer sk-x"})
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error", r.text
    assert "worker-7" not in r.text and "internal:8091" not in r.text
    assert [rid for rid, _ in failures] == [r.headers["x-request-id"]]
    assert getattr(failures[0][1], "status", None) == 500


async def test_keys_are_checked_before_the_body_and_failing_addresses_are_refused_from_headers() -> None:
    """Catches: a request with a bad key having its body (up to 4 MiB) read and parsed before
    the refusal (dd4f538 authenticated only after parsing), a refused key costing a budget round
    trip again, and no limit on authentication failures per client address (a flood of fresh
    random keys competed with real traffic for the budget)."""
    from llmlab_common.authguard import AuthFailures
    from llmlab_common.errors import AuthenticationFailed, ServiceUnavailable
    from llmlab_common.messages import Principal
    from llmlab_common.metrics import Metrics
    from llmlab_gateway.auth import Admission
    from llmlab_gateway.deps import Gateway
    from llmlab_gateway.metrics import GatewayMetrics
    from llmlab_gateway.relay import handle_completion
    from llmlab_routing.config import CatalogHolder

    calls: list[str] = []
    revoked: set[str] = set()

    class Service:
        def route_ahead(self, ctx: object) -> None:
            return None

        async def open(self, ctx: object, ahead: object = None) -> object:
            raise ServiceUnavailable("No workers.")  # admission is what this test is about

        def record_failure(self, *_: object) -> None:
            pass

    class Admitter:
        async def authenticate(self, api_key: str) -> Principal:
            calls.append(f"auth:{api_key}")
            if not api_key.startswith("sk-good"):
                raise AuthenticationFailed("Incorrect API key provided.")
            return Principal(key_id="k", plan="pro")

        async def admit(self, api_key: str, req: object) -> Admission:
            calls.append(f"admit:{api_key}")
            if api_key in revoked:
                raise AuthenticationFailed("This API key has been revoked.")
            return Admission(principal=Principal(key_id="k", plan="pro"), max_tokens=8)

    failures = AuthFailures(max_failures=3, window_s=60)
    gw = Gateway(
        GatewaySettings(), CatalogHolder(CATALOG), Admitter(), Service(), GatewayMetrics(Metrics("t")),  # type: ignore[arg-type]
        auth_failures=failures,
    )  # fmt: skip
    app = RawSendApp()

    async def chat(request: Request) -> Response:
        return await handle_completion(request, gw, "chat")

    app.fast_routes = {"/v1/chat/completions": chat}
    body = {"model": "meta-llama/Llama-3.1-8B-Instruct", "messages": [{"role": "user", "content": "hi"}]}

    def bearer(key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"}

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        # A bad key with a body that is not JSON: 401 for the key, so the body was never parsed.
        r = await c.post("/v1/chat/completions", content=b"{not json", headers=bearer("sk-wrong"))
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", r.text
        assert calls == ["auth:sk-wrong"]
        # Refused moments ago: refused again with no budget round trip.
        r = await c.post("/v1/chat/completions", json=body, headers=bearer("sk-wrong"))
        assert r.status_code == 401 and calls == ["auth:sk-wrong"]
        # A good key is checked once before its first body; then it goes straight to the reserve.
        for _ in range(2):
            await c.post("/v1/chat/completions", json=body, headers=bearer("sk-good"))
        assert calls[1:] == ["auth:sk-good", "admit:sk-good", "admit:sk-good"]
        # The third failure from this address (a fresh key), then the address is refused from its
        # headers: 429 with Retry-After and no lookup, even when it claims another address.
        r = await c.post("/v1/chat/completions", json=body, headers=bearer("sk-random-1"))
        assert r.status_code == 401
        del calls[:]
        for headers in (bearer("sk-random-2"), {**bearer("sk-random-3"), "X-Forwarded-For": "203.0.113.9"}, {}):
            r = await c.post("/v1/chat/completions", content=b"{not json", headers=headers)
            assert r.status_code == 429, r.text
            assert r.json()["error"]["code"] == "too_many_authentication_failures"
            assert 0 < float(r.headers["retry-after"]) <= 60
        assert calls == []
        # A key known good here still gets through from that address (a shared NAT's other users).
        r = await c.post("/v1/chat/completions", json=body, headers=bearer("sk-good"))
        assert r.status_code == 503 and calls == ["admit:sk-good"]
        # The reserve refusing it (revoked meanwhile) makes it unknown again: next time, 429.
        revoked.add("sk-good")
        r = await c.post("/v1/chat/completions", json=body, headers=bearer("sk-good"))
        assert r.status_code == 401 and calls == ["admit:sk-good"] * 2
        r = await c.post("/v1/chat/completions", json=body, headers=bearer("sk-good"))
        assert r.status_code == 429 and calls == ["admit:sk-good"] * 2
    # The window passes: the address is heard again, and the refused key asked about again.
    failures.clock = gw.refused_keys.clock = lambda: 10**9
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        r = await c.post("/v1/chat/completions", json=body, headers=bearer("sk-wrong"))
        assert r.status_code == 401 and calls[-1] == "auth:sk-wrong"
