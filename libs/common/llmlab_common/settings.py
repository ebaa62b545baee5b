"""Settings base classes.

Every service has one pydantic-settings class with its own env prefix (``LLMLAB_GATEWAY_``,
``LLMLAB_WORKER_`` ...). What all services share (where NATS is, the namespace that prefixes
every subject/stream, the catalog path) lives in :class:`InfraSettings` under ``LLMLAB_`` so a
deployment sets it once.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from llmlab_common.natsauth import split_user

# Relative paths resolve against the working directory: every command of this repository runs
# from its root, and a deployment sets LLMLAB_CATALOG_PATH.
DEFAULT_CATALOG = Path("configs") / "catalog.yaml"
_NAMESPACE_RE = re.compile(r"^[a-z][a-z0-9_]{0,31}$")


class InfraSettings(BaseSettings):
    """Shared infrastructure settings, env prefix ``LLMLAB_``."""

    model_config = SettingsConfigDict(env_prefix="LLMLAB_", extra="ignore")

    # Fail closed: the dev conveniences (the documented dev keys, static auth) exist only where
    # LLMLAB_ENV says dev or test explicitly (make, scripts/stack.sh, docker-compose and the test
    # kit set it); a process started without it is prod.
    env: Literal["dev", "test", "prod"] = "prod"
    nats_url: str = "nats://127.0.0.1:4222"
    redis_url: str = "redis://127.0.0.1:6379/0"
    # Prefix of every NATS subject, stream and consumer name: lets several deployments (and
    # concurrent test runs) share one NATS server without seeing each other's messages.
    namespace: str = "llmlab"
    catalog_path: Path = DEFAULT_CATALOG
    log_level: str = "INFO"
    log_json: bool = True
    # This process's NATS user and password: one user per role, each allowed only its role's
    # subjects (llmlab_common.natsauth writes the server's configuration). Empty user: an
    # unauthenticated connection, which a service refuses in prod.
    nats_user: str = ""
    nats_password: SecretStr = SecretStr("")
    # The events stream's byte limit: the consumer outage it rides out (peak requests/s x ~1.5 KB
    # x the outage; llmlab_common.natsio.EVENTS_MAX_BYTES says more). Full: new events refused.
    events_max_bytes: int = Field(default=1024**3, ge=1024**2)
    # Move what is alive once the app is built (modules, schemas, the app) out of the cyclic
    # garbage collector's reach (gc.freeze), so a full collection walks only what requests made.
    gc_freeze: bool = True
    # The young generation's collection threshold (allocations less deallocations between two
    # collections); 0 keeps CPython's (700). 50,000, as the accounting's decoder already had: at
    # 700 a 1,000-stream burst cost the gateway 1.3-2.0 s of collections a run, a third of them
    # full ones, against 0.17-0.19 s (docs/benchmarks.md, the levers kept).
    gc_young_threshold: int = Field(default=50_000, ge=0)

    @field_validator("namespace")
    @classmethod
    def _check_namespace(cls, v: str) -> str:
        if not _NAMESPACE_RE.match(v):
            raise ValueError("namespace must match [a-z][a-z0-9_]{0,31} (it becomes part of NATS subjects)")
        return v


class ServiceSettings(BaseSettings):
    """Base of every service's settings; subclasses set ``model_config`` with their env prefix."""

    model_config = SettingsConfigDict(extra="ignore")

    infra: InfraSettings = Field(default_factory=InfraSettings)
    host: str = "127.0.0.1"
    port: int = 8000
    # How long SIGTERM waits for in-flight work before the process exits.
    drain_timeout_s: float = 30.0
    # Authentication failures (401s) one client address may have per window before its
    # requests are refused with 429 from their headers (llmlab_common.authguard); 0: no limit.
    auth_max_failures: int = Field(default=30, ge=0)
    auth_failure_window_s: float = Field(default=60.0, gt=0)
    # Proxies in front of this process that append to X-Forwarded-For (0: the TCP peer is the
    # client). Set it only when every request comes through them: the header is the client's to forge.
    trusted_proxy_hops: int = Field(default=0, ge=0, le=8)

    @model_validator(mode="after")
    def _authenticated_nats_in_prod(self) -> ServiceSettings:
        if self.infra.env == "prod" and not self.infra.nats_user:
            raise ValueError(
                "LLMLAB_NATS_USER is empty: prod refuses an unauthenticated NATS connection "
                "(python -m llmlab_common.natsauth writes a server configuration with one user per role)"
            )
        return self

    def refuse_default_secret(self, name: str, value: str, default: str) -> None:
        """Outside dev/test a secret left at its shipped default is a deployment error."""
        # Hex digests compare case-insensitively: an upper-case copy of the dev key's hash is it.
        if self.infra.env == "prod" and value.strip().lower() == default.lower():
            raise ValueError(f"{name} is still the shipped default; set it before running with LLMLAB_ENV=prod")


class ScalableSettings(ServiceSettings):
    """A service that may run as several processes on one port (the gateway, the workers): the
    first process starts the others as copies of itself, each binds the port with SO_REUSEPORT
    (the kernel spreads new connections over them), and they stop together. Each copy is a
    full instance with its own id (``instance_id_field``, suffixed ``-p<i>`` when it was set)."""

    instance_id_field: ClassVar[str] = ""
    processes: int = Field(default=1, ge=1, le=64)
    reuse_port: bool = False  # set in each copy; set it yourself to run copies by hand
    process_index: int = Field(default=0, ge=0)  # 0: the first process; i: its copy i
    # With several processes, copy i also serves /metrics, /health and /ready on
    # process_ops_port_base + i (0 = the first process): a scrape of the shared port reaches
    # whichever process the kernel picked, these reach one each. 0: no per-process ports.
    process_ops_port_base: int = Field(default=0, ge=0, le=65535)

    @model_validator(mode="after")
    def _nats_user_is_this_instance(self) -> ScalableSettings:
        # A process's own NATS user (<role>.<id>, llmlab_common.natsauth) may only subscribe and
        # publish under that id: another id would have its subscriptions refused at run time.
        _, ident = split_user(self.infra.nats_user)
        mine = getattr(self, self.instance_id_field, None) if self.instance_id_field else None
        if ident is not None and mine is not None and ident != mine:
            raise ValueError(
                f"LLMLAB_NATS_USER {self.infra.nats_user!r} is the NATS user of {ident!r}, but this "
                f"process's {self.instance_id_field} is {mine!r}: set the id to match (a process's own "
                "user serves one process, so PROCESSES must be 1)"
            )
        return self
