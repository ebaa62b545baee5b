"""Settings of the router service, env prefix ``LLMLAB_ROUTER_``."""

from __future__ import annotations

from pathlib import Path

from llmlab_common.settings import ServiceSettings
from pydantic import Field
from pydantic_settings import SettingsConfigDict


class RouterSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="LLMLAB_ROUTER_", extra="ignore")

    port: int = 8087
    # One JSON line per decision (inputs, verdicts, scores, chain, seed): `router explain` reads it.
    decision_log: Path | None = Path(".run") / "router-decisions.jsonl"
    decision_log_max_bytes: int = Field(default=256 * 1024 * 1024, ge=1024)
    # The catalog file is checked this often; a changed file is reloaded if valid, else the last
    # good catalog stays (the error is logged and shown on /admin/catalog).
    reload_interval_s: float = Field(default=2.0, gt=0)
    # Bound on how long a decision waits for the decision log's writer thread (sys.setswitchinterval).
    gil_switch_interval_s: float = Field(default=0.0005, gt=0, le=0.1)
    # Not ready until heartbeats have had time to arrive (else early requests see no workers).
    discovery_grace_s: float = Field(default=2.0, ge=0)
    # The requests stream's backlog per pool (JetStream consumer info) is read this often for the
    # llmlab_router_queue_*_messages gauges.
    queue_probe_s: float = Field(default=2.0, gt=0)
