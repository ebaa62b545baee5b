"""The budget admin API (mounted under ``/admin/v1``): tenants, teams, users, API keys, limit
overrides and usage, answering errors in OpenAI's shape like the gateway. Who may do what is in
:mod:`llmlab_budget.admin.auth`; bodies and responses in :mod:`llmlab_budget.admin.schemas`; the
routes, one module per resource."""

from __future__ import annotations

import functools
from typing import Any

from fastapi import APIRouter, FastAPI
from llmlab_common.http import authenticate_first

from llmlab_budget.admin import keys, limits, teams, tenants
from llmlab_budget.admin.auth import AdminContext, authenticate_admin

router = APIRouter()
for _module in (tenants, teams, keys, limits):
    router.include_router(_module.router)


def mount_admin_api(app: FastAPI, ctx: AdminContext, prefix: str = "/admin/v1") -> None:
    """The routes, and the middleware that authenticates them from the headers first."""
    app.state.budget_admin = ctx
    app.include_router(router, prefix=prefix)
    authenticate_first(app, prefix, functools.partial(authenticate_admin, ctx), ctx.settings)
    _document_plans(app, sorted(ctx.catalog.plans))
    _document_links(app, prefix)


# Bodies whose "plan" must name a catalog plan (TeamCreate also takes "" for the tenant's plan).
_PLAN_FIELDS = {"TenantCreate": [], "TenantPatch": [], "TeamCreate": [""]}


def _document_plans(app: FastAPI, plans: list[str]) -> None:
    """The plans come from the catalog, not the code: put them in the OpenAPI document as the
    enum of every "plan" field, so the document says exactly which plans are accepted."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = generate()
        components = schema.get("components", {}).get("schemas", {})
        for name, extra in _PLAN_FIELDS.items():
            prop = components.get(name, {}).get("properties", {}).get("plan")
            if prop is None:
                continue
            for branch in prop.get("anyOf", [prop]):
                if branch.get("type") == "string":
                    branch["enum"] = [*plans, *extra]
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


# OpenAPI links: the id a creation returns is what these operations take (a client generator or a
# stateful fuzzer follows them: create a tenant, then its teams, users, keys...). Each: the
# creating operation, then (operation, its parameters: "$id" is the created object's id,
# "$path.<name>" the creating request's path parameter, anything else a constant).
_LINKS: dict[str, list[tuple[str, dict[str, str]]]] = {
    "POST /tenants": [
        ("GET /tenants/{tenant_id}", {"tenant_id": "$id"}),
        ("PATCH /tenants/{tenant_id}", {"tenant_id": "$id"}),
        ("POST /tenants/{tenant_id}/teams", {"tenant_id": "$id"}),
        ("GET /tenants/{tenant_id}/teams", {"tenant_id": "$id"}),
        ("POST /tenants/{tenant_id}/admin-keys", {"tenant_id": "$id"}),
        ("GET /tenants/{tenant_id}/admin-keys", {"tenant_id": "$id"}),
        ("GET /usage/{scope}/{scope_id}", {"scope": "tenant", "scope_id": "$id"}),
    ],
    "POST /tenants/{tenant_id}/admin-keys": [
        (
            "POST /tenants/{tenant_id}/admin-keys/{admin_key_id}/revoke",
            {"tenant_id": "$path.tenant_id", "admin_key_id": "$id"},
        ),
    ],
    "POST /tenants/{tenant_id}/teams": [
        ("GET /teams/{team_id}", {"team_id": "$id"}),
        ("POST /teams/{team_id}/users", {"team_id": "$id"}),
        ("GET /teams/{team_id}/users", {"team_id": "$id"}),
        ("PUT /limits/{scope}/{scope_id}", {"scope": "team", "scope_id": "$id"}),
    ],
    "POST /teams/{team_id}/users": [
        ("GET /users/{user_id}", {"user_id": "$id"}),
        ("POST /users/{user_id}/keys", {"user_id": "$id"}),
        ("GET /users/{user_id}/keys", {"user_id": "$id"}),
        ("PUT /limits/{scope}/{scope_id}", {"scope": "user", "scope_id": "$id"}),
        ("GET /limits/{scope}/{scope_id}", {"scope": "user", "scope_id": "$id"}),
        ("DELETE /limits/{scope}/{scope_id}", {"scope": "user", "scope_id": "$id"}),
        ("GET /usage/{scope}/{scope_id}", {"scope": "user", "scope_id": "$id"}),
    ],
    "POST /users/{user_id}/keys": [
        ("GET /keys/{key_id}", {"key_id": "$id"}),
        ("POST /keys/{key_id}/revoke", {"key_id": "$id"}),
        ("POST /keys/{key_id}/rotate", {"key_id": "$id"}),
        ("PUT /limits/{scope}/{scope_id}", {"scope": "key", "scope_id": "$id"}),
    ],
}


def _document_links(app: FastAPI, prefix: str) -> None:
    """Put :data:`_LINKS` in the OpenAPI document, on each creation's 201 response."""
    generate = app.openapi

    def value(v: str) -> str:
        if v == "$id":
            return "$response.body#/id"
        if v.startswith("$path."):
            return "$request.path." + v.removeprefix("$path.")
        return v

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = generate()
        paths = schema["paths"]

        def op(label: str) -> dict[str, Any]:
            method, path = label.split(" ", 1)
            op_: dict[str, Any] = paths[prefix + path][method.lower()]
            return op_

        for source, targets in _LINKS.items():
            created = op(source)["responses"]["201"]
            created["links"] = {
                op(target)["operationId"]: {
                    "operationId": op(target)["operationId"],
                    "parameters": {k: value(v) for k, v in params.items()},
                }
                for target, params in targets
            }
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


__all__ = ["AdminContext", "mount_admin_api"]
