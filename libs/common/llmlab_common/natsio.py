"""NATS connection and JetStream topology (streams), shared by every service."""

from __future__ import annotations

import contextlib
import logging

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import BadRequestError, NotFoundError

from llmlab_common.subjects import Topology

log = logging.getLogger(__name__)

REQUESTS_MAX_AGE_S = 3600.0  # garbage bound only: deadlines make old requests worthless long before
EVENTS_MAX_AGE_S = 7 * 24 * 3600.0  # consumers (budget, accounting) must catch up within a week
DUPLICATE_WINDOW_S = 120.0


async def connect(url: str, name: str, client: NATS | None = None) -> NATS:
    """Connect ``client`` (a fresh nats-py client by default: a subclass may be passed in)."""

    async def _err(exc: Exception) -> None:
        log.warning("nats error: %s", exc)

    async def _disc() -> None:
        log.warning("nats disconnected")

    async def _reconn() -> None:
        log.info("nats reconnected")

    nc = client if client is not None else NATS()
    await nc.connect(
        url,
        name=name,
        error_cb=_err,
        disconnected_cb=_disc,
        reconnected_cb=_reconn,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.5,  # type: ignore[arg-type]  # typed int, used as seconds (float)
        # 1,000 streams of tokens: keep a large pending buffer so a slow callback is not a slow consumer.
        pending_size=256 * 1024 * 1024,
    )
    return nc


def stream_configs(topo: Topology) -> list[StreamConfig]:
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
        StreamConfig(
            name=topo.events_stream,
            subjects=[topo.events_wildcard],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            max_age=EVENTS_MAX_AGE_S,
            max_bytes=1024**3,
            duplicate_window=DUPLICATE_WINDOW_S,
            discard=DiscardPolicy.OLD,
        ),
    ]


_COMPARED = ("subjects", "retention", "storage", "max_age", "max_bytes", "duplicate_window", "discard")


async def ensure_streams(js: JetStreamContext, topo: Topology) -> None:
    """Create the streams, or bring them to this config; safe to call from every service.
    An up-to-date stream is left alone (no update on every start)."""
    for cfg in stream_configs(topo):
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
            await js.update_stream(cfg)


async def delete_streams(js: JetStreamContext, topo: Topology) -> None:
    for cfg in stream_configs(topo):
        with contextlib.suppress(NotFoundError):
            await js.delete_stream(cfg.name or "")
