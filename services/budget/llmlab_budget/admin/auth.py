"""Who calls the admin API and what they may see.

- the root admin (``settings.admin_key_sha256``) sees and changes everything;
- a tenant admin (a key from ``POST /tenants/{id}/admin-keys``) sees and changes only its own
  tenant. Another tenant's object answers exactly the 404 of a non-existent id, so ids cannot
  be probed. Root-only operations answer 403, and so does anything that would let a tenant
  escape its plan: choosing a team's plan, touching the tenant scope's limits, or setting a
  limit above the plan's default for that scope level (tenant admins divide their plan among
  their teams, users and keys; they do not enlarge it).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated
from zoneinfo import ZoneInfo

from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from llmlab_common import rules
from llmlab_common.catalog import Catalog, PlanBudget, ScopeName
from llmlab_common.codes import Code
from llmlab_common.errors import AuthenticationFailed, LLMLabError, PermissionDenied
from llmlab_common.http import authenticated_principal
from redis.asyncio import Redis

from llmlab_budget.directory import (
    Directory,
    KeyRecord,
    ScopeRef,
    TeamRecord,
    TenantRecord,
    UserRecord,
    not_found,
    parse_scope,
)
from llmlab_budget.layout import Layout
from llmlab_budget.settings import BudgetSettings

log = logging.getLogger(__name__)


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

    def audit(self, action: str, *args: object) -> None:
        log.info("admin %s: " + action, self.who, *args)


@dataclass(frozen=True)
class AdminContext:
    """What the admin routes work on (set on ``app.state.budget_admin`` by :func:`mount_admin_api`)."""

    directory: Directory
    catalog: Catalog
    settings: BudgetSettings
    redis: Redis
    layout: Layout
    clock: Callable[[], float] = time.time
    tz: ZoneInfo = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tz", ZoneInfo(self.settings.timezone))

    def plan_budget(self, plan: str) -> PlanBudget:
        found = self.catalog.plans.get(plan)
        if found is None:  # the catalog lost a plan still in use: an operator must fix it
            raise LLMLabError(f"Plan '{plan}' is not in the catalog.", code=Code.UNKNOWN_PLAN)
        return found.budget

    async def visible_tenant(self, admin: AdminPrincipal, tenant_id: str) -> TenantRecord:
        admin.check("tenant", tenant_id, tenant_id)
        return await self.directory.get_tenant(tenant_id)

    async def visible_team(self, admin: AdminPrincipal, team_id: str) -> TeamRecord:
        team = await self.directory.get_team(team_id)
        admin.check("team", team_id, team.tenant_id)
        return team

    async def visible_user(self, admin: AdminPrincipal, user_id: str) -> UserRecord:
        user = await self.directory.get_user(user_id)
        admin.check("user", user_id, user.tenant_id)
        return user

    async def visible_key(self, admin: AdminPrincipal, key_id: str) -> KeyRecord:
        key = await self.directory.get_key(key_id)
        admin.check("key", key_id, key.tenant_id)
        return key

    async def visible_scope(self, admin: AdminPrincipal, scope: str, scope_id: str) -> ScopeRef:
        name = parse_scope(scope)
        ref = await self.directory.scope_ref(name, scope_id)
        admin.check(name, scope_id, ref.tenant_id)
        return ref


def _context(request: Request) -> AdminContext:
    ctx: AdminContext = request.app.state.budget_admin
    return ctx


Context = Annotated[AdminContext, Depends(_context)]

_bearer = HTTPBearer(auto_error=False, description="Root or tenant admin key")


async def authenticate_admin(ctx: AdminContext, token: str) -> AdminPrincipal:
    """The root admin or a tenant admin, from the bearer token alone (run by
    :class:`llmlab_common.http.AuthFirst` before the request's body is read)."""
    if rules.key_matches(token, ctx.settings.admin_key_sha256):
        return AdminPrincipal(None)
    tenant_id = await ctx.directory.admin_tenant_for_hash(rules.hash_key(token))
    if tenant_id is None:
        raise AuthenticationFailed("Invalid admin key.")
    return AdminPrincipal(tenant_id)


async def _authenticate(request: Request, _: HTTPAuthorizationCredentials | None = Security(_bearer)) -> AdminPrincipal:
    # Authenticated by the AuthFirst middleware (mount_admin_api installs it); the Security
    # parameter documents the scheme in the OpenAPI document.
    principal = authenticated_principal(request)
    assert isinstance(principal, AdminPrincipal)
    return principal


Admin = Annotated[AdminPrincipal, Depends(_authenticate)]
