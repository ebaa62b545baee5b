"""The identity store: tenants, teams, users, API keys, limit overrides and tenant admin keys.

Everything lives in Redis under the keys of :mod:`llmlab_budget.layout` (the reserve/settle
scripts read the same keys, so the field names and encodings here are a contract):

- timestamps are whole Unix seconds as decimal strings; ``revoked_at`` is ``""`` while a key is
  active (the scripts test for the empty string);
- a team's ``plan`` is ``""`` when it follows its tenant's plan;
- a limit override is a decimal string, or ``"unlimited"`` for an explicit ``None`` that beats a
  plan default; an absent field means "the plan's default".

Plaintext keys are never stored: only their SHA-256 (:func:`llmlab_common.rules.hash_key`).
Nothing is ever deleted (revoked keys stay, so a revoked key is told apart from an unknown one),
which is why existence checks followed by writes need no WATCH; the two read-modify-write
operations on a key record (revoke, rotate) do use one.
"""

from __future__ import annotations

import logging
import re
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

from llmlab_common import rules
from llmlab_common.catalog import SCOPES, Catalog, LimitSet, ScopeName
from llmlab_common.codes import Code
from llmlab_common.errors import InvalidRequest, NotFound
from pydantic import ValidationError
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from llmlab_budget.layout import Layout
from llmlab_budget.model import DISPLAY_PREFIX_LEN, Identity, new_api_key, new_id

log = logging.getLogger(__name__)

ADMIN_KEY_PREFIX = "sk-adm-"
ADMIN_KEY_ID_PREFIX = "adm_"
UNLIMITED: Literal["unlimited"] = "unlimited"
MAX_NAME_LEN = 200
LIMIT_FIELDS: tuple[str, ...] = tuple(LimitSet.model_fields)

# What an override may be set to: a whole number within LimitSet's bounds, or "unlimited".
OverrideValue = int | Literal["unlimited"]

# The id prefix that model.new_id gives each kind of object (and each scope).
ID_KINDS: dict[ScopeName, str] = {"tenant": "ten", "team": "team", "user": "usr", "key": "key"}
_ID_RE = {kind: re.compile(rf"^{prefix}_[0-9a-f]{{16}}$") for kind, prefix in ID_KINDS.items()}

# Resolves a presented key in one round trip. A pipeline cannot do it in fewer than three: the
# team and tenant ids needed for the plan lookups are only known once the key record is read.
# Key names are built from the layout's patterns, as the lead's scripts do (single primary).
_IDENTITY_LUA = """
local key_id = redis.call('GET', KEYS[1])
if not key_id then return false end
local rec = redis.call('HGETALL', ARGV[1] .. ':key:' .. key_id)
if #rec == 0 then return false end
local team_id, tenant_id = '', ''
for i = 1, #rec, 2 do
  if rec[i] == 'team_id' then team_id = rec[i + 1] elseif rec[i] == 'tenant_id' then tenant_id = rec[i + 1] end
end
local team_plan = redis.call('HGET', ARGV[1] .. ':team:' .. team_id, 'plan')
local tenant_plan = redis.call('HGET', ARGV[1] .. ':tenant:' .. tenant_id, 'plan')
return {key_id, rec, team_plan, tenant_plan}
"""


def not_found(scope: ScopeName, obj_id: str) -> NotFound:
    """The one 404 for an object, whether it does not exist or belongs to another tenant: the
    two must be indistinguishable to a tenant admin (no existence oracle)."""
    return NotFound(f"No {scope} with id '{obj_id}'.", code=Code(f"{scope}_not_found"))


def parse_scope(scope: str) -> ScopeName:
    if scope not in SCOPES:
        raise NotFound(f"Unknown scope '{scope}': expected one of {', '.join(SCOPES)}.", code=Code.UNKNOWN_SCOPE)
    return cast(ScopeName, scope)


def valid_id(scope: ScopeName, obj_id: str) -> bool:
    """Ids go into Redis key names: anything not shaped like one of ours (``ten_x:teams``, ``*``)
    is refused before it can name another key."""
    return bool(_ID_RE[scope].match(obj_id))


