"""Every Redis key of the budget service, in one place (prefix ``<namespace>:bud``).

Directory (identities and limits)::

    P:tenants                          SET   tenant ids
    P:tenant:<tenant_id>               HASH  name, plan, created_at
    P:tenant:<tenant_id>:teams         SET   team ids
    P:team:<team_id>                   HASH  tenant_id, name, plan ("" = the tenant's), created_at
    P:team:<team_id>:users             SET   user ids
    P:user:<user_id>                   HASH  tenant_id, team_id, name, created_at
    P:user:<user_id>:keys              SET   key ids
    P:key:<key_id>                     HASH  tenant_id, team_id, user_id, name, prefix, sha256,
                                             created_at, revoked_at ("" while active), replaced_by
    P:keyhash:<sha256>                 STRING key id (the only way from a presented key to its record)
    P:limits:<scope>:<scope_id>        HASH  overrides of LimitSet fields (absent field = plan's)
    P:admin:<sha256>                   HASH  tenant_id, name, created_at (tenant admin keys)

Ledgers (written only by the Lua scripts in ``lua/``)::

    P:u:<scope>:<id>:d:<YYYY-MM-DD>    HASH  used, reserved          (TTL 40 days)
    P:u:<scope>:<id>:m:<YYYY-MM>       HASH  used, reserved          (TTL 400 days)
    P:u:<scope>:<id>:min:<epoch_min>   HASH  req, tok                (TTL 180 s)
    P:u:<scope>:<id>:conc              STRING requests holding a reservation now
    P:res:<request_id>                 HASH  one reservation (state reserved|settled|released)
    P:res:expiry                       ZSET  request_id by expiry time (the reaper's queue)

The scripts build ledger key names from these patterns (a single Redis primary, not Cluster).
"""

from __future__ import annotations

from dataclasses import dataclass

from llmlab_common.catalog import ScopeName


@dataclass(frozen=True)
class Layout:
    prefix: str

    @classmethod
    def for_namespace(cls, namespace: str) -> Layout:
        return cls(f"{namespace}:bud")

    # -- directory ---------------------------------------------------------------------------
    @property
    def tenants(self) -> str:
        return f"{self.prefix}:tenants"

    def tenant(self, tenant_id: str) -> str:
        return f"{self.prefix}:tenant:{tenant_id}"

    def tenant_teams(self, tenant_id: str) -> str:
        return f"{self.prefix}:tenant:{tenant_id}:teams"

    def team(self, team_id: str) -> str:
        return f"{self.prefix}:team:{team_id}"

    def team_users(self, team_id: str) -> str:
        return f"{self.prefix}:team:{team_id}:users"

    def user(self, user_id: str) -> str:
        return f"{self.prefix}:user:{user_id}"

    def user_keys(self, user_id: str) -> str:
        return f"{self.prefix}:user:{user_id}:keys"

    def key(self, key_id: str) -> str:
        return f"{self.prefix}:key:{key_id}"

    def key_hash(self, sha256: str) -> str:
        return f"{self.prefix}:keyhash:{sha256}"

    def limits(self, scope: ScopeName, scope_id: str) -> str:
        return f"{self.prefix}:limits:{scope}:{scope_id}"

    def limits_root(self, scope: ScopeName, scope_id: str) -> str:
        """The root admin's overrides of a scope, apart from the tenant admin's (sticky: a tenant
        admin can neither delete nor loosen them; the tighter of both applies)."""
        return f"{self.prefix}:limits:{scope}:{scope_id}:root"

    def admin(self, sha256: str) -> str:
        return f"{self.prefix}:admin:{sha256}"

    def admin_id(self, admin_key_id: str) -> str:
        """An admin key's id -> its SHA-256 (to list and revoke it without the key)."""
        return f"{self.prefix}:adminid:{admin_key_id}"

    def tenant_admin_keys(self, tenant_id: str) -> str:
        return f"{self.prefix}:tenant:{tenant_id}:adminkeys"

    # -- ledgers -----------------------------------------------------------------------------
    def usage(self, scope: ScopeName, scope_id: str) -> str:
        """Stem of a scope's ledger keys; the scripts append ``:d:<day>`` etc."""
        return f"{self.prefix}:u:{scope}:{scope_id}"

    def day(self, scope: ScopeName, scope_id: str, day: str) -> str:
        return f"{self.usage(scope, scope_id)}:d:{day}"

    def month(self, scope: ScopeName, scope_id: str, month: str) -> str:
        return f"{self.usage(scope, scope_id)}:m:{month}"

    def minute(self, scope: ScopeName, scope_id: str, minute: int) -> str:
        return f"{self.usage(scope, scope_id)}:min:{minute}"

    def concurrent(self, scope: ScopeName, scope_id: str) -> str:
        return f"{self.usage(scope, scope_id)}:conc"

    def reservation(self, request_id: str) -> str:
        return f"{self.prefix}:res:{request_id}"

    @property
    def reservation_expiry(self) -> str:
        return f"{self.prefix}:res:expiry"

    @property
    def all_keys(self) -> str:
        """Pattern matching every key of this layout (tests clean up with it)."""
        return f"{self.prefix}:*"
