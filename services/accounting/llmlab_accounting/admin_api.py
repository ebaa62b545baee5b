"""Read-only SQL over the store, for users of the embedded mode (chdb: only this process may open
the directory). Admin-authenticated (the SHA-256 of the admin key is configured, never the key)."""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, FastAPI, Request, Security
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from llmlab_common import rules
from llmlab_common.codes import Code
from llmlab_common.errors import AuthenticationFailed, InvalidRequest, error_responses
from llmlab_common.http import authenticate_first, authenticated_principal
from pydantic import BaseModel, ConfigDict, Field

from llmlab_accounting.attribution import periods_covering
from llmlab_accounting.ports import Store
from llmlab_accounting.settings import AccountingSettings

log = logging.getLogger(__name__)

_COMMENTS = re.compile(r"--[^\n]*|/\*.*?\*/", re.S)
_READ_STATEMENT = re.compile(r"^\s*(SELECT|WITH)\b", re.I)
# Quoted text (string literals, quoted identifiers): searched for keywords with it blanked out.
_QUOTED = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|`[^`]*`", re.S)
# Writes a SELECT or WITH can still carry: an INSERT after a WITH clause, a result written to a
# file on the store's host (readonly=1 does not refuse INTO OUTFILE).
_WRITES = re.compile(r"\bINSERT\b|\bINTO\s+OUTFILE\b", re.I)


class QueryRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    sql: str = Field(min_length=1, max_length=100_000)
    # ClickHouse server-side parameters: ``{name:Type}`` placeholders in the SQL.
    parameters: dict[str, Any] | None = None


class AttributeRequest(BaseModel):
    """Attribute GPU time now for [start, end) (epoch seconds; end defaults to now), period by
    period, instead of waiting for the loop (``attribution_lag_s`` after each period closes)."""

    model_config = ConfigDict(extra="forbid")
    # Strict: a JSON true is not the time 1.0 (the document says number; fuzz of 5d84aa5 sent {"end": true}).
    start: float = Field(gt=0, strict=True)
    end: float | None = Field(default=None, gt=0, strict=True)


class AttributeResponse(BaseModel):
    periods: int
    gpu_cost_usd: float  # the workers' cost over the periods (rate × time)
    attributed_usd: float  # what the periods' attempts (and standby workers) carry


class QueryResponse(BaseModel):
    columns: list[str]
    types: list[str]
    rows: list[list[Any]]


def check_read_only(sql: str) -> str:
    """One SELECT (or WITH ... SELECT) statement that writes nowhere. ClickHouse's ``readonly=1``
    on a client of the query's own is the real guard (:meth:`ClickHouseStore.query_isolated`);
    this check gives a clear 400 first, and refuses what readonly=1 lets through (INTO OUTFILE)."""
    body = _COMMENTS.sub(" ", sql).strip().rstrip(";").strip()
    bare = _QUOTED.sub("''", body)
    if ";" in bare:
        raise InvalidRequest("Send one statement per query.", code=Code.MULTIPLE_STATEMENTS)
    if not _READ_STATEMENT.match(bare) or _WRITES.search(bare):
        raise InvalidRequest("Only SELECT queries are allowed.", code=Code.READ_ONLY)
    return body


# Attribution of one period [t0, t1), blocking: returns (GPU cost, attributed cost) of the period.
AttributePeriod = Callable[[float, float], tuple[float, float]]
MAX_ATTRIBUTE_PERIODS = 1440  # one day of minute periods per call


ERRORS = error_responses(
    {
        400: "Invalid request, or a statement ClickHouse refused (its message)",
        401: "Missing or invalid admin key",
        429: "Too many authentication failures from this address (Retry-After)",
    }
)


def mount_admin_api(
    app: FastAPI, store: Store, settings: AccountingSettings, attribute: AttributePeriod, prefix: str = "/admin/v1"
) -> None:
    """The routes, and the middleware that authenticates them from the headers first."""

    async def authenticate(token: str) -> str:
        if not rules.key_matches(token, settings.admin_key_sha256):
            raise AuthenticationFailed("Invalid admin key.")
        return "root"

    app.include_router(admin_router(store, settings, attribute), prefix=prefix)
    authenticate_first(app, prefix, authenticate, settings)


def admin_router(store: Store, settings: AccountingSettings, attribute: AttributePeriod) -> APIRouter:
    router = APIRouter()
    bearer = HTTPBearer(auto_error=False, description="Admin key")

    async def authenticate(request: Request, _: HTTPAuthorizationCredentials | None = Security(bearer)) -> None:
        # Authenticated by the AuthFirst middleware (mount_admin_api); Security documents the scheme.
        authenticated_principal(request)

    @router.post("/query", response_model=QueryResponse, responses=ERRORS)
    async def query(body: QueryRequest, _: None = Security(authenticate)) -> JSONResponse:
        sql = check_read_only(body.sql)
        try:
            result = await asyncio.to_thread(
                store.query_isolated,
                sql,
                body.parameters,
                max_rows=settings.query_max_rows,
                timeout_s=settings.query_timeout_s,
                max_memory_bytes=settings.query_max_memory_bytes,
            )
        except Exception as exc:  # ClickHouse's own message (syntax, unknown column, readonly)
            raise InvalidRequest(str(exc).strip()[:2000], code=Code.QUERY_FAILED) from exc
        log.info("admin query: %d rows", len(result.rows))
        # ClickHouse returns nan for an aggregate over no rows (quantileIf with nothing matching);
        # JSON has no nan: send null, as ClickHouse's own JSON output does.
        rows = [[None if isinstance(v, float) and not math.isfinite(v) else v for v in row] for row in result.rows]
        return JSONResponse(jsonable_encoder({"columns": result.columns, "types": result.types, "rows": rows}))

    @router.post("/attribute", response_model=AttributeResponse, responses=ERRORS)
    async def attribute_now(body: AttributeRequest, _: None = Security(authenticate)) -> AttributeResponse:
        end = min(body.end or time.time(), time.time())
        periods = periods_covering(body.start, end, settings.attribution_period_s)
        if len(periods) > MAX_ATTRIBUTE_PERIODS:
            raise InvalidRequest(
                f"{len(periods)} periods asked; at most {MAX_ATTRIBUTE_PERIODS} per call", code=Code.INVALID_VALUE
            )
        cost = attributed = 0.0
        for t0, t1 in periods:
            c, a = await asyncio.to_thread(attribute, t0, t1)
            cost, attributed = cost + c, attributed + a
        log.info("attributed %d periods on request", len(periods))
        return AttributeResponse(periods=len(periods), gpu_cost_usd=cost, attributed_usd=attributed)

    return router