def validate_overrides(limits: Mapping[str, object]) -> dict[str, int | None]:
    """Checks override values strictly (no floats, bools or numeric strings) against LimitSet's
    own bounds, so the bounds are defined once. Returns field -> int, or None for unlimited."""
    out: dict[str, int | None] = {}
    for field, value in limits.items():
        if field not in LIMIT_FIELDS:
            raise InvalidRequest(
                f"Unknown limit '{field}': expected one of {', '.join(LIMIT_FIELDS)}.",
                param=field,
                code=Code.UNKNOWN_PARAMETER,
            )
        if value == UNLIMITED:
            out[field] = None
            continue
        if type(value) is not int:  # bool is an int subclass: `type` excludes it
            raise InvalidRequest(
                f"Invalid value for '{field}': expected a whole number or \"{UNLIMITED}\".",
                param=field,
                code=Code.INVALID_VALUE,
            )
        try:
            LimitSet.model_validate({field: value})
        except ValidationError as exc:
            msg = exc.errors()[0]["msg"]
            raise InvalidRequest(f"Invalid value for '{field}': {msg}.", param=field, code=Code.INVALID_VALUE) from exc
        out[field] = value
    return out


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _fields(raw: Any) -> dict[str, str]:
    """HGETALL as str -> str whether or not the client decodes responses (a dict from the client,
    a flat list from a Lua script)."""
    if isinstance(raw, dict):
        return {_s(k): _s(v) for k, v in raw.items()}
    items = list(raw or [])
    return {_s(items[i]): _s(items[i + 1]) for i in range(0, len(items) - 1, 2)}


def tighter(a: LimitSet, b: LimitSet) -> LimitSet:
    """Per field, the tighter of two override sets (``None`` is an explicit unlimited: any number
    is tighter); a field set in only one comes from it."""
    fields: dict[str, int | None] = {}
    for name in a.model_fields_set | b.model_fields_set:
        va, vb = getattr(a, name), getattr(b, name)
        if name not in a.model_fields_set:
            fields[name] = vb
        elif name not in b.model_fields_set:
            fields[name] = va
        else:
            fields[name] = vb if va is None else va if vb is None else min(va, vb)
    return LimitSet.model_validate(fields)


def _opt_int(value: str | None) -> int | None:
    return int(value) if value else None


def _name(name: str) -> str:
    if not isinstance(name, str) or not 1 <= len(name) <= MAX_NAME_LEN:
        raise InvalidRequest(f"'name' must be 1 to {MAX_NAME_LEN} characters.", param="name", code=Code.INVALID_VALUE)
    return name


@dataclass(frozen=True, slots=True)
class TenantRecord:
    id: str
    name: str
    plan: str
    created_at: int


@dataclass(frozen=True, slots=True)
class TeamRecord:
    id: str
    tenant_id: str
    name: str
    plan: str  # "" = the tenant's plan
    created_at: int


@dataclass(frozen=True, slots=True)
class UserRecord:
    id: str
    tenant_id: str
    team_id: str
    name: str
    created_at: int


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """A key as listed: never its hash, never the key."""

    id: str
    tenant_id: str
    team_id: str
    user_id: str
    name: str
    prefix: str
    created_at: int
    revoked_at: int | None
    replaced_by: str | None

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None


@dataclass(frozen=True, slots=True)
class AdminKeyRecord:
    tenant_id: str
    name: str
    created_at: int
    id: str = ""
    revoked_at: int | None = None


@dataclass(frozen=True, slots=True)
class ScopeRef:
    """An existing scope with what authorisation and limits need: its tenant and its plan."""

    scope: ScopeName
    scope_id: str
    tenant_id: str
    plan: str


