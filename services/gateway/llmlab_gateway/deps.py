"""What the gateway's routes depend on: the resources its lifespan opened (:class:`Gateway`, a
FastAPI dependency) and the small readers of the HTTP request (API key, routing headers, body
with its size limit). Every reader raises :class:`~llmlab_common.errors.LLMLabError`s, which the
routes record before answering."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request
from llmlab_common import rules
from llmlab_common.authguard import AuthFailures, bearer_token, client_address
from llmlab_common.codes import Code
from llmlab_common.errors import AuthenticationFailed, InvalidRequest, PayloadTooLarge
from llmlab_routing.config import CatalogHolder

from llmlab_gateway.auth import AdmittedKeys, Admitter, RefusedKeys, require_key
from llmlab_gateway.metrics import GatewayMetrics
from llmlab_gateway.service import CompletionService, RouteHints
from llmlab_gateway.settings import GatewaySettings


@dataclass(frozen=True)
class Gateway:
    """Everything a route needs, opened by the app's lifespan."""

    settings: GatewaySettings
    holder: CatalogHolder
    admitter: Admitter
    service: CompletionService
    metrics: GatewayMetrics
    refused_keys: RefusedKeys = field(default_factory=RefusedKeys)
    admitted_keys: AdmittedKeys = field(default_factory=AdmittedKeys)
    auth_failures: AuthFailures = field(default_factory=AuthFailures)

    async def authenticate_first(self, request: Request, *, known_suffices: bool) -> tuple[str, str]:
        """The caller's key and its SHA-256, authenticated from the headers alone, before any
        body is read. An address past its authentication failures gets 429 and a key refused
        moments ago 401, both without a budget round trip. ``known_suffices``: a key that
        authenticated in this process in the last minute skips the round trip (a completion's
        reserve checks the key again, revocation included, so nothing is taken on trust).
        Every 401 counts against the client's address."""
        address = request_address(request, self.settings.trusted_proxy_hops)
        key = bearer_key(request)
        sha = rules.hash_key(key) if key else None
        if known_suffices and self.auth_failures.is_known(sha):
            assert key is not None and sha is not None
            return key, sha
        try:
            self.auth_failures.check(address)
            key = require_key(key)
            assert sha is not None
            if sha in self.refused_keys:
                raise AuthenticationFailed("Incorrect API key provided.")
            await self.admitter.authenticate(key)
        except AuthenticationFailed:
            self.auth_failed(request, sha)
            raise
        self.auth_failures.succeeded(sha)
        return key, sha

    def auth_failed(self, request: Request, key_sha256: str | None) -> None:
        """A 401 (here or at the reserve): the key is remembered as refused and no longer known
        good, and the failure counts against the client's address."""
        address = request_address(request, self.settings.trusted_proxy_hops)
        self.auth_failures.failed(address, key_sha256)
        if key_sha256 is not None:
            self.refused_keys.add(key_sha256)

    def require_model(self, name: str) -> None:
        """404 unless a deployment serves the name or it is a routing alias (auto, fast, cheap, best)."""
        current = self.holder.current
        if name not in current.routing.aliases:
            current.catalog.require(name)


async def _gateway(request: Request) -> Gateway:
    # async: FastAPI runs a sync dependency in its thread pool, a thread hop per request.
    gw: Gateway = request.app.state.gateway
    return gw


GatewayDep = Annotated[Gateway, Depends(_gateway)]


def request_address(request: Request, trusted_proxy_hops: int) -> str:
    """The client's address, for counting its authentication failures (authguard.client_address)."""
    peer = request.client.host if request.client else None
    return client_address(peer, request.headers.get("x-forwarded-for"), trusted_proxy_hops)


def bearer_key(request: Request) -> str | None:
    return bearer_token(request.headers.get("authorization"))


def _float_header(request: Request, name: str, lo: float, hi: float) -> float | None:
    raw = request.headers.get(name)
    if raw is None:
        return None
    try:
        v = float(raw)
    except ValueError:
        v = float("nan")
    if not lo <= v <= hi:
        raise InvalidRequest(f"Header {name} must be a number in [{lo}, {hi}], got {raw!r}.", code=Code.INVALID_HEADER)
    return v


def route_hints(request: Request) -> RouteHints:
    """Optional per-request routing constraints; they can only tighten the plan's."""
    return RouteHints(
        slo_class=request.headers.get("x-llmlab-slo-class"),
        quality_floor=_float_header(request, "x-llmlab-quality-floor", 0.0, 1.0),
        max_cost_usd=_float_header(request, "x-llmlab-max-cost-usd", 1e-12, 1e6),
        policy=request.headers.get("x-llmlab-route-policy"),
    )


async def read_body(request: Request, limit: int) -> bytes:
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
