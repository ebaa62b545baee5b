"""Tenants (root only, but a tenant admin may read its own) and their admin keys."""

from __future__ import annotations

from fastapi import APIRouter

from llmlab_budget.admin.auth import Admin, Context
from llmlab_budget.admin.schemas import (
    ERROR_RESPONSES,
    AdminKeyCreatedOut,
    AdminKeyList,
    AdminKeyOut,
    NameBody,
    Page,
    TenantCreate,
    TenantOut,
    TenantPatch,
    tenant_out,
)
from llmlab_budget.directory import AdminKeyRecord

router = APIRouter(tags=["tenants"], responses=ERROR_RESPONSES)


@router.post("/tenants", status_code=201, summary="Create a tenant (root)")
async def create_tenant(body: TenantCreate, admin: Admin, ctx: Context) -> TenantOut:
    admin.require_root("create tenants")
    tenant = await ctx.directory.create_tenant(body.name, body.plan)
    admin.audit("created tenant %s (plan %s)", tenant.id, tenant.plan)
    return tenant_out(tenant)


@router.get("/tenants", summary="List tenants (a tenant admin sees its own)")
async def list_tenants(admin: Admin, ctx: Context) -> Page[TenantOut]:
    if admin.tenant_id is None:
        tenants = await ctx.directory.list_tenants()
    else:
        tenants = [await ctx.directory.get_tenant(admin.tenant_id)]
    return Page[TenantOut](data=[tenant_out(t) for t in tenants])


@router.get("/tenants/{tenant_id}", summary="Get a tenant")
async def get_tenant(tenant_id: str, admin: Admin, ctx: Context) -> TenantOut:
    return tenant_out(await ctx.visible_tenant(admin, tenant_id))


@router.patch("/tenants/{tenant_id}", summary="Rename a tenant or change its plan (root)")
async def update_tenant(tenant_id: str, body: TenantPatch, admin: Admin, ctx: Context) -> TenantOut:
    admin.require_root("change tenants")
    fields = body.model_dump(exclude_unset=True)
    tenant = await ctx.directory.update_tenant(tenant_id, name=fields.get("name"), plan=fields.get("plan"))
    admin.audit("updated tenant %s (%s)", tenant_id, ", ".join(sorted(fields)) or "no change")
    return tenant_out(tenant)


@router.post(
    "/tenants/{tenant_id}/admin-keys",
    status_code=201,
    summary="Create a tenant admin key (root); the key is shown once",
)
async def create_admin_key(tenant_id: str, body: NameBody, admin: Admin, ctx: Context) -> AdminKeyCreatedOut:
    admin.require_root("create admin keys")
    rec, plaintext = await ctx.directory.create_admin_key(tenant_id, body.name)
    admin.audit("created admin key %s (%r) for tenant %s", rec.id, rec.name, tenant_id)
    return AdminKeyCreatedOut(**_admin_key(rec).model_dump(), key=plaintext)


def _admin_key(rec: AdminKeyRecord) -> AdminKeyOut:
    return AdminKeyOut(
        id=rec.id, tenant_id=rec.tenant_id, name=rec.name, created_at=rec.created_at, revoked_at=rec.revoked_at
    )


@router.get("/tenants/{tenant_id}/admin-keys", summary="A tenant's admin keys (never the keys themselves)")
async def list_admin_keys(tenant_id: str, admin: Admin, ctx: Context) -> AdminKeyList:
    await ctx.visible_tenant(admin, tenant_id)
    return AdminKeyList(data=[_admin_key(r) for r in await ctx.directory.list_admin_keys(tenant_id)])


@router.post(
    "/tenants/{tenant_id}/admin-keys/{admin_key_id}/revoke",
    summary="Revoke a tenant admin key (root, or an admin of the same tenant): refused at once from then on",
)
async def revoke_admin_key(tenant_id: str, admin_key_id: str, admin: Admin, ctx: Context) -> AdminKeyOut:
    await ctx.visible_tenant(admin, tenant_id)
    rec = await ctx.directory.revoke_admin_key(tenant_id, admin_key_id)
    admin.audit("revoked admin key %s of tenant %s", admin_key_id, tenant_id)
    return _admin_key(rec)
