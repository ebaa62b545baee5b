"""A scope's limit overrides (tenant admins may tighten their plan, never lift it, and never loosen
or delete what the root admin set: the two are kept apart and the tighter applies) and usage."""

from __future__ import annotations

from fastapi import APIRouter
from llmlab_common.errors import PermissionDenied

from llmlab_budget.admin.auth import Admin, AdminContext, Context
from llmlab_budget.admin.schemas import ERROR_RESPONSES, LimitsOut, LimitsPut, ReservePolicyOut, UsageOut
from llmlab_budget.directory import UNLIMITED, ScopeRef, validate_overrides
from llmlab_budget.usage import read_usage
from llmlab_budget.windows import Windows

router = APIRouter(responses=ERROR_RESPONSES)


async def limits_out(ctx: AdminContext, ref: ScopeRef) -> LimitsOut:
    overrides = await ctx.directory.overrides(ref.scope, ref.scope_id)
    budget = ctx.plan_budget(ref.plan)
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


def tenant_admin_may_set(ctx: AdminContext, ref: ScopeRef, values: dict[str, int | None]) -> None:
    """Tenant admins may tighten their plan's limits, never lift them (see :mod:`.auth`)."""
    if ref.scope == "tenant":
        raise PermissionDenied("Only the root admin can change a tenant's own limits.")
    defaults = ctx.plan_budget(ref.plan).limits(ref.scope)
    for field, value in values.items():
        cap = getattr(defaults, field)
        if cap is not None and (value is None or value > cap):
            raise PermissionDenied(
                f"'{field}' may not exceed the {ref.plan} plan's {ref.scope} limit of {cap}.", param=field
            )


@router.get("/limits/{scope}/{scope_id}", tags=["limits"], summary="Overrides and effective limits of a scope")
async def get_limits(scope: str, scope_id: str, admin: Admin, ctx: Context) -> LimitsOut:
    return await limits_out(ctx, await ctx.visible_scope(admin, scope, scope_id))


@router.put("/limits/{scope}/{scope_id}", tags=["limits"], summary="Replace a scope's limit overrides")
async def put_limits(scope: str, scope_id: str, body: LimitsPut, admin: Admin, ctx: Context) -> LimitsOut:
    ref = await ctx.visible_scope(admin, scope, scope_id)
    values = validate_overrides(body.model_dump(exclude_unset=True))
    if not admin.root:
        tenant_admin_may_set(ctx, ref, values)
    await ctx.directory.set_overrides(ref.scope, scope_id, body.model_dump(exclude_unset=True), root=admin.root)
    admin.audit("set limits of %s %s: %s", ref.scope, scope_id, values)
    return await limits_out(ctx, ref)


@router.delete("/limits/{scope}/{scope_id}", tags=["limits"], summary="Clear a scope's overrides (back to the plan's)")
async def delete_limits(scope: str, scope_id: str, admin: Admin, ctx: Context) -> LimitsOut:
    ref = await ctx.visible_scope(admin, scope, scope_id)
    if not admin.root and ref.scope == "tenant":
        raise PermissionDenied("Only the root admin can change a tenant's own limits.")
    await ctx.directory.clear_overrides(ref.scope, scope_id, root=admin.root)
    admin.audit("cleared limits of %s %s", ref.scope, scope_id)
    return await limits_out(ctx, ref)


@router.get("/usage/{scope}/{scope_id}", tags=["usage"], summary="Current day/month/minute usage of a scope")
async def get_usage(scope: str, scope_id: str, admin: Admin, ctx: Context) -> UsageOut:
    ref = await ctx.visible_scope(admin, scope, scope_id)
    overrides = await ctx.directory.overrides(ref.scope, scope_id)
    effective = ctx.plan_budget(ref.plan).limits(ref.scope).merged(overrides)
    usage = await read_usage(ctx.redis, ctx.layout, ref.scope, scope_id, effective, Windows.at(ctx.clock(), ctx.tz))
    return UsageOut.model_validate({**usage, "plan": ref.plan})
