"""The identity store against real Redis (127.0.0.1:6379), each test under its own key prefix."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from llmlab_budget.directory import ADMIN_KEY_PREFIX, Directory
from llmlab_budget.layout import Layout
from llmlab_budget.model import API_KEY_PREFIX, DISPLAY_PREFIX_LEN, effective_limits
from llmlab_common.catalog import LimitSet, ScopeName, load_catalog
from llmlab_common.errors import InvalidRequest, NotFound
from llmlab_common.rules import hash_key
from redis.asyncio import Redis

pytestmark = pytest.mark.integration

CATALOG = load_catalog(Path(__file__).resolve().parents[3] / "configs" / "catalog.yaml")
KEY_FIELDS = {"tenant_id", "team_id", "user_id", "name", "prefix", "sha256", "created_at", "revoked_at", "replaced_by"}


class Clock:
    """Advances one second per reading, so timestamps of successive writes differ."""

    def __init__(self, start: float = 1_760_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        self.now += 1
        return self.now


@pytest.fixture
async def redis() -> AsyncIterator[Redis]:
    # Bytes responses here (decode_responses=False); the admin API tests use str responses.
    client = Redis.from_url("redis://127.0.0.1:6379/0")
    yield client
    await client.aclose()


@pytest.fixture
async def layout(redis: Redis) -> AsyncIterator[Layout]:
    layout = Layout(f"test_{uuid.uuid4().hex}:bud")
    yield layout
    keys = [k async for k in redis.scan_iter(match=layout.all_keys, count=1000)]
    if keys:
        await redis.delete(*keys)


@pytest.fixture
def directory(redis: Redis, layout: Layout) -> Directory:
    return Directory(redis, layout, CATALOG, clock=Clock())


def _d(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def dump(redis: Redis, layout: Layout) -> dict[str, Any]:
    """Every key of the prefix with its value, for before/after comparisons and secret scans."""
    out: dict[str, Any] = {}
    async for raw in redis.scan_iter(match=layout.all_keys, count=1000):
        key, kind = _d(raw), _d(await redis.type(raw))
        if kind == "string":
            out[key] = _d(await redis.get(raw))
        elif kind == "hash":
            out[key] = {_d(k): _d(v) for k, v in (await redis.hgetall(raw)).items()}
        elif kind == "set":
            out[key] = sorted(_d(m) for m in await redis.smembers(raw))
        else:
            out[key] = f"<{kind}>"
    return out


async def org(d: Directory) -> dict[str, Any]:
    tenant = await d.create_tenant("Acme", "free")
    team = await d.create_team(tenant.id, "research")
    pro_team = await d.create_team(tenant.id, "sales", plan="pro")
    user = await d.create_user(team.id, "ada")
    pro_user = await d.create_user(pro_team.id, "bob")
    key, plain = await d.create_key(user.id, "laptop")
    pro_key, pro_plain = await d.create_key(pro_user.id, "ci")
    return {
        "tenant": tenant,
        "team": team,
        "pro_team": pro_team,
        "user": user,
        "pro_user": pro_user,
        "key": key,
        "plain": plain,
        "pro_key": pro_key,
        "pro_plain": pro_plain,
    }


async def test_create_and_resolve_identity(directory: Directory, redis: Redis, layout: Layout) -> None:
    o = await org(directory)
    ident = await directory.identity_for_key_hash(hash_key(o["plain"]))
    assert ident is not None
    assert (ident.tenant_id, ident.team_id, ident.user_id, ident.key_id) == (
        o["tenant"].id,
        o["team"].id,
        o["user"].id,
        o["key"].id,
    )
    assert ident.plan == "free" and not ident.revoked

    pro = await directory.identity_for_key_hash(hash_key(o["pro_plain"]))
    assert pro is not None and pro.plan == "pro"  # the team's plan beats the tenant's
    assert pro.team_id == o["pro_team"].id

    assert await directory.identity_for_key_hash(hash_key(API_KEY_PREFIX + "nope")) is None

    # The stored record follows layout.py exactly (the Lua scripts read it).
    raw = await dump(redis, layout)
    record = raw[layout.key(o["key"].id)]
    assert set(record) == KEY_FIELDS
    assert record["sha256"] == hash_key(o["plain"]) and record["revoked_at"] == "" and record["replaced_by"] == ""
    assert record["prefix"] == o["plain"][:DISPLAY_PREFIX_LEN] == o["key"].prefix
    assert raw[layout.key_hash(hash_key(o["plain"]))] == o["key"].id
    assert raw[layout.user_keys(o["user"].id)] == [o["key"].id]
    assert raw[layout.team(o["team"].id)]["plan"] == ""
    assert raw[layout.tenants] == [o["tenant"].id]
    assert raw[layout.tenant_teams(o["tenant"].id)] == sorted([o["team"].id, o["pro_team"].id])
    assert set(raw[layout.user(o["user"].id)]) == {"tenant_id", "team_id", "name", "created_at"}

    assert [k.id for k in await directory.list_keys(o["user"].id)] == [o["key"].id]
    assert [t.id for t in await directory.list_teams(o["tenant"].id)] == [o["team"].id, o["pro_team"].id]
    assert [u.id for u in await directory.list_users(o["team"].id)] == [o["user"].id]
    assert [t.id for t in await directory.list_tenants()] == [o["tenant"].id]


async def test_tenant_plan_change_reaches_identities(directory: Directory) -> None:
    o = await org(directory)
    await directory.update_tenant(o["tenant"].id, plan="enterprise")
    follows = await directory.identity_for_key_hash(hash_key(o["plain"]))
    overridden = await directory.identity_for_key_hash(hash_key(o["pro_plain"]))
    assert follows is not None and follows.plan == "enterprise"
    assert overridden is not None and overridden.plan == "pro"
    with pytest.raises(InvalidRequest) as exc:
        await directory.update_tenant(o["tenant"].id, plan="platinum")
    assert exc.value.code == "unknown_plan"
    assert (await directory.get_tenant(o["tenant"].id)).plan == "enterprise"


async def test_revoked_key_resolves_as_revoked(directory: Directory) -> None:
    o = await org(directory)
    first = await directory.revoke_key(o["key"].id)
    assert first.revoked_at is not None
    ident = await directory.identity_for_key_hash(hash_key(o["plain"]))
    assert ident is not None and ident.revoked and ident.key_id == o["key"].id
    again = await directory.revoke_key(o["key"].id)  # idempotent: keeps the first time
    assert again.revoked_at == first.revoked_at
    other = await directory.identity_for_key_hash(hash_key(o["pro_plain"]))
    assert other is not None and not other.revoked


async def test_rotate_and_no_plaintext_in_redis(directory: Directory, redis: Redis, layout: Layout) -> None:
    o = await org(directory)
    new, new_plain = await directory.rotate_key(o["key"].id)
    assert new_plain != o["plain"] and new.name == o["key"].name and new.user_id == o["user"].id

    old = await directory.get_key(o["key"].id)
    assert old.revoked and old.replaced_by == new.id
    old_ident = await directory.identity_for_key_hash(hash_key(o["plain"]))
    new_ident = await directory.identity_for_key_hash(hash_key(new_plain))
    assert old_ident is not None and old_ident.revoked
    assert new_ident is not None and not new_ident.revoked and new_ident.key_id == new.id
    assert {k.id for k in await directory.list_keys(o["user"].id)} == {o["key"].id, new.id}

    with pytest.raises(InvalidRequest) as exc:
        await directory.rotate_key(o["key"].id)
    assert exc.value.code == "key_revoked"

    _, admin_plain = await directory.create_admin_key(o["tenant"].id, "ops")
    secrets_ = [o["plain"], o["pro_plain"], new_plain, admin_plain]
    parts = [s.removeprefix(API_KEY_PREFIX).removeprefix(ADMIN_KEY_PREFIX) for s in secrets_]
    assert all(len(p) >= 40 for p in parts)
    blob = repr(await dump(redis, layout))
    assert layout.key(new.id) in blob  # the scan did see the records
    for secret in secrets_ + parts:
        assert secret not in blob


async def test_concurrent_rotations_leave_one_successor(directory: Directory) -> None:
    o = await org(directory)
    results = await asyncio.gather(*(directory.rotate_key(o["key"].id) for _ in range(5)), return_exceptions=True)
    ok = [r for r in results if not isinstance(r, BaseException)]
    failed = [r for r in results if isinstance(r, BaseException)]
    assert len(ok) == 1
    assert all(isinstance(r, InvalidRequest) and r.code == "key_revoked" for r in failed)
    live = [k for k in await directory.list_keys(o["user"].id) if not k.revoked]
    assert [k.id for k in live] == [ok[0][0].id]
    assert (await directory.get_key(o["key"].id)).replaced_by == ok[0][0].id


async def test_overrides_round_trip(directory: Directory, redis: Redis, layout: Layout) -> None:
    o = await org(directory)
    uid = o["user"].id
    assert (await directory.overrides("user", uid)).model_fields_set == set()

    stored = await directory.set_overrides("user", uid, {"daily_tokens": 5000, "rpm": "unlimited"})
    got = await directory.overrides("user", uid)
    assert got == stored
    assert got.model_fields_set == {"daily_tokens", "rpm"}
    assert got.daily_tokens == 5000 and got.rpm is None
    assert (await dump(redis, layout))[layout.limits("user", uid)] == {"daily_tokens": "5000", "rpm": "unlimited"}

    # "unlimited" beats the plan's default; untouched fields keep the plan's.
    plan_user = CATALOG.plans["free"].budget.user
    eff = plan_user.merged(got)
    assert eff.rpm is None and eff.daily_tokens == 5000 and eff.tpm == plan_user.tpm

    # Replace, not merge.
    await directory.set_overrides("user", uid, {"tpm": 7})
    assert (await directory.overrides("user", uid)).model_dump(exclude_unset=True) == {"tpm": 7}

    await directory.clear_overrides("user", uid)
    assert (await directory.overrides("user", uid)).model_fields_set == set()
    assert layout.limits("user", uid) not in await dump(redis, layout)


@pytest.mark.parametrize(
    "limits",
    [
        {"bogus": 1},
        {"daily_tokens": -1},
        {"daily_tokens": 10**30},
        {"daily_tokens": 1.5},
        {"daily_tokens": 2.0},
        {"daily_tokens": True},
        {"daily_tokens": "5"},
        {"daily_tokens": None},
        {"max_input_tokens": 0},
        {"rpm": 5, "tpm": "lots"},
    ],
)
async def test_invalid_overrides_change_nothing(
    directory: Directory, redis: Redis, layout: Layout, limits: dict[str, Any]
) -> None:
    o = await org(directory)
    await directory.set_overrides("team", o["team"].id, {"monthly_tokens": 10})
    before = await dump(redis, layout)
    with pytest.raises(InvalidRequest):
        await directory.set_overrides("team", o["team"].id, limits)
    assert await dump(redis, layout) == before


async def test_overrides_need_an_existing_scope(directory: Directory, redis: Redis, layout: Layout) -> None:
    o = await org(directory)
    with pytest.raises(NotFound):
        await directory.set_overrides("team", "team_0000000000000000", {"rpm": 1})
    with pytest.raises(NotFound):
        await directory.overrides("key", "key_0000000000000000")
    # Not shaped like an id: refused before it could name another key (here a SET: WRONGTYPE).
    with pytest.raises(NotFound):
        await directory.get_tenant(f"{o['tenant'].id}:teams")
    with pytest.raises(NotFound):
        await directory.overrides("tenant", "*")
    assert not [k for k in await dump(redis, layout) if ":limits:" in k]


async def test_overrides_for_identity(directory: Directory) -> None:
    o = await org(directory)
    await directory.set_overrides("key", o["key"].id, {"max_output_tokens": 100})
    await directory.set_overrides("team", o["team"].id, {"daily_tokens": "unlimited"})
    await directory.set_overrides("team", o["pro_team"].id, {"daily_tokens": 1})  # someone else's team
    ident = await directory.identity_for_key_hash(hash_key(o["plain"]))
    assert ident is not None
    got = await directory.overrides_for(ident)
    assert set(got) == {"key", "user", "team", "tenant"}
    assert got["key"].model_dump(exclude_unset=True) == {"max_output_tokens": 100}
    assert got["team"].model_dump(exclude_unset=True) == {"daily_tokens": None}
    assert got["user"].model_fields_set == set() and got["tenant"].model_fields_set == set()

    eff = effective_limits(CATALOG.plans[ident.plan].budget, got)
    assert eff["team"].daily_tokens is None  # lifted by the override
    assert eff["team"].monthly_tokens == CATALOG.plans["free"].budget.team.monthly_tokens
    assert eff["key"].max_output_tokens == 100
    assert eff["user"] == CATALOG.plans["free"].budget.user


async def test_corrupt_override_falls_back_to_plan(directory: Directory, redis: Redis, layout: Layout) -> None:
    o = await org(directory)
    await redis.hset(layout.limits("user", o["user"].id), mapping={"rpm": "abc", "tpm": "-3", "daily_tokens": "9"})
    got = await directory.overrides("user", o["user"].id)
    assert got.model_dump(exclude_unset=True) == {"daily_tokens": 9}


async def test_tenant_of_and_scope_ref(directory: Directory) -> None:
    o = await org(directory)
    tid = o["tenant"].id
    scopes: list[tuple[ScopeName, str]] = [
        ("tenant", tid),
        ("team", o["team"].id),
        ("user", o["user"].id),
        ("key", o["key"].id),
    ]
    for scope, obj_id in scopes:
        assert await directory.tenant_of(scope, obj_id) == tid
        assert (await directory.scope_ref(scope, obj_id)).plan == "free"
    assert (await directory.scope_ref("key", o["pro_key"].id)).plan == "pro"
    assert await directory.tenant_of("user", "usr_0000000000000000") is None
    assert await directory.tenant_of("tenant", "ten_0000000000000000") is None
    assert await directory.tenant_of("team", "not-an-id") is None


async def test_admin_keys(directory: Directory, redis: Redis, layout: Layout) -> None:
    o = await org(directory)
    rec, plain = await directory.create_admin_key(o["tenant"].id, "ops")
    assert plain.startswith(ADMIN_KEY_PREFIX) and rec.tenant_id == o["tenant"].id
    assert await directory.admin_tenant_for_hash(hash_key(plain)) == o["tenant"].id
    assert await directory.admin_tenant_for_hash(hash_key(o["plain"])) is None  # an API key is no admin key
    stored = (await dump(redis, layout))[layout.admin(hash_key(plain))]
    assert set(stored) == {"tenant_id", "name", "created_at", "id"} and plain not in str(stored)
    with pytest.raises(NotFound):
        await directory.create_admin_key("ten_0000000000000000", "ops")


async def test_a_tenant_admin_key_can_be_revoked_by_id(directory: Directory) -> None:
    """Catches: tenant admin keys that could not be revoked (dd4f538 stored only the hash, with
    no id to list or revoke a leaked key by)."""
    a, b = await org(directory), await org(directory)
    rec, plain = await directory.create_admin_key(a["tenant"].id, "ops")
    other, other_plain = await directory.create_admin_key(a["tenant"].id, "ci")
    assert [k.id for k in await directory.list_admin_keys(a["tenant"].id)] == sorted([rec.id, other.id])
    with pytest.raises(NotFound):  # another tenant's id: not found, as a missing one
        await directory.revoke_admin_key(b["tenant"].id, rec.id)
    revoked = await directory.revoke_admin_key(a["tenant"].id, rec.id)
    assert revoked.revoked_at is not None
    assert await directory.admin_tenant_for_hash(hash_key(plain)) is None
    assert await directory.admin_tenant_for_hash(hash_key(other_plain)) == a["tenant"].id
    again = await directory.revoke_admin_key(a["tenant"].id, rec.id)  # idempotent: the first time stays
    assert again.revoked_at == revoked.revoked_at


async def test_root_limits_are_sticky_the_tighter_layer_applies(directory: Directory) -> None:
    """Catches: a tenant admin deleting or raising a limit the root admin set on its team, user
    or key (dd4f538 kept one override set per scope, which either admin replaced)."""
    o = await org(directory)
    uid = o["user"].id
    await directory.set_overrides("user", uid, {"daily_tokens": 1000, "rpm": 5}, root=True)
    await directory.set_overrides("user", uid, {"daily_tokens": 50_000, "tpm": 300})  # the tenant admin
    got = await directory.overrides("user", uid)
    assert got.model_dump(exclude_unset=True) == {"daily_tokens": 1000, "rpm": 5, "tpm": 300}
    await directory.clear_overrides("user", uid)  # the tenant admin's delete: root's stay
    assert (await directory.overrides("user", uid)).model_dump(exclude_unset=True) == {"daily_tokens": 1000, "rpm": 5}
    await directory.set_overrides("user", uid, {"daily_tokens": 10})  # tighter: allowed, applies
    assert (await directory.overrides("user", uid)).daily_tokens == 10
    ident = await directory.identity_for_key_hash(hash_key(o["plain"]))
    assert ident is not None
    assert (await directory.overrides_for(ident))["user"].model_dump(exclude_unset=True) == {
        "daily_tokens": 10,
        "rpm": 5,
    }
    await directory.clear_overrides("user", uid, root=True)  # the root admin may undo both
    assert (await directory.overrides("user", uid)).model_dump(exclude_unset=True) == {}


async def test_bad_names_and_plans_write_nothing(directory: Directory, redis: Redis, layout: Layout) -> None:
    with pytest.raises(InvalidRequest):
        await directory.create_tenant("Acme", "platinum")
    with pytest.raises(InvalidRequest):
        await directory.create_tenant("", "free")
    with pytest.raises(InvalidRequest):
        await directory.create_tenant("x" * 201, "free")
    assert await dump(redis, layout) == {}
    tenant = await directory.create_tenant("x" * 200, "free")
    with pytest.raises(InvalidRequest):
        await directory.create_team(tenant.id, "t", plan="platinum")
    with pytest.raises(NotFound):
        await directory.create_team("ten_0000000000000000", "t")
    with pytest.raises(NotFound):
        await directory.create_user("team_0000000000000000", "u")
    with pytest.raises(NotFound):
        await directory.create_key("usr_0000000000000000", "k")
    assert set(await dump(redis, layout)) == {layout.tenants, layout.tenant(tenant.id)}


def test_limit_set_is_what_overrides_cover() -> None:
    # set_overrides validates against LimitSet's fields: a new field must not slip past the API.
    from llmlab_budget.admin.schemas import LimitsPut

    assert set(LimitsPut.model_fields) == set(LimitSet.model_fields)
