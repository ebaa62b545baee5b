"""Settings of the accounting service, env prefix ``LLMLAB_ACCOUNTING_``."""

from __future__ import annotations

from pathlib import Path

from llmlab_common import rules
from llmlab_common.settings import ServiceSettings
from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

DEV_ADMIN_KEY = "sk-admin-dev"  # the same documented dev admin key as the budget's; refused when LLMLAB_ENV=prod
DEV_ADMIN_KEY_SHA256 = rules.hash_key(DEV_ADMIN_KEY)
DEFAULT_DATA_DIR = Path(".run") / "accounting" / "chdb"


class AccountingSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="LLMLAB_ACCOUNTING_", extra="ignore")

    port: int = 8086
    # Empty: embedded chdb in ``data_dir`` (this process owns the directory). Otherwise a
    # clickhouse-connect DSN of a ClickHouse server, e.g. ``http://user:pass@host:8123/llmlab``.
    store_dsn: str = ""
    data_dir: Path = DEFAULT_DATA_DIR
    # SHA-256 of the admin key of the read-only query endpoint (POST /admin/v1/query).
    admin_key_sha256: str = DEV_ADMIN_KEY_SHA256
    # Ingest: a batch is inserted when it holds batch_rows events or its oldest event waited
    # flush_interval_s, whichever comes first; messages are acked only after the insert.
    batch_rows: int = Field(default=20_000, ge=1)
    flush_interval_s: float = Field(default=1.0, gt=0)
    fetch_batch: int = Field(default=2_000, ge=1)
    # Validation and row mapping of fetched chunks (of 256 events or more) in N worker processes,
    # beside the event loop; 0: in the event loop, which then caps ingest at one core.
    decode_processes: int = Field(default=1, ge=0)
    # Unacked messages (a killed process) come back after ack_wait_s: larger than a flush plus
    # the slowest insert, or a healthy batch would be redelivered while it is being inserted.
    ack_wait_s: float = Field(default=60.0, gt=0)
    # /ready turns false when inserts have failed for this long (the store refuses everything)
    # or the ingest loop died: an orchestrator then restarts the process.
    ingest_unhealthy_after_s: float = Field(default=60.0, gt=0)
    # GPU-time attribution: every period_s, for periods that ended attribution_lag_s ago (late
    # events), recompute the period's attribution (idempotent: rows replace the previous run's).
    attribution_period_s: float = Field(default=60.0, gt=0)
    attribution_lag_s: float = Field(default=30.0, ge=0)
    # How many closed periods behind the newest one each run recomputes (catching late events).
    attribution_lookback_periods: int = Field(default=2, ge=1)
    # Worker heartbeats (who was up, for standby GPU cost) are recorded in batches this often.
    heartbeat_flush_s: float = Field(default=5.0, gt=0)
    # The events stream's size and its durable consumers' backlogs (JetStream stream and consumer
    # info) are read this often for the llmlab_accounting_events_stream_* / consumer gauges.
    stream_probe_s: float = Field(default=5.0, gt=0)
    # Weight of a request in prefill against one in decode when an instant's GPU cost is split.
    prefill_weight: float = Field(default=1.0, gt=0)
    # Query endpoint bounds.
    query_max_rows: int = Field(default=100_000, ge=1)
    query_timeout_s: int = Field(default=30, ge=1)
    # Memory one admin query may use (ClickHouse's max_memory_usage): a query past it fails alone.
    query_max_memory_bytes: int = Field(default=1 << 30, ge=1 << 20)

    @model_validator(mode="after")
    def _no_dev_admin_key_in_prod(self) -> AccountingSettings:
        self.refuse_default_secret("LLMLAB_ACCOUNTING_ADMIN_KEY_SHA256", self.admin_key_sha256, DEV_ADMIN_KEY_SHA256)
        return self
