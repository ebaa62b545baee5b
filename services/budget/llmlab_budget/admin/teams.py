"""Teams of a tenant, and their users."""

from __future__ import annotations

from fastapi import APIRouter

from llmlab_budget.admin.auth import Admin, Context
from llmlab_budget.admin.schemas import (
    ERROR_RESPONSES,
    NameBody,
    Page,
    TeamCreate,
    TeamOut,
    UserOut,
    team_out,
    user_out,
)

router = APIRouter(responses=ERROR_RESPONSES)


@router.post("/tenants/{tenant_id}/teams", status_code=201, tags=["teams"], summary="Create a team")
async def create_team(tenant_id: str, body: TeamCreate, admin: Admin, ctx: Context) -> TeamOut:
    tenant = await ctx.visible_tenant(admin, tenant_id)
    if body.plan:
        admin.require_root("choose a team's plan")
    team = await ctx.directory.create_team(tenant_id, body.name, body.plan)
    admin.audit("created team %s in tenant %s (plan %s)", team.id, tenant_id, team.plan or "tenant's")
    return team_out(team, tenant.plan)


@router.get("/tenants/{tenant_id}/teams", tags=["teams"], summary="List a tenant's teams")
async def list_teams(tenant_id: str, admin: Admin, ctx: Context) -> Page[TeamOut]:
    tenant = await ctx.visible_tenant(admin, tenant_id)
    teams = await ctx.directory.list_teams(tenant_id)
    return Page[TeamOut](data=[team_out(t, tenant.plan) for t in teams])


@router.get("/teams/{team_id}", tags=["teams"], summary="Get a team")
async def get_team(team_id: str, admin: Admin, ctx: Context) -> TeamOut:
    team = await ctx.visible_team(admin, team_id)
    return team_out(team, (await ctx.directory.get_tenant(team.tenant_id)).plan)


@router.post("/teams/{team_id}/users", status_code=201, tags=["users"], summary="Create a user in a team")
async def create_user(team_id: str, body: NameBody, admin: Admin, ctx: Context) -> UserOut:
    await ctx.visible_team(admin, team_id)
    user = await ctx.directory.create_user(team_id, body.name)
    admin.audit("created user %s in team %s", user.id, team_id)
    return user_out(user)


@router.get("/teams/{team_id}/users", tags=["users"], summary="List a team's users")
async def list_users(team_id: str, admin: Admin, ctx: Context) -> Page[UserOut]:
    await ctx.visible_team(admin, team_id)
    return Page[UserOut](data=[user_out(u) for u in await ctx.directory.list_users(team_id)])


@router.get("/users/{user_id}", tags=["users"], summary="Get a user")
async def get_user(user_id: str, admin: Admin, ctx: Context) -> UserOut:
    return user_out(await ctx.visible_user(admin, user_id))
