from __future__ import annotations

import os
import secrets
import socket

from llmlab_common.settings import ScalableSettings
from pydantic import Field
from pydantic_settings import SettingsConfigDict


def _default_worker_id() -> str:
    host = socket.gethostname().split(".")[0][:24]
    clean = "".join(c if c.isalnum() or c in "-_" else "-" for c in host)
    return f"{clean}-{os.getpid()}-{secrets.token_hex(2)}"


class WorkerSettings(ScalableSettings):
    """Env prefix ``LLMLAB_WORKER_``; both engine workers share it (same lifecycle)."""

    model_config = SettingsConfigDict(env_prefix="LLMLAB_WORKER_", extra="ignore")
    instance_id_field = "worker_id"

    port: int = 8090
    engine_url: str = "http://127.0.0.1:8001"
    pool: str = "gpu-vllm"
    worker_id: str = Field(default_factory=_default_worker_id)
    # Models this worker serves, as public ids; empty = every catalog deployment of this pool.
    models: list[str] = Field(default_factory=list)
    max_concurrency: int = Field(default=64, ge=1)
    heartbeat_interval_s: float = Field(default=1.0, gt=0)
    # JetStream redelivers an unacked attempt after this; in-progress acks keep long generations alive.
    ack_wait_s: float = Field(default=30.0, gt=0)
    # How long an attempt's event is retried (JetStream unreachable or full) before the request
    # is acked anyway and the loss counted (llmlab_worker_event_publish_failures_total). Below
    # ack_wait_s, so the request is not redelivered meanwhile.
    event_publish_retry_s: float = Field(default=10.0, ge=0)
    max_deliver: int = Field(default=3, ge=1)
    # Consumers of dead workers are removed by NATS after this long without pulls.
    worker_consumer_inactive_s: float = Field(default=300.0, gt=0)
    # Lifetime of each lingering pull request. Shorter: a drain waits less for the last one to end
    # (so nothing is delivered to a closed inbox); longer: fewer idle pull requests.
    pull_expires_s: float = Field(default=2.0, gt=0)
    # Tokens that arrive within this window of the previous flush go out in one NATS message.
    coalesce_ms: float = Field(default=10.0, ge=0)
    # Publishes are written to NATS at most once per this window under load (one write carries
    # many streams' messages); a publish after a quiet spell goes at once.
    publish_batch_ms: float = Field(default=2.0, ge=0)
    # Messages of one drain bound for the same gateway leave as one NATS message (a batch).
    gateway_batches: bool = True
    # Engine chunks handed to the attempt from the connection's read callback (an OpenAI-compatible
    # engine over HTTP) instead of waking the attempt's task per chunk; false: the iterator path.
    push_relay: bool = True
    engine_connect_timeout_s: float = 5.0
    engine_fail_threshold: int = Field(default=3, ge=1)  # failed health checks before unready
    # An engine that sends nothing for this long after an attempt's first token has stalled: the
    # attempt fails (the gateway continues the stream on another worker). Once the health checks
    # gave the engine up, one heartbeat interval of silence is enough, before the first token too.
    # 0: never (the request's deadline still ends it).
    engine_stall_timeout_s: float = Field(default=30.0, ge=0)
    alive_probe_timeout_s: float = 1.0
