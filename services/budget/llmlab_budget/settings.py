"""Settings of the budget service, env prefix ``LLMLAB_BUDGET_``."""

from __future__ import annotations

from urllib.parse import urlsplit

from llmlab_common import rules
from llmlab_common.settings import ServiceSettings
from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

DEV_ADMIN_KEY = "sk-admin-dev"  # documented dev admin key; refused when LLMLAB_ENV=prod
DEV_ADMIN_KEY_SHA256 = rules.hash_key(DEV_ADMIN_KEY)


class BudgetSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="LLMLAB_BUDGET_", extra="ignore")

    port: int = 8085
    # SHA-256 of the root admin key (sees every tenant). Tenant admin keys live in Redis.
    admin_key_sha256: str = DEV_ADMIN_KEY_SHA256
    # Daily/monthly windows roll over at midnight in this IANA time zone.
    timezone: str = "UTC"
    # Identities and limits are cached this long per key hash: limit changes take effect within
    # this bound. Revocation does not wait for it (the reserve script checks it atomically).
    identity_cache_ttl_s: float = Field(default=2.0, ge=0)
    # A key hash found unknown is answered from memory this long (0: never cached): a client
    # retrying a bad key, or a flood of one, costs no Redis round trip while real keys wait for
    # the pool. A key created meanwhile is refused for at most this long by each replica.
    unknown_key_cache_ttl_s: float = Field(default=2.0, ge=0)
    unknown_key_cache_size: int = Field(default=100_000, ge=1)
    # Redis reads and connects that take longer fail (503 budget_unavailable at the gateway, a
    # settle redelivered) instead of holding a connection forever on a hung server.
    redis_socket_timeout_s: float = Field(default=5.0, gt=0)
    # A reservation whose request never settles is released this long after the request's
    # deadline (the gateway's request_timeout_s) by the reaper.
    reservation_grace_s: float = Field(default=30.0, ge=0)
    reaper_interval_s: float = Field(default=5.0, gt=0)
    # Redis connections per process (a blocking pool: callers wait for a free one).
    redis_pool_size: int = Field(default=32, ge=1)
    # Reserves waiting for a Redis connection beyond this are refused at once (429, Retry-After 1)
    # instead of queueing past the gateway's timeout: overload sheds load, it does not collapse.
    max_pending_reserves: int = Field(default=1024, ge=1)
    # Settlement: JetStream pull batch and ack wait.
    settle_batch: int = Field(default=256, ge=1)
    settle_ack_wait_s: float = Field(default=30.0, gt=0)
    settle_max_deliver: int = Field(default=10, ge=1)
    # Reservations keep their idempotence record this long after settling.
    settled_ttl_s: int = Field(default=2 * 86400, ge=60)

    @model_validator(mode="after")
    def _no_dev_admin_key_in_prod(self) -> BudgetSettings:
        self.refuse_default_secret("LLMLAB_BUDGET_ADMIN_KEY_SHA256", self.admin_key_sha256, DEV_ADMIN_KEY_SHA256)
        # Redis holds the keys and the ledgers: whoever reaches an open one edits budgets.
        if self.infra.env == "prod" and not urlsplit(self.infra.redis_url).password:
            raise ValueError(
                "LLMLAB_REDIS_URL has no password: prod refuses an unauthenticated Redis "
                "(redis://:<password>@host:6379/0, with requirepass or an ACL user on the server)"
            )
        return self
