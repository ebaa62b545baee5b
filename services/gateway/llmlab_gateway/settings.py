from __future__ import annotations

import secrets
from pathlib import Path
from typing import Literal

from llmlab_common import rules
from llmlab_common.messages import MAX_ADMISSION_BATCH
from llmlab_common.settings import ScalableSettings
from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

DEV_API_KEY = "sk-llmlab-dev"  # documented dev key; refused when LLMLAB_ENV=prod
DEV_API_KEY_SHA256 = rules.hash_key(DEV_API_KEY)


class GatewaySettings(ScalableSettings):
    """Env prefix ``LLMLAB_GATEWAY_``."""

    model_config = SettingsConfigDict(env_prefix="LLMLAB_GATEWAY_", extra="ignore")
    instance_id_field = "gateway_id"

    port: int = 8080
    gateway_id: str = Field(default_factory=lambda: f"gw-{secrets.token_hex(4)}")
    # "budget": keys, limits and reservations from the budget service (NATS request/reply).
    # "static": dev/test only, no budgets: SHA-256 hashes of accepted keys, all on dev_plan.
    auth: Literal["budget", "static"] = "budget"
    budget_timeout_s: float = Field(default=2.0, gt=0)
    # Unset: the dev key's hash in dev and test, none in prod.
    api_key_sha256: list[str] = Field(default_factory=list)
    auth_enabled: bool = True
    dev_plan: str = "pro"  # plan given to keys of the stub authenticator
    max_body_bytes: int = 4 * 1024 * 1024
    # Bound on the wait in NATS before a worker takes the request; None = the SLO class's.
    queue_timeout_s: float | None = None
    # After a worker took it, how long to wait for the first token before trying another worker.
    first_token_timeout_s: float = 120.0
    # A stream with no message for this long is broken (workers send in-progress heartbeats).
    stream_idle_timeout_s: float = 120.0
    request_timeout_s: float = 600.0
    # Bound on the targets of a router chain tried for one request (the catalog's max_chain also bounds it).
    max_attempts: int = Field(default=3, ge=1, le=5)
    # Admission by predicted wait: refuse at once (429 + Retry-After) a request whose predicted wait
    # for a worker exceeds its SLO class's queue bound, instead of refusing it after that wait.
    admission: bool = True
    # Mid-stream failover: how many times one stream may continue on another target after its
    # answering attempt failed past the first token (worker lost, engine failed, stream broken or
    # silent); 0: such a stream ends with an in-band error.
    max_resumes: int = Field(default=2, ge=0, le=5)
    # A fallback to a pool with no live worker waits this long for one (a restart) before the next target.
    empty_pool_wait_s: float = Field(default=3.0, gt=0)
    # "service": ask the router service over NATS (falls back to deciding here when it does not
    # answer within router_timeout_s); "embedded": decide in this process with the same router core;
    # "shared": decide here and publish each decision, applying the other gateways' (every gateway
    # of a namespace then sees all pending work and prefix homes, without a round trip per request).
    router: Literal["service", "embedded", "shared"] = "service"
    router_timeout_s: float = Field(default=0.25, gt=0)
    # Requests arriving together go to the budget and router services as one batch message of at
    # most this many (llmlab_common.coalesce); 1 = one message per request.
    admission_batch_max: int = Field(default=128, ge=1, le=MAX_ADMISSION_BATCH)
    # Route a request while its budget reserve is on the way, on the plan of its key's last
    # admission (the decision is used only if its own admission confirms the plan and max_tokens),
    # while fewer than route_ahead_max_admitting requests await their admission in this process:
    # the two round trips overlap instead of adding up. 0 (the default until a scale-down test's
    # failure with it on is explained, docs/benchmarks.md): route after the reserve answered; 16
    # is what was measured.
    route_ahead_max_admitting: int = Field(default=0, ge=0)
    # Decisions made in this process (embedded mode, or when the router service is down).
    decision_log: Path | None = Path(".run") / "gateway-decisions.jsonl"
    catalog_reload_interval_s: float = Field(default=2.0, gt=0)
    # Before any heartbeat can have arrived, do not answer 503 "no workers".
    worker_discovery_grace_s: float = 2.0
    worker_sweep_interval_s: float = 0.1

    def decision_log_path(self) -> Path | None:
        """Each process of a gateway run with processes > 1 appends to its own file (copy i: ``-p<i>``)."""
        p = self.decision_log
        if p is None or self.process_index == 0:
            return p
        return p.with_name(f"{p.stem}-p{self.process_index}{p.suffix}")

    @model_validator(mode="after")
    def _no_dev_key_in_prod(self) -> GatewaySettings:
        if "api_key_sha256" not in self.model_fields_set and self.infra.env != "prod":
            self.api_key_sha256 = [DEV_API_KEY_SHA256]
        if self.infra.env == "prod" and self.auth == "static":
            raise ValueError("LLMLAB_GATEWAY_AUTH=static has no budgets; it is refused with LLMLAB_ENV=prod")
        if self.infra.env == "prod" and DEV_API_KEY_SHA256 in {h.strip().lower() for h in self.api_key_sha256}:
            raise ValueError("the dev API key is accepted; set LLMLAB_GATEWAY_API_KEY_SHA256 for LLMLAB_ENV=prod")
        return self
