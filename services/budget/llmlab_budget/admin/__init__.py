"""The budget admin API (mounted under ``/admin/v1``): tenants, teams, users, API keys, limit
overrides and usage, answering errors in OpenAI's shape like the gateway. Who may do what is in
:mod:`llmlab_budget.admin.auth`; bodies and responses in :mod:`llmlab_budget.admin.schemas`; the
routes, one module per resource."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI

from llmlab_budget.admin import keys, limits, teams, tenants
from llmlab_budget.admin.auth import AdminContext

router = APIRouter()
for _module in (tenants, teams, keys, limits):
    router.include_router(_module.router)


def mount_admin_api(app: FastAPI, ctx: AdminContext, prefix: str = "/admin/v1") -> None:
    app.state.budget_admin = ctx
    app.include_router(router, prefix=prefix)


__all__ = ["AdminContext", "mount_admin_api"]
