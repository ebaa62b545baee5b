"""The budget admin API (mounted under ``/admin/v1``): tenants, teams, users, API keys, limit
overrides and usage. Answers errors in OpenAI's shape, like the gateway.

Authorisation model:

- the root admin (``settings.admin_key_sha256``) sees and changes everything;
- a tenant admin (a key from ``POST /tenants/{id}/admin-keys``) sees and changes only its own
  tenant. Another tenant's object answers exactly the 404 of a non-existent id, so ids cannot
  be probed. Root-only operations answer 403, and so does anything that would let a tenant
  escape its plan: choosing a team's plan, touching the tenant scope's limits, or setting a
  limit above the plan's default for that scope level (tenant admins divide their plan among
  their teams, users and keys; they do not enlarge it).
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Generic, Literal, TypeVar
from zoneinfo import ZoneInfo

from fastapi import APIRouter, Depends, FastAPI, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from llmlab_common.catalog import MAX_LIMIT, Catalog, LimitSet, PlanBudget, ScopeName
from llmlab_common.errors import AuthenticationFailed, InvalidRequest, LLMLabError, NotFound, PermissionDenied
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, field_validator
from redis.asyncio import Redis
from starlette.exceptions import HTTPException as StarletteHTTPException

from llmlab_budget.directory import (
    UNLIMITED,
    Directory,
    KeyRecord,
    ScopeRef,
    TeamRecord,
    TenantRecord,
    UserRecord,
    not_found,
    parse_scope,
    validate_overrides,
)
from llmlab_budget.layout import Layout
from llmlab_budget.model import hash_key
from llmlab_budget.settings import BudgetSettings
from llmlab_budget.usage import read_usage
from llmlab_budget.windows import Windows

log = logging.getLogger(__name__)

T = TypeVar("T")

# -- request bodies ------------------------------------------------------------------------------

Name = Annotated[StrictStr, Field(min_length=1, max_length=200)]
# Strict: 1.0, true and "5" are refused rather than coerced; bounds per field come from LimitSet
# (checked again by validate_overrides, e.g. max_input_tokens >= 1).
LimitValue = Annotated[StrictInt, Field(ge=0, le=MAX_LIMIT)] | Literal["unlimited"]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TenantCreate(_Body):
    name: Name
    plan: StrictStr


class _NoNulls(_Body):
    """Optional fields that may be left out but not sent as null: an explicit null would read
    as "unset", which is never what a caller who typed it meant."""

    @field_validator("*", mode="before")
    @classmethod
    def _no_null(cls, value: object) -> object:
        if value is None:
            raise ValueError("null is not allowed; leave the field out instead")
        return value


class TenantPatch(_NoNulls):
    name: Name | None = None
    plan: StrictStr | None = None


class TeamCreate(_Body):
    name: Name
    plan: StrictStr | None = Field(default=None, description='Plan override; null or "" = the tenant\'s plan.')


class NameBody(_Body):
    name: Name


class LimitsPut(_NoNulls):
    """Any LimitSet field: a whole number, or "unlimited" to lift a plan default. Fields left
    out follow the plan. The body replaces the whole override set."""

    daily_tokens: LimitValue | None = None
    monthly_tokens: LimitValue | None = None
    max_input_tokens: LimitValue | None = None
    max_output_tokens: LimitValue | None = None
    rpm: LimitValue | None = None
    tpm: LimitValue | None = None
    max_concurrent: LimitValue | None = None


# -- responses -----------------------------------------------------------------------------------


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    error: ErrorDetail


class Page(BaseModel, Generic[T]):
    object: Literal["list"] = "list"
    data: list[T]


class TenantOut(BaseModel):
    id: str
    name: str
    plan: str
    created_at: int


class TeamOut(BaseModel):
    id: str
    tenant_id: str
    name: str
    plan: str | None = Field(description="The team's own plan; null = the tenant's.")
    effective_plan: str
    created_at: int


class UserOut(BaseModel):
    id: str
    tenant_id: str
    team_id: str
    name: str
    created_at: int


class KeyOut(BaseModel):
    id: str
    tenant_id: str
    team_id: str
    user_id: str
    name: str
    prefix: str = Field(description="The key's first characters, for recognising it; never usable.")
    created_at: int
    revoked_at: int | None
    replaced_by: str | None


class KeyCreatedOut(KeyOut):
    key: str = Field(description="The API key. Shown once: only its SHA-256 is stored.")


class AdminKeyCreatedOut(BaseModel):
    tenant_id: str
    name: str
    created_at: int
    key: str = Field(description="The tenant admin key. Shown once: only its SHA-256 is stored.")


class ReservePolicyOut(BaseModel):
    reserve_tokens: int
    min_output_tokens: int
    count_tools: bool
    on_short: Literal["clamp", "refuse"]


class LimitsOut(BaseModel):
    scope: ScopeName
    scope_id: str
    plan: str
    overrides: dict[str, int | Literal["unlimited"]]
    effective: LimitSet = Field(
        description="The plan's defaults for this scope level with the overrides; null = unlimited."
    )
    reserve_policy: ReservePolicyOut


class BudgetWindowOut(BaseModel):
    window: str
    ends_at: str
    used: int
    reserved: int
    limit: int | None
    remaining: int | None


class MinuteOut(BaseModel):
    window: int
    ends_at: str
    requests: int
    tokens: int
    rpm_limit: int | None
    tpm_limit: int | None


class ConcurrentOut(BaseModel):
    current: int
    limit: int | None


class UsageOut(BaseModel):
    scope: ScopeName
    scope_id: str
    plan: str
    day: BudgetWindowOut
    month: BudgetWindowOut
    minute: MinuteOut
    concurrent: ConcurrentOut


def _tenant_out(t: TenantRecord) -> TenantOut:
    return TenantOut(id=t.id, name=t.name, plan=t.plan, created_at=t.created_at)


def _team_out(t: TeamRecord, tenant_plan: str) -> TeamOut:
    return TeamOut(
        id=t.id,
        tenant_id=t.tenant_id,
        name=t.name,
        plan=t.plan or None,
        effective_plan=t.plan or tenant_plan,
        created_at=t.created_at,
    )


def _user_out(u: UserRecord) -> UserOut:
    return UserOut(id=u.id, tenant_id=u.tenant_id, team_id=u.team_id, name=u.name, created_at=u.created_at)


def _key_fields(k: KeyRecord) -> dict[str, Any]:
    return {
        "id": k.id,
        "tenant_id": k.tenant_id,
        "team_id": k.team_id,
        "user_id": k.user_id,
        "name": k.name,
        "prefix": k.prefix,
        "created_at": k.created_at,
        "revoked_at": k.revoked_at,
        "replaced_by": k.replaced_by,
    }


# -- auth ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AdminPrincipal:
    tenant_id: str | None  # None: the root admin

    @property
    def root(self) -> bool:
        return self.tenant_id is None

    @property
    def who(self) -> str:
        return "root" if self.tenant_id is None else f"tenant-admin:{self.tenant_id}"

    def require_root(self, action: str) -> None:
        if not self.root:
            raise PermissionDenied(f"Only the root admin can {action}.")

    def check(self, scope: ScopeName, obj_id: str, owner: str | None) -> None:
        """404 for a missing object and, identically, for another tenant's."""
        if owner is None or (self.tenant_id is not None and owner != self.tenant_id):
            raise not_found(scope, obj_id)


