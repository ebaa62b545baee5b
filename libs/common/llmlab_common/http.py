"""OpenAI's error shape for every web app of the project, installed by one call.

:func:`install_error_handlers` makes a FastAPI app answer each error as
``{"error": {"message", "type", "param", "code"}}`` with the error's status and headers: the
project's :class:`~llmlab_common.errors.LLMLabError`, FastAPI's body validation, the framework's
own 404/405 (and any other status it raises), and anything unexpected (a logged 500).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from llmlab_common import rules
from llmlab_common.authguard import AuthFailures, bearer_token, client_address, missing_key
from llmlab_common.errors import (
    AuthenticationFailed,
    HttpError,
    LLMLabError,
    MethodNotAllowed,
    NotFound,
    invalid_request,
)
from llmlab_common.logging import request_id_var
from llmlab_common.settings import ServiceSettings

log = logging.getLogger(__name__)


def new_request_id() -> str:
    return secrets.token_hex(12)


def error_response(err: LLMLabError, request_id: str | None = None) -> JSONResponse:
    """The error as a response; ``request_id`` (when given) goes out as ``X-Request-Id``."""
    headers = dict(err.headers)
    if request_id is not None:
        headers["X-Request-Id"] = request_id
    return JSONResponse(err.to_openai(), status_code=err.status, headers=headers or None)


def unexpected_error(service: str, exc: Exception, *, request_ids: bool = False, where: str = "") -> JSONResponse:
    """An exception nobody handled: logged (with ``where`` it happened), answered as a 500 in OpenAI's shape."""
    log.error("unhandled error%s", f" on {where}" if where else "", exc_info=exc)
    err = LLMLabError(f"Internal error; see the {service} logs.")
    return error_response(err, (request_id_var.get() or new_request_id()) if request_ids else None)


def install_error_handlers(app: FastAPI, service: str, *, request_ids: bool = False) -> None:
    """Answer every error of ``app`` in OpenAI's shape. With ``request_ids`` every error also
    carries ``X-Request-Id``: the request's own (set in the logging context when it was accepted),
    else a new one, as the gateway's responses do."""

    def respond(err: LLMLabError) -> JSONResponse:
        return error_response(err, (request_id_var.get() or new_request_id()) if request_ids else None)

    @app.exception_handler(LLMLabError)
    async def _on_error(request: Request, exc: LLMLabError) -> JSONResponse:
        return respond(exc)

    @app.exception_handler(RequestValidationError)
    async def _on_invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return respond(invalid_request(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def _on_http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        headers = dict(exc.headers or {})
        err: LLMLabError
        if exc.status_code == 404:
            err = NotFound(f"Unknown path {request.url.path}")
        elif exc.status_code == 405:
            err = MethodNotAllowed(f"Method {request.method} not allowed on {request.url.path}", headers=headers)
        else:
            err = HttpError(exc.status_code, str(exc.detail), headers=headers)
        return respond(err)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        return unexpected_error(service, exc, request_ids=request_ids, where=f"{request.method} {request.url.path}")


Scope = dict[str, Any]
ASGIApp = Callable[[Scope, Callable[..., Awaitable[Any]], Callable[..., Awaitable[Any]]], Awaitable[None]]


class AuthFirst:
    """ASGI middleware: requests under ``prefix`` are authenticated from their headers before
    the application (and so the body) sees them. ``authenticate(token)`` returns the caller's
    principal or raises an :class:`LLMLabError` (401, 403); the principal is left in the request
    state as ``state.principal`` for the routes' dependencies. Failures count against the
    client's address (:class:`AuthFailures`)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        prefix: str,
        authenticate: Callable[[str], Awaitable[object]],
        failures: AuthFailures,
        trusted_hops: int = 0,
        what: str = "admin key",
    ) -> None:
        self.app, self.prefix, self.authenticate = app, prefix, authenticate
        self.failures, self.trusted_hops, self.what = failures, trusted_hops, what

    async def __call__(
        self, scope: Scope, receive: Callable[..., Awaitable[Any]], send: Callable[..., Awaitable[Any]]
    ) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(self.prefix):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        client = scope.get("client")
        address = client_address(client[0] if client else None, headers.get("x-forwarded-for"), self.trusted_hops)
        token = bearer_token(headers.get("authorization"))
        sha = rules.hash_key(token) if token else None
        try:
            if not self.failures.is_known(sha):
                self.failures.check(address)
            if token is None:
                raise missing_key(self.what)
            principal = await self.authenticate(token)
        except LLMLabError as err:
            if isinstance(err, AuthenticationFailed):
                self.failures.failed(address, sha)
            await error_response(err)(scope, receive, send)
            return
        assert sha is not None
        self.failures.succeeded(sha)
        scope.setdefault("state", {})["principal"] = principal
        await self.app(scope, receive, send)


def authenticate_first(
    app: FastAPI,
    prefix: str,
    authenticate: Callable[[str], Awaitable[object]],
    settings: ServiceSettings,
    what: str = "admin key",
) -> None:
    """Install :class:`AuthFirst` on ``app`` for the routes under ``prefix``, with the service's
    limit on authentication failures and its trusted proxies."""
    app.add_middleware(
        AuthFirst,
        prefix=prefix.rstrip("/") + "/",
        authenticate=authenticate,
        failures=AuthFailures(settings.auth_max_failures, settings.auth_failure_window_s),
        trusted_hops=settings.trusted_proxy_hops,
        what=what,
    )


def authenticated_principal(request: Request) -> object:
    """The principal :class:`AuthFirst` authenticated for this request (401 when none did: the
    route is outside the middleware's prefix, a wiring bug that must not serve anyone)."""
    principal = getattr(request.state, "principal", None)
    if principal is None:
        raise AuthenticationFailed("Not authenticated.")
    return principal
