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


__all__ = ["AdminContext", "mount_admin_api"]
