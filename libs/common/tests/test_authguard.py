"""Authentication-failure limits per client address, and which address counts."""

from __future__ import annotations

import pytest
from fastapi import FastAPI, Request
from llmlab_common.authguard import AuthFailures, bearer_token, client_address
from llmlab_common.errors import AuthenticationFailed, RateLimited
from llmlab_common.http import authenticate_first, authenticated_principal, install_error_handlers
from llmlab_common.settings import ServiceSettings
from pydantic import BaseModel

pytestmark = pytest.mark.unit


def test_the_address_is_the_peer_unless_proxies_are_trusted_and_never_the_clients_own_claim() -> None:
    assert client_address("10.0.0.5", "1.2.3.4", 0) == "10.0.0.5"  # no trusted proxy: the header is forged
    # One trusted proxy appended what it saw; "1.2.3.4" is the client's claim, never used.
    assert client_address("10.0.0.5", "1.2.3.4, 198.51.100.7", 1) == "198.51.100.7"
    assert client_address("10.0.0.5", "1.2.3.4, 198.51.100.7, 10.0.0.9", 2) == "198.51.100.7"
    assert client_address("10.0.0.5", "198.51.100.7", 2) == "10.0.0.5"  # fewer hops than trusted: the peer
    assert client_address(None, None, 0) == "unknown"


def test_bearer_token() -> None:
    assert bearer_token("Bearer sk-1") == bearer_token("bearer  sk-1 ") == "sk-1"
    assert bearer_token("Basic sk-1") is bearer_token("Bearer ") is bearer_token(None) is None


def test_failures_refuse_an_address_until_its_window_ends() -> None:
    now = [1000.0]
    f = AuthFailures(max_failures=2, window_s=60, clock=lambda: now[0])
    f.failed("a")
    f.check("a")  # one failure: still heard
    f.failed("a")
    with pytest.raises(RateLimited) as exc:
        f.check("a")
    assert exc.value.retry_after_s == 60 and exc.value.code == "too_many_authentication_failures"
    f.check("b")  # another address is not affected
    now[0] += 59.5
    with pytest.raises(RateLimited) as exc:
        f.check("a")
    assert exc.value.retry_after_s == 0.5
    now[0] += 1
    f.check("a")  # a new window
    f.failed("a")
    f.check("a")


def test_known_keys_and_bounds() -> None:
    now = [0.0]
    f = AuthFailures(max_failures=1, window_s=60, known_ttl_s=10, size=2, clock=lambda: now[0])
    f.succeeded("h1")
    assert f.is_known("h1") and not f.is_known("h2") and not f.is_known(None)
    f.failed("x", "h1")  # a key refused after it was known is known no more
    assert not f.is_known("h1")
    f.succeeded("h2")
    now[0] = 11
    assert not f.is_known("h2")  # known for known_ttl_s only
    for addr in ("a", "b", "c"):  # size 2: the oldest address is forgotten
        f.failed(addr)
    f.check("a")
    with pytest.raises(RateLimited):
        f.check("c")
    AuthFailures(max_failures=0).check("a")  # 0: no limit
    off = AuthFailures(max_failures=0)
    off.failed("a")
    off.check("a")


class Body(BaseModel):
    name: str


async def test_auth_first_answers_before_the_body_is_read() -> None:
    """Catches: an admin route that reads and parses the body before checking the key (FastAPI
    reads a body parameter before it runs the route's dependencies): the ASGI receive channel
    must not be touched for a refused caller."""

    async def authenticate(token: str) -> str:
        if token != "sk-admin":
            raise AuthenticationFailed("Invalid admin key.")
        return "root"

    app = FastAPI()
    install_error_handlers(app, "test")

    @app.post("/admin/v1/things")
    async def create(body: Body, request: Request) -> dict[str, str]:
        return {"by": str(authenticated_principal(request)), "name": body.name}

    authenticate_first(app, "/admin/v1", authenticate, ServiceSettings(auth_max_failures=2))

    async def call(key: str | None) -> tuple[int, bool]:
        read = False
        sent: list[dict] = []

        async def receive() -> dict:
            nonlocal read
            read = True
            return {"type": "http.request", "body": b'{"name": "x"}', "more_body": False}

        async def send(message: dict) -> None:
            sent.append(message)

        headers = [(b"content-type", b"application/json")]
        if key:
            headers.append((b"authorization", f"Bearer {key}".encode()))
        scope = {"type": "http", "method": "POST", "path": "/admin/v1/things", "headers": headers,
                 "query_string": b"", "client": ("192.0.2.1", 1234), "server": ("t", 80), "scheme": "http",
                 "root_path": "", "http_version": "1.1", "asgi": {"version": "3.0"}}  # fmt: skip
        await app(scope, receive, send)
        return next(m["status"] for m in sent if m["type"] == "http.response.start"), read

    assert await call("sk-admin") == (200, True)
    assert await call("sk-wrong") == (401, False)
    assert await call(None) == (401, False)
    assert await call("sk-wrong") == (429, False)  # past 2 failures from this address
    assert await call("sk-admin") == (200, True)  # a key known good here still passes