class Directory:
    def __init__(
        self, redis: Redis, layout: Layout, catalog: Catalog, *, clock: Callable[[], float] = time.time
    ) -> None:
        self._r = redis
        self._l = layout
        self._catalog = catalog
        self._clock = clock
        self._identity_script = redis.register_script(_IDENTITY_LUA)

    # -- helpers -------------------------------------------------------------------------------
    def _now(self) -> int:
        return int(self._clock())

    def _check_plan(self, plan: str) -> str:
        if plan not in self._catalog.plans:
            raise InvalidRequest(
                f"Unknown plan '{plan}': expected one of {', '.join(self._catalog.plans)}.",
                param="plan",
                code=Code.UNKNOWN_PLAN,
            )
        return plan

    def _record_key(self, scope: ScopeName, obj_id: str) -> str:
        return {"tenant": self._l.tenant, "team": self._l.team, "user": self._l.user, "key": self._l.key}[scope](obj_id)

    async def _hgetall(self, scope: ScopeName, obj_id: str) -> dict[str, str]:
        if not valid_id(scope, obj_id):
            raise not_found(scope, obj_id)
        raw = await cast(Awaitable[Any], self._r.hgetall(self._record_key(scope, obj_id)))
        fields = _fields(raw)
        if not fields:
            raise not_found(scope, obj_id)
        return fields

    async def _require(self, scope: ScopeName, obj_id: str) -> None:
        if not valid_id(scope, obj_id) or not await self._r.exists(self._record_key(scope, obj_id)):
            raise not_found(scope, obj_id)

    async def _members(self, set_key: str) -> list[str]:
        return sorted(_s(m) for m in await cast(Awaitable[Any], self._r.smembers(set_key)))

    async def _many(self, scope: ScopeName, ids: list[str]) -> list[dict[str, str]]:
        if not ids:
            return []
        async with self._r.pipeline(transaction=False) as p:
            for obj_id in ids:
                p.hgetall(self._record_key(scope, obj_id))
            rows = await p.execute()
        return [{"id": obj_id, **_fields(raw)} for obj_id, raw in zip(ids, rows, strict=True) if raw]

    # -- tenants -------------------------------------------------------------------------------
    @staticmethod
    def _tenant(tenant_id: str, f: Mapping[str, str]) -> TenantRecord:
        return TenantRecord(tenant_id, f.get("name", ""), f.get("plan", ""), int(f.get("created_at") or 0))

    async def create_tenant(self, name: str, plan: str) -> TenantRecord:
        rec = TenantRecord(new_id(ID_KINDS["tenant"]), _name(name), self._check_plan(plan), self._now())
        async with self._r.pipeline(transaction=True) as p:
            p.hset(self._l.tenant(rec.id), mapping={"name": rec.name, "plan": rec.plan, "created_at": rec.created_at})
            p.sadd(self._l.tenants, rec.id)
            await p.execute()
        return rec

    async def get_tenant(self, tenant_id: str) -> TenantRecord:
        return self._tenant(tenant_id, await self._hgetall("tenant", tenant_id))

    async def list_tenants(self) -> list[TenantRecord]:
        rows = await self._many("tenant", await self._members(self._l.tenants))
        return sorted((self._tenant(r["id"], r) for r in rows), key=lambda t: (t.created_at, t.id))

    async def update_tenant(self, tenant_id: str, *, name: str | None = None, plan: str | None = None) -> TenantRecord:
        await self._require("tenant", tenant_id)
        update: dict[str, str] = {}
        if name is not None:
            update["name"] = _name(name)
        if plan is not None:
            update["plan"] = self._check_plan(plan)
        if update:
            await cast(Awaitable[Any], self._r.hset(self._l.tenant(tenant_id), mapping=cast(Mapping[Any, Any], update)))
        return await self.get_tenant(tenant_id)

    # -- teams ---------------------------------------------------------------------------------
    @staticmethod
    def _team(team_id: str, f: Mapping[str, str]) -> TeamRecord:
        return TeamRecord(
            team_id, f.get("tenant_id", ""), f.get("name", ""), f.get("plan", ""), int(f.get("created_at") or 0)
        )

    async def create_team(self, tenant_id: str, name: str, plan: str | None = None) -> TeamRecord:
        """``plan`` None or "" follows the tenant's plan; anything else overrides it."""
        await self._require("tenant", tenant_id)
        rec = TeamRecord(
            new_id(ID_KINDS["team"]), tenant_id, _name(name), self._check_plan(plan) if plan else "", self._now()
        )
        async with self._r.pipeline(transaction=True) as p:
            p.hset(
                self._l.team(rec.id),
                mapping={"tenant_id": tenant_id, "name": rec.name, "plan": rec.plan, "created_at": rec.created_at},
            )
            p.sadd(self._l.tenant_teams(tenant_id), rec.id)
            await p.execute()
        return rec

    async def get_team(self, team_id: str) -> TeamRecord:
        return self._team(team_id, await self._hgetall("team", team_id))

    async def list_teams(self, tenant_id: str) -> list[TeamRecord]:
        await self._require("tenant", tenant_id)
        rows = await self._many("team", await self._members(self._l.tenant_teams(tenant_id)))
        return sorted((self._team(r["id"], r) for r in rows), key=lambda t: (t.created_at, t.id))

    # -- users ---------------------------------------------------------------------------------
    @staticmethod
    def _user(user_id: str, f: Mapping[str, str]) -> UserRecord:
        return UserRecord(
            user_id, f.get("tenant_id", ""), f.get("team_id", ""), f.get("name", ""), int(f.get("created_at") or 0)
        )

    async def create_user(self, team_id: str, name: str) -> UserRecord:
        team = await self.get_team(team_id)
        rec = UserRecord(new_id(ID_KINDS["user"]), team.tenant_id, team_id, _name(name), self._now())
        async with self._r.pipeline(transaction=True) as p:
            p.hset(
                self._l.user(rec.id),
                mapping={
                    "tenant_id": rec.tenant_id,
                    "team_id": team_id,
                    "name": rec.name,
                    "created_at": rec.created_at,
                },
            )
            p.sadd(self._l.team_users(team_id), rec.id)
            await p.execute()
        return rec

    async def get_user(self, user_id: str) -> UserRecord:
        return self._user(user_id, await self._hgetall("user", user_id))

    async def list_users(self, team_id: str) -> list[UserRecord]:
        await self._require("team", team_id)
        rows = await self._many("user", await self._members(self._l.team_users(team_id)))
        return sorted((self._user(r["id"], r) for r in rows), key=lambda u: (u.created_at, u.id))

    # -- API keys ------------------------------------------------------------------------------
    @staticmethod
    def _key(key_id: str, f: Mapping[str, str]) -> KeyRecord:
        return KeyRecord(
            id=key_id,
            tenant_id=f.get("tenant_id", ""),
            team_id=f.get("team_id", ""),
            user_id=f.get("user_id", ""),
            name=f.get("name", ""),
            prefix=f.get("prefix", ""),
            created_at=int(f.get("created_at") or 0),
            revoked_at=_opt_int(f.get("revoked_at")),
            replaced_by=f.get("replaced_by") or None,
        )

    def _stage_new_key(self, p: Pipeline, user: UserRecord, name: str) -> tuple[KeyRecord, str]:
        """Queues the writes of a new key on a MULTI pipeline; returns it with its plaintext."""
        plaintext = new_api_key()
        rec = KeyRecord(
            id=new_id(ID_KINDS["key"]),
            tenant_id=user.tenant_id,
            team_id=user.team_id,
            user_id=user.id,
            name=name,
            prefix=plaintext[:DISPLAY_PREFIX_LEN],
            created_at=self._now(),
            revoked_at=None,
            replaced_by=None,
        )
        digest = rules.hash_key(plaintext)
        p.hset(
            self._l.key(rec.id),
            mapping={
                "tenant_id": rec.tenant_id,
                "team_id": rec.team_id,
                "user_id": rec.user_id,
                "name": rec.name,
                "prefix": rec.prefix,
                "sha256": digest,
                "created_at": rec.created_at,
                "revoked_at": "",
                "replaced_by": "",
            },
        )
        p.set(self._l.key_hash(digest), rec.id)
        p.sadd(self._l.user_keys(user.id), rec.id)
        return rec, plaintext

    async def create_key(self, user_id: str, name: str) -> tuple[KeyRecord, str]:
        """Returns the record and the plaintext key, which exists nowhere else afterwards."""
        user = await self.get_user(user_id)
        async with self._r.pipeline(transaction=True) as p:
            rec, plaintext = self._stage_new_key(p, user, _name(name))
            await p.execute()
        return rec, plaintext

    async def get_key(self, key_id: str) -> KeyRecord:
        return self._key(key_id, await self._hgetall("key", key_id))

    async def list_keys(self, user_id: str) -> list[KeyRecord]:
        await self._require("user", user_id)
        rows = await self._many("key", await self._members(self._l.user_keys(user_id)))
        return sorted((self._key(r["id"], r) for r in rows), key=lambda k: (k.created_at, k.id))

    async def revoke_key(self, key_id: str) -> KeyRecord:
        """Idempotent: revoking a revoked key keeps its first ``revoked_at``. The keyhash mapping
        stays, so the key is then recognised as revoked rather than unknown."""
        await self._require("key", key_id)
        kkey = self._l.key(key_id)

        async def txn(p: Pipeline) -> None:
            # WATCH (by Redis.transaction) makes two concurrent revokes agree on one timestamp.
            if _s(await p.hget(kkey, "revoked_at") or ""):
                return
            p.multi()
            p.hset(kkey, "revoked_at", str(self._now()))

        await self._r.transaction(txn, kkey)
        return await self.get_key(key_id)

    async def rotate_key(self, key_id: str) -> tuple[KeyRecord, str]:
        """A new key for the same user and name; the old one is revoked with ``replaced_by``.
        A revoked key is not rotated (create a new key instead): rotating twice concurrently
        would otherwise leave two live successors."""
        old = await self.get_key(key_id)
        user = await self.get_user(old.user_id)
        kkey = self._l.key(key_id)

        async def txn(p: Pipeline) -> tuple[KeyRecord, str]:
            if _s(await p.hget(kkey, "revoked_at") or ""):
                raise InvalidRequest(
                    f"Key '{key_id}' is revoked and cannot be rotated; create a new key instead.",
                    code=Code.KEY_REVOKED,
                )
            p.multi()
            new, plaintext = self._stage_new_key(p, user, old.name)
            p.hset(kkey, mapping={"revoked_at": str(new.created_at), "replaced_by": new.id})
            return new, plaintext

        result: tuple[KeyRecord, str] = await self._r.transaction(txn, kkey, value_from_callable=True)
        return result

    # -- the hot path ----------------------------------------------------------------------------
    async def identity_for_key_hash(self, sha256: str) -> Identity | None:
        """Who a presented key (by its SHA-256) belongs to, in one round trip; None if unknown.
        A revoked key resolves with ``revoked=True`` so callers can say so."""
        res = await self._identity_script(keys=[self._l.key_hash(sha256)], args=[self._l.prefix])
        if not res:
            return None
        key_id, raw, team_plan, tenant_plan = res
        f = _fields(raw)
        plan = _s(team_plan or "") or _s(tenant_plan or "")
        if not plan:  # a key whose team/tenant records are missing: treat as unknown
            log.error(
                "key %s has no resolvable plan (team %s, tenant %s)", _s(key_id), f.get("team_id"), f.get("tenant_id")
            )
            return None
        return Identity(
            tenant_id=f.get("tenant_id", ""),
            team_id=f.get("team_id", ""),
            user_id=f.get("user_id", ""),
            key_id=_s(key_id),
            plan=plan,
            revoked=bool(f.get("revoked_at")),
        )

    # -- scopes and limits -----------------------------------------------------------------------
    async def scope_ref(self, scope: ScopeName, scope_id: str) -> ScopeRef:
        """The scope's tenant and effective plan (team override, else the tenant's); NotFound if
        the scope does not exist."""
        f = await self._hgetall(scope, scope_id)
        tenant_id = scope_id if scope == "tenant" else f.get("tenant_id", "")
        if scope == "tenant":
            return ScopeRef(scope, scope_id, tenant_id, f.get("plan", ""))
        team_id = scope_id if scope == "team" else f.get("team_id", "")
        async with self._r.pipeline(transaction=False) as p:
            p.hget(self._l.team(team_id), "plan")
            p.hget(self._l.tenant(tenant_id), "plan")
            team_plan, tenant_plan = await p.execute()
        return ScopeRef(scope, scope_id, tenant_id, _s(team_plan or "") or _s(tenant_plan or ""))

    async def tenant_of(self, scope: ScopeName, scope_id: str) -> str | None:
        """The tenant a scope belongs to (for authorisation), or None if it does not exist."""
        if not valid_id(scope, scope_id):
            return None
        if scope == "tenant":
            return scope_id if await self._r.exists(self._l.tenant(scope_id)) else None
        tenant = await cast(Awaitable[Any], self._r.hget(self._record_key(scope, scope_id), "tenant_id"))
        return _s(tenant) if tenant else None

    @staticmethod
    def _parse_overrides(where: str, raw: Any) -> LimitSet:
        """Built only from the stored fields, so ``model_fields_set`` says what is overridden.
        A field that fails to parse is dropped (the plan default applies) and logged: one bad
        value must not take the whole scope's limits down."""
        fields: dict[str, int | None] = {}
        for field, value in _fields(raw).items():
            try:
                parsed = None if value == UNLIMITED else int(value)
                LimitSet.model_validate({field: parsed})
            except (ValueError, ValidationError):
                log.error("ignoring invalid limit override %s=%r in %s", field, value, where)
                continue
            fields[field] = parsed
        return LimitSet.model_validate(fields)

    async def overrides(self, scope: ScopeName, scope_id: str) -> LimitSet:
        """The scope's overrides: the tighter of the root admin's and the tenant admin's."""
        if not valid_id(scope, scope_id):
            raise not_found(scope, scope_id)
        key, root = self._l.limits(scope, scope_id), self._l.limits_root(scope, scope_id)
        async with self._r.pipeline(transaction=False) as p:
            p.exists(self._record_key(scope, scope_id))
            p.hgetall(key)
            p.hgetall(root)
            exists, raw, raw_root = await p.execute()
        if not exists:
            raise not_found(scope, scope_id)
        return tighter(self._parse_overrides(key, raw), self._parse_overrides(root, raw_root))

    async def overrides_for(self, identity: Identity) -> dict[ScopeName, LimitSet]:
        """Overrides of the key, user, team and tenant of an identity, in one round trip."""
        keys = [self._l.limits(scope, scope_id) for scope, scope_id in identity.scopes()]
        roots = [self._l.limits_root(scope, scope_id) for scope, scope_id in identity.scopes()]
        async with self._r.pipeline(transaction=False) as p:
            for key in (*keys, *roots):
                p.hgetall(key)
            rows = await p.execute()
        n = len(keys)
        return {
            scope: tighter(self._parse_overrides(key, raw), self._parse_overrides(root, raw_root))
            for scope, key, raw, root, raw_root in zip(SCOPES, keys, rows[:n], roots, rows[n:], strict=True)
        }

    async def set_overrides(
        self, scope: ScopeName, scope_id: str, limits: Mapping[str, OverrideValue], *, root: bool = False
    ) -> LimitSet:
        """Replaces the scope's whole override set of one admin layer (an empty mapping clears it):
        the root admin's (``root``) or the tenant admin's. The tighter of both applies, so a
        tenant admin can neither loosen nor delete what the root admin set."""
        values = validate_overrides(limits)  # before any write: a bad value changes nothing
        await self._require(scope, scope_id)
        key = self._l.limits_root(scope, scope_id) if root else self._l.limits(scope, scope_id)
        async with self._r.pipeline(transaction=True) as p:
            p.delete(key)
            if values:
                p.hset(key, mapping={f: UNLIMITED if v is None else str(v) for f, v in values.items()})
            await p.execute()
        return LimitSet.model_validate(values)

    async def clear_overrides(self, scope: ScopeName, scope_id: str, *, root: bool = False) -> None:
        """The tenant admin's layer; with ``root`` both layers (the root admin may undo anything)."""
        await self._require(scope, scope_id)
        keys = [self._l.limits(scope, scope_id)]
        if root:
            keys.append(self._l.limits_root(scope, scope_id))
        await self._r.delete(*keys)

    # -- tenant admin keys -----------------------------------------------------------------------
    async def create_admin_key(self, tenant_id: str, name: str) -> tuple[AdminKeyRecord, str]:
        """A key that administers one tenant; returns it in plaintext, once (only its SHA-256 is
        stored, with an id to list and revoke it by)."""
        await self._require("tenant", tenant_id)
        key_id = ADMIN_KEY_ID_PREFIX + secrets.token_hex(8)
        rec = AdminKeyRecord(tenant_id, _name(name), self._now(), key_id)
        plaintext = ADMIN_KEY_PREFIX + secrets.token_urlsafe(32)
        sha = rules.hash_key(plaintext)
        async with self._r.pipeline(transaction=True) as p:
            p.hset(
                self._l.admin(sha),
                mapping={"tenant_id": tenant_id, "name": rec.name, "created_at": rec.created_at, "id": key_id},
            )
            p.set(self._l.admin_id(key_id), sha)
            p.sadd(self._l.tenant_admin_keys(tenant_id), key_id)
            await p.execute()
        return rec, plaintext

    async def list_admin_keys(self, tenant_id: str) -> list[AdminKeyRecord]:
        await self._require("tenant", tenant_id)
        out = []
        for key_id in sorted(await self._members(self._l.tenant_admin_keys(tenant_id))):
            rec = await self._admin_record(key_id)
            if rec is not None:
                out.append(rec)
        return out

    async def _admin_record(self, key_id: str) -> AdminKeyRecord | None:
        sha = await cast(Awaitable[Any], self._r.get(self._l.admin_id(key_id)))
        if not sha:
            return None
        f = _fields(await cast(Awaitable[Any], self._r.hgetall(self._l.admin(_s(sha)))))
        if not f:
            return None
        return AdminKeyRecord(
            f.get("tenant_id", ""),
            f.get("name", ""),
            int(f.get("created_at", 0)),
            key_id,
            _opt_int(f.get("revoked_at")),
        )

    async def revoke_admin_key(self, tenant_id: str, key_id: str) -> AdminKeyRecord:
        """Revoke a tenant's admin key by id: refused at once from then on (kept, so it reads as
        revoked). An id of another tenant is not found, as one that does not exist."""
        rec = await self._admin_record(key_id) if key_id.startswith(ADMIN_KEY_ID_PREFIX) else None
        if rec is None or rec.tenant_id != tenant_id:
            raise NotFound(f"No admin key '{key_id}' in this tenant.", code=Code.KEY_NOT_FOUND)
        if rec.revoked_at is None:
            sha = _s(await cast(Awaitable[Any], self._r.get(self._l.admin_id(key_id))))
            now = self._now()
            await cast(Awaitable[Any], self._r.hset(self._l.admin(sha), "revoked_at", str(now)))
            rec = AdminKeyRecord(rec.tenant_id, rec.name, rec.created_at, key_id, now)
        return rec

    async def admin_tenant_for_hash(self, sha256: str) -> str | None:
        """The tenant an admin key administers; None if unknown or revoked."""
        tenant, revoked = await cast(Awaitable[Any], self._r.hmget(self._l.admin(sha256), "tenant_id", "revoked_at"))
        return _s(tenant) if tenant and not revoked else None


__all__ = [
    "ADMIN_KEY_ID_PREFIX",
    "ADMIN_KEY_PREFIX",
    "LIMIT_FIELDS",
    "UNLIMITED",
    "AdminKeyRecord",
    "Directory",
    "KeyRecord",
    "OverrideValue",
    "ScopeRef",
    "TeamRecord",
    "TenantRecord",
    "UserRecord",
    "not_found",
    "parse_scope",
    "valid_id",
    "validate_overrides",
]