# -- errors --------------------------------------------------------------------------------------


def _error_response(err: LLMLabError) -> JSONResponse:
    return JSONResponse(err.to_openai(), status_code=err.status, headers=err.headers or None)


def _validation_error(errors: Sequence[Any]) -> InvalidRequest:
    """A FastAPI/pydantic validation failure as one clear message naming the field."""
    first = errors[0]
    loc = tuple(first.get("loc", ()))
    kind = first.get("type", "")
    if kind == "json_invalid":
        detail = first.get("ctx", {}).get("error", "")
        return InvalidRequest(f"Request body is not valid JSON: {detail}.", code="invalid_json")
    if loc in (("body",), ()):
        if kind == "missing":
            return InvalidRequest("A JSON object request body is required.", code="invalid_json")
        return InvalidRequest(
            "Request body must be a JSON object (with Content-Type: application/json).", code="invalid_json"
        )
    param = str(loc[1]) if loc[0] == "body" and len(loc) > 1 else ".".join(str(p) for p in loc)
    if kind == "extra_forbidden":
        return InvalidRequest(f"Unknown parameter: '{param}'.", param=param, code="unknown_parameter")
    if kind == "missing":
        return InvalidRequest(f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter")
    # A union (int | "unlimited") fails once per branch: say all of them, once each.
    same = [e for e in errors if tuple(e.get("loc", ()))[:2] == loc[:2]]
    msgs = list(dict.fromkeys(str(e.get("msg", "")).removeprefix("Value error, ") for e in same))
    return InvalidRequest(f"Invalid value for '{param}': {'; or '.join(msgs)}.", param=param, code="invalid_value")


def install_error_handlers(app: FastAPI) -> None:
    """Every error of the app as ``{"error": {message, type, param, code}}``."""

    @app.exception_handler(LLMLabError)
    async def _on_error(request: Request, exc: LLMLabError) -> JSONResponse:
        return _error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _on_invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _error_response(_validation_error(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def _on_http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        err: LLMLabError
        if exc.status_code == 404:
            err = NotFound(f"Unknown path {request.url.path}")
        elif exc.status_code == 405:
            err = InvalidRequest(
                f"Method {request.method} not allowed on {request.url.path}",
                code="method_not_allowed",
                headers=dict(exc.headers or {}),
            )
            err.status = 405
        else:
            err = LLMLabError(str(exc.detail), code=None, headers=dict(exc.headers or {}))
            err.status = exc.status_code
            err.type = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return _error_response(err)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return _error_response(LLMLabError("Internal error; see the budget service's logs."))


_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "Invalid request"},
    401: {"model": ErrorResponse, "description": "Missing or invalid admin key"},
    403: {"model": ErrorResponse, "description": "Not allowed for a tenant admin"},
    404: {"model": ErrorResponse, "description": "No such object (or another tenant's)"},
}


def admin_router(
    directory: Directory,
    catalog: Catalog,
    settings: BudgetSettings,
    redis: Redis,
    layout: Layout,
    clock: Callable[[], float] = time.time,
) -> APIRouter:
    router = APIRouter(responses=_ERRORS)
    bearer = HTTPBearer(auto_error=False, description="Root or tenant admin key")
    root_digest = settings.admin_key_sha256.lower().encode()
    tz = ZoneInfo(settings.timezone)
    d = directory

    async def authenticate(
        creds: HTTPAuthorizationCredentials | None = Security(bearer),
    ) -> AdminPrincipal:
        if creds is None or not creds.credentials:
            raise AuthenticationFailed(
                "Missing admin key: send 'Authorization: Bearer <admin key>'.", code="missing_api_key"
            )
        digest = hash_key(creds.credentials)
        if hmac.compare_digest(digest.encode(), root_digest):
            return AdminPrincipal(None)
        tenant_id = await d.admin_tenant_for_hash(digest)
        if tenant_id is None:
            raise AuthenticationFailed("Invalid admin key.")
        return AdminPrincipal(tenant_id)

    def audit(admin: AdminPrincipal, action: str, *args: object) -> None:
        log.info("admin %s: " + action, admin.who, *args)

    def plan_budget(plan: str) -> PlanBudget:
        found = catalog.plans.get(plan)
        if found is None:  # the catalog lost a plan still in use: an operator must fix it
            raise LLMLabError(f"Plan '{plan}' is not in the catalog.", code="unknown_plan")
        return found.budget

    async def visible_tenant(admin: AdminPrincipal, tenant_id: str) -> TenantRecord:
        admin.check("tenant", tenant_id, tenant_id)
        return await d.get_tenant(tenant_id)

    async def visible_team(admin: AdminPrincipal, team_id: str) -> TeamRecord:
        team = await d.get_team(team_id)
        admin.check("team", team_id, team.tenant_id)
        return team

    async def visible_user(admin: AdminPrincipal, user_id: str) -> UserRecord:
        user = await d.get_user(user_id)
        admin.check("user", user_id, user.tenant_id)
        return user

    async def visible_key(admin: AdminPrincipal, key_id: str) -> KeyRecord:
        key = await d.get_key(key_id)
        admin.check("key", key_id, key.tenant_id)
        return key

    async def visible_scope(admin: AdminPrincipal, scope: str, scope_id: str) -> ScopeRef:
        name = parse_scope(scope)
        ref = await d.scope_ref(name, scope_id)
        admin.check(name, scope_id, ref.tenant_id)
        return ref

    async def limits_out(ref: ScopeRef) -> LimitsOut:
        overrides = await d.overrides(ref.scope, ref.scope_id)
        budget = plan_budget(ref.plan)
        return LimitsOut(
            scope=ref.scope,
            scope_id=ref.scope_id,
            plan=ref.plan,
            overrides={f: UNLIMITED if v is None else v for f, v in overrides.model_dump(exclude_unset=True).items()},
            effective=budget.limits(ref.scope).merged(overrides),
            reserve_policy=ReservePolicyOut(
                reserve_tokens=budget.reserve_tokens,
                min_output_tokens=budget.min_output_tokens,
                count_tools=budget.count_tools,
                on_short=budget.on_short,
            ),
        )

    def tenant_admin_may_set(ref: ScopeRef, values: dict[str, int | None]) -> None:
        """Tenant admins may tighten their plan's limits, never lift them (see module doc)."""
        if ref.scope == "tenant":
            raise PermissionDenied("Only the root admin can change a tenant's own limits.")
        defaults = plan_budget(ref.plan).limits(ref.scope)
        for field, value in values.items():
            cap = getattr(defaults, field)
            if cap is not None and (value is None or value > cap):
                raise PermissionDenied(
                    f"'{field}' may not exceed the {ref.plan} plan's {ref.scope} limit of {cap}.", param=field
                )

    # -- tenants ---------------------------------------------------------------------------------
    @router.post("/tenants", status_code=201, tags=["tenants"], summary="Create a tenant (root)")
    async def create_tenant(body: TenantCreate, admin: AdminPrincipal = Depends(authenticate)) -> TenantOut:
        admin.require_root("create tenants")
        tenant = await d.create_tenant(body.name, body.plan)
        audit(admin, "created tenant %s (plan %s)", tenant.id, tenant.plan)
        return _tenant_out(tenant)

    @router.get("/tenants", tags=["tenants"], summary="List tenants (a tenant admin sees its own)")
    async def list_tenants(admin: AdminPrincipal = Depends(authenticate)) -> Page[TenantOut]:
        if admin.tenant_id is None:
            tenants = await d.list_tenants()
        else:
            tenants = [await d.get_tenant(admin.tenant_id)]
        return Page[TenantOut](data=[_tenant_out(t) for t in tenants])

    @router.get("/tenants/{tenant_id}", tags=["tenants"], summary="Get a tenant")
    async def get_tenant(tenant_id: str, admin: AdminPrincipal = Depends(authenticate)) -> TenantOut:
        return _tenant_out(await visible_tenant(admin, tenant_id))

    @router.patch("/tenants/{tenant_id}", tags=["tenants"], summary="Rename a tenant or change its plan (root)")
    async def update_tenant(
        tenant_id: str, body: TenantPatch, admin: AdminPrincipal = Depends(authenticate)
    ) -> TenantOut:
        admin.require_root("change tenants")
        fields = body.model_dump(exclude_unset=True)
        tenant = await d.update_tenant(tenant_id, name=fields.get("name"), plan=fields.get("plan"))
        audit(admin, "updated tenant %s (%s)", tenant_id, ", ".join(sorted(fields)) or "no change")
        return _tenant_out(tenant)

    @router.post(
        "/tenants/{tenant_id}/admin-keys",
        status_code=201,
        tags=["tenants"],
        summary="Create a tenant admin key (root); the key is shown once",
    )
    async def create_admin_key(
        tenant_id: str, body: NameBody, admin: AdminPrincipal = Depends(authenticate)
    ) -> AdminKeyCreatedOut:
        admin.require_root("create admin keys")
        rec, plaintext = await d.create_admin_key(tenant_id, body.name)
        audit(admin, "created admin key %r for tenant %s", rec.name, tenant_id)
        return AdminKeyCreatedOut(tenant_id=rec.tenant_id, name=rec.name, created_at=rec.created_at, key=plaintext)

    # -- teams -----------------------------------------------------------------------------------
    @router.post("/tenants/{tenant_id}/teams", status_code=201, tags=["teams"], summary="Create a team")
    async def create_team(tenant_id: str, body: TeamCreate, admin: AdminPrincipal = Depends(authenticate)) -> TeamOut:
        tenant = await visible_tenant(admin, tenant_id)
        if body.plan:
            admin.require_root("choose a team's plan")
        team = await d.create_team(tenant_id, body.name, body.plan)
        audit(admin, "created team %s in tenant %s (plan %s)", team.id, tenant_id, team.plan or "tenant's")
        return _team_out(team, tenant.plan)

    @router.get("/tenants/{tenant_id}/teams", tags=["teams"], summary="List a tenant's teams")
    async def list_teams(tenant_id: str, admin: AdminPrincipal = Depends(authenticate)) -> Page[TeamOut]:
        tenant = await visible_tenant(admin, tenant_id)
        teams = await d.list_teams(tenant_id)
        return Page[TeamOut](data=[_team_out(t, tenant.plan) for t in teams])

    @router.get("/teams/{team_id}", tags=["teams"], summary="Get a team")
    async def get_team(team_id: str, admin: AdminPrincipal = Depends(authenticate)) -> TeamOut:
        team = await visible_team(admin, team_id)
        return _team_out(team, (await d.get_tenant(team.tenant_id)).plan)

    # -- users -----------------------------------------------------------------------------------
    @router.post("/teams/{team_id}/users", status_code=201, tags=["users"], summary="Create a user in a team")
    async def create_user(team_id: str, body: NameBody, admin: AdminPrincipal = Depends(authenticate)) -> UserOut:
        await visible_team(admin, team_id)
        user = await d.create_user(team_id, body.name)
        audit(admin, "created user %s in team %s", user.id, team_id)
        return _user_out(user)

    @router.get("/teams/{team_id}/users", tags=["users"], summary="List a team's users")
    async def list_users(team_id: str, admin: AdminPrincipal = Depends(authenticate)) -> Page[UserOut]:
        await visible_team(admin, team_id)
        return Page[UserOut](data=[_user_out(u) for u in await d.list_users(team_id)])

    @router.get("/users/{user_id}", tags=["users"], summary="Get a user")
    async def get_user(user_id: str, admin: AdminPrincipal = Depends(authenticate)) -> UserOut:
        return _user_out(await visible_user(admin, user_id))

    # -- keys ------------------------------------------------------------------------------------
    @router.post(
        "/users/{user_id}/keys", status_code=201, tags=["keys"], summary="Create an API key; the key is shown once"
    )
    async def create_key(user_id: str, body: NameBody, admin: AdminPrincipal = Depends(authenticate)) -> KeyCreatedOut:
        await visible_user(admin, user_id)
        rec, plaintext = await d.create_key(user_id, body.name)
        audit(admin, "created key %s for user %s", rec.id, user_id)
        return KeyCreatedOut(**_key_fields(rec), key=plaintext)

    @router.get("/users/{user_id}/keys", tags=["keys"], summary="List a user's keys (never the keys themselves)")
    async def list_keys(user_id: str, admin: AdminPrincipal = Depends(authenticate)) -> Page[KeyOut]:
        await visible_user(admin, user_id)
        return Page[KeyOut](data=[KeyOut(**_key_fields(k)) for k in await d.list_keys(user_id)])

    @router.get("/keys/{key_id}", tags=["keys"], summary="Get a key's record")
    async def get_key(key_id: str, admin: AdminPrincipal = Depends(authenticate)) -> KeyOut:
        return KeyOut(**_key_fields(await visible_key(admin, key_id)))

    @router.post("/keys/{key_id}/revoke", tags=["keys"], summary="Revoke a key (idempotent)")
    async def revoke_key(key_id: str, admin: AdminPrincipal = Depends(authenticate)) -> KeyOut:
        await visible_key(admin, key_id)
        rec = await d.revoke_key(key_id)
        audit(admin, "revoked key %s", key_id)
        return KeyOut(**_key_fields(rec))

    @router.post(
        "/keys/{key_id}/rotate",
        status_code=201,
        tags=["keys"],
        summary="Replace a key: the old one is revoked, the new one is shown once",
    )
    async def rotate_key(key_id: str, admin: AdminPrincipal = Depends(authenticate)) -> KeyCreatedOut:
        await visible_key(admin, key_id)
        rec, plaintext = await d.rotate_key(key_id)
        audit(admin, "rotated key %s -> %s", key_id, rec.id)
        return KeyCreatedOut(**_key_fields(rec), key=plaintext)

    # -- limits and usage ------------------------------------------------------------------------
    @router.get("/limits/{scope}/{scope_id}", tags=["limits"], summary="Overrides and effective limits of a scope")
    async def get_limits(scope: str, scope_id: str, admin: AdminPrincipal = Depends(authenticate)) -> LimitsOut:
        return await limits_out(await visible_scope(admin, scope, scope_id))

    @router.put("/limits/{scope}/{scope_id}", tags=["limits"], summary="Replace a scope's limit overrides")
    async def put_limits(
        scope: str, scope_id: str, body: LimitsPut, admin: AdminPrincipal = Depends(authenticate)
    ) -> LimitsOut:
        ref = await visible_scope(admin, scope, scope_id)
        values = validate_overrides(body.model_dump(exclude_unset=True))
        if not admin.root:
            tenant_admin_may_set(ref, values)
        await d.set_overrides(ref.scope, scope_id, body.model_dump(exclude_unset=True))
        audit(admin, "set limits of %s %s: %s", ref.scope, scope_id, values)
        return await limits_out(ref)

    @router.delete(
        "/limits/{scope}/{scope_id}", tags=["limits"], summary="Clear a scope's overrides (back to the plan's)"
    )
    async def delete_limits(scope: str, scope_id: str, admin: AdminPrincipal = Depends(authenticate)) -> LimitsOut:
        ref = await visible_scope(admin, scope, scope_id)
        if not admin.root and ref.scope == "tenant":
            raise PermissionDenied("Only the root admin can change a tenant's own limits.")
        await d.clear_overrides(ref.scope, scope_id)
        audit(admin, "cleared limits of %s %s", ref.scope, scope_id)
        return await limits_out(ref)

    @router.get("/usage/{scope}/{scope_id}", tags=["usage"], summary="Current day/month/minute usage of a scope")
    async def get_usage(scope: str, scope_id: str, admin: AdminPrincipal = Depends(authenticate)) -> UsageOut:
        ref = await visible_scope(admin, scope, scope_id)
        overrides = await d.overrides(ref.scope, scope_id)
        effective = plan_budget(ref.plan).limits(ref.scope).merged(overrides)
        usage = await read_usage(redis, layout, ref.scope, scope_id, effective, Windows.at(clock(), tz))
        return UsageOut.model_validate({**usage, "plan": ref.plan})

    return router
