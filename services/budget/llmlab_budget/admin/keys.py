"""A user's API keys: created (shown once), listed (never the key), revoked, rotated."""

from __future__ import annotations

from fastapi import APIRouter

from llmlab_budget.admin.auth import Admin, Context
from llmlab_budget.admin.schemas import ERROR_RESPONSES, KeyCreatedOut, KeyOut, NameBody, Page, key_fields

router = APIRouter(tags=["keys"], responses=ERROR_RESPONSES)


@router.post("/users/{user_id}/keys", status_code=201, summary="Create an API key; the key is shown once")
async def create_key(user_id: str, body: NameBody, admin: Admin, ctx: Context) -> KeyCreatedOut:
    await ctx.visible_user(admin, user_id)
    rec, plaintext = await ctx.directory.create_key(user_id, body.name)
    admin.audit("created key %s for user %s", rec.id, user_id)
    return KeyCreatedOut(**key_fields(rec), key=plaintext)


@router.get("/users/{user_id}/keys", summary="List a user's keys (never the keys themselves)")
async def list_keys(user_id: str, admin: Admin, ctx: Context) -> Page[KeyOut]:
    await ctx.visible_user(admin, user_id)
    return Page[KeyOut](data=[KeyOut(**key_fields(k)) for k in await ctx.directory.list_keys(user_id)])


@router.get("/keys/{key_id}", summary="Get a key's record")
async def get_key(key_id: str, admin: Admin, ctx: Context) -> KeyOut:
    return KeyOut(**key_fields(await ctx.visible_key(admin, key_id)))


@router.post("/keys/{key_id}/revoke", summary="Revoke a key (idempotent)")
async def revoke_key(key_id: str, admin: Admin, ctx: Context) -> KeyOut:
    await ctx.visible_key(admin, key_id)
    rec = await ctx.directory.revoke_key(key_id)
    admin.audit("revoked key %s", key_id)
    return KeyOut(**key_fields(rec))


@router.post(
    "/keys/{key_id}/rotate", status_code=201, summary="Replace a key: the old one is revoked, the new one is shown once"
)
async def rotate_key(key_id: str, admin: Admin, ctx: Context) -> KeyCreatedOut:
    await ctx.visible_key(admin, key_id)
    rec, plaintext = await ctx.directory.rotate_key(key_id)
    admin.audit("rotated key %s -> %s", key_id, rec.id)
    return KeyCreatedOut(**key_fields(rec), key=plaintext)
