"""NATS connection and JetStream topology (streams), shared by every service."""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

from nats.aio.client import Client as NATS
from nats.errors import SlowConsumerError
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import APIError, BadRequestError, NotFoundError

from llmlab_common.metrics import Metrics
from llmlab_common.natsauth import inbox_prefix
from llmlab_common.settings import InfraSettings
from llmlab_common.subjects import Topology

log = logging.getLogger(__name__)

REQUESTS_MAX_AGE_S = 3600.0  # garbage bound only: deadlines make old requests worthless long before
EVENTS_MAX_AGE_S = 7 * 24 * 3600.0  # consumers (budget, accounting) must catch up within a week
# The events stream's size is the consumer outage it rides out: an attempt and its request make
# ~1.5 KB of events, so 1 GiB holds ~700k requests: 2 hours at 100 requests/s, 12 minutes at
# 1,000. Past it new events are refused (and the publishers count it), never old ones dropped.
# Size it as peak requests/s x 1.5 KB x the outage to ride out (LLMLAB_EVENTS_MAX_BYTES).
EVENTS_MAX_BYTES = 1024**3
DEAD_LETTERS_MAX_AGE_S = 30 * 24 * 3600.0
DEAD_LETTERS_MAX_BYTES = 256 * 1024**2
DUPLICATE_WINDOW_S = 120.0
# nats-py's outgoing buffer (its ``pending_size``): while connected, a publish that fills it flushes
# at once (backpressure on the publisher); while reconnecting, publishes beyond it fail with
# OutboundBufferLimitError instead of piling up (a worker's tokens of a NATS outage are stale by
# the time it ends: their streams have failed over or ended).
PUBLISH_BUFFER_BYTES = 8 * 1024 * 1024
# A subscription's own bound (nats-py: pending_msgs_limit / pending_bytes_limit): messages its
# callback has not taken yet. Past it nats-py drops the message and reports a slow consumer, which
# :func:`connect` counts (``llmlab_nats_slow_consumer_drops_total``). The gateway's token
# subscription: 1,000 streams x 64 undelivered token messages, 64 MiB.
TOKEN_SUB_PENDING_MSGS = 64 * 1024
TOKEN_SUB_PENDING_BYTES = 64 * 1024 * 1024
_SLOW_LOG_EVERY_S = 10.0


async def connect(
    url: str,
    name: str,
    client: NATS | None = None,
    metrics: Metrics | None = None,
    user: str = "",
    password: str = "",
) -> NATS:
    """Connect ``client`` (a fresh nats-py client by default: a subclass may be passed in). With
    ``metrics``, messages dropped by a slow consumer are counted there (and logged at most once
    every 10 s): nats-py reports each drop to the error callback and drops it silently otherwise.
    With ``user`` (a role of :mod:`llmlab_common.natsauth`), it authenticates as that role and its
    replies come to the role's own inbox prefix, the only inboxes the role may read."""
    drops = (
        metrics.counter("nats_slow_consumer_drops_total", "Messages NATS delivered that a full subscription dropped")
        if metrics is not None
        else None
    )
    last_log = 0.0

    async def _err(exc: Exception) -> None:
        nonlocal last_log
        if isinstance(exc, SlowConsumerError):
            if drops is not None:
                drops.inc()
            if time.monotonic() - last_log >= _SLOW_LOG_EVERY_S:
                last_log = time.monotonic()
                log.warning("nats slow consumer, messages dropped (subject %s)", exc.subject)
            return
        log.warning("nats error: %s", exc)

    async def _disc() -> None:
        log.warning("nats disconnected")

    async def _reconn() -> None:
        log.info("nats reconnected")

    nc = client if client is not None else NATS()
    auth: dict[str, Any] = {}
    if user:
        auth = {"user": user, "password": password, "inbox_prefix": inbox_prefix(user)}
    await nc.connect(
        url,
        name=name,
        error_cb=_err,
        disconnected_cb=_disc,
        reconnected_cb=_reconn,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.5,  # type: ignore[arg-type]  # typed int, used as seconds (float)
        pending_size=PUBLISH_BUFFER_BYTES,
        **auth,
    )
    return nc


async def connect_as(infra: InfraSettings, name: str, metrics: Metrics | None = None) -> NATS:
    """:func:`connect` with a service's infrastructure settings (URL, user, password)."""
    return await connect(
        infra.nats_url, name, metrics=metrics, user=infra.nats_user, password=infra.nats_password.get_secret_value()
    )


def stream_configs(topo: Topology, events_max_bytes: int = EVENTS_MAX_BYTES) -> list[StreamConfig]:
    return [
        StreamConfig(
            name=topo.requests_stream,
            subjects=[topo.requests_wildcard],
            retention=RetentionPolicy.WORK_QUEUE,
            storage=StorageType.FILE,
            max_age=REQUESTS_MAX_AGE_S,
            duplicate_window=DUPLICATE_WINDOW_S,
            discard=DiscardPolicy.OLD,
        ),
        # Billing events are kept until both durable consumers (budget-settle, accounting) have
        # acked them (interest retention), never dropped to make room: a full stream refuses new
        # events (discard new), so the publisher sees the failure (retries, counts it) instead of
        # an unread event vanishing. Its size is the tolerated consumer outage: see
        # EVENTS_MAX_BYTES. The durables exist from the stream's creation (ensure_streams):
        # interest retention keeps nothing for a consumer that does not exist yet.
        StreamConfig(
            name=topo.events_stream,
            subjects=[topo.events_wildcard],
            retention=RetentionPolicy.INTEREST,
            storage=StorageType.FILE,
            max_age=EVENTS_MAX_AGE_S,
            max_bytes=events_max_bytes,
            duplicate_window=DUPLICATE_WINDOW_S,
            discard=DiscardPolicy.NEW,
        ),
        # Messages no service could use, kept for a person to read (not billing data: the oldest
        # go first when it is full).
        StreamConfig(
            name=topo.dead_letter_stream,
            subjects=[topo.dead_letter_subject],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            max_age=DEAD_LETTERS_MAX_AGE_S,
            max_bytes=DEAD_LETTERS_MAX_BYTES,
            duplicate_window=DUPLICATE_WINDOW_S,  # the server's default, stated: ensure_streams compares it
            discard=DiscardPolicy.OLD,
        ),
    ]


def event_consumer_config(topo: Topology, durable: str, **overrides: Any) -> ConsumerConfig:
    """The contract of a durable consumer of the events stream (budget-settle, accounting): what
    ensure_streams creates with the stream and what the service then creates again with its own
    ack wait, redelivery and pending bounds (the fields a consumer may change)."""
    base: dict[str, Any] = {
        "durable_name": durable,
        "filter_subject": topo.events_wildcard,
        "deliver_policy": DeliverPolicy.ALL,
    }
    if durable == topo.ACCOUNTING_CONSUMER:
        # Ack-all: one ack per batch (the accounting transport says why that is safe).
        base |= {"ack_policy": AckPolicy.ALL, "max_waiting": 16}
    elif durable == topo.BUDGET_SETTLE_CONSUMER:
        base |= {"ack_policy": AckPolicy.EXPLICIT, "max_ack_pending": -1}
    else:
        raise ValueError(f"{durable} is not a durable consumer of the events stream")
    return ConsumerConfig(**(base | overrides))


async def ensure_consumer(js: JetStreamContext, stream: str, config: ConsumerConfig) -> None:
    """Create (or update) a durable consumer. One made by an older version with a setting
    JetStream cannot change (its ack or deliver policy) is kept as it is, with an error logged:
    the service runs on it rather than not starting; delete it as admin to take the new one."""
    try:
        await js.add_consumer(stream, config)
    except APIError as exc:
        if "can not be updated" not in str(exc.description):
            raise
        log.error("consumer %s on %s kept as it is (%s)", config.durable_name, stream, exc.description)


_COMPARED = ("subjects", "retention", "storage", "max_age", "max_bytes", "duplicate_window", "discard")


async def ensure_streams(js: JetStreamContext, topo: Topology, events_max_bytes: int = EVENTS_MAX_BYTES) -> None:
    """Create the streams, or bring them to this config, and the events stream's durable
    consumers when missing; safe to call from every service. An up-to-date stream is left alone
    (no update on every start). JetStream cannot change a stream's retention: a stream made by an
    older version keeps it (logged) until an admin deletes it."""
    for cfg in stream_configs(topo, events_max_bytes):
        try:
            info = await js.stream_info(cfg.name or "")
        except NotFoundError:
            try:
                await js.add_stream(cfg)
                log.info("created stream %s", cfg.name)
            except BadRequestError:  # another service created it first
                pass
            continue
        current = info.config
        changed = [f for f in _COMPARED if getattr(current, f) != getattr(cfg, f) and getattr(cfg, f) is not None]
        if changed:
            log.warning("stream %s differs in %s: updating it", cfg.name, changed)
            try:
                await js.update_stream(cfg)
            except Exception as exc:
                # With role users (llmlab_common.natsauth) only admin may update a stream: a
                # service goes on with the stream as it is and says what an admin should do.
                log.error("stream %s could not be updated (%s): update it with the admin user", cfg.name, exc)
    for durable in (topo.BUDGET_SETTLE_CONSUMER, topo.ACCOUNTING_CONSUMER):
        try:
            await js.consumer_info(topo.events_stream, durable)
        except NotFoundError:
            with contextlib.suppress(BadRequestError):  # another service created it first
                await js.add_consumer(topo.events_stream, event_consumer_config(topo, durable))


async def delete_streams(js: JetStreamContext, topo: Topology) -> None:
    for cfg in stream_configs(topo):
        with contextlib.suppress(NotFoundError):
            await js.delete_stream(cfg.name or "")
