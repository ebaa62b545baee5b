"""What JetStream holds for a stream and its consumers, read periodically for gauges: the router's
per-pool queue depth (requests stream) and accounting's events-stream size and consumer backlog.

:class:`JetStreamProbe` reads (stream info, every consumer's info); the summing is pure
(:func:`pending_by_pool`, :func:`pending_by_durable`) so it is tested without a server, and the
module imports no NATS client (accounting's domain imports its types);
:func:`run_probe` calls a step every period and never lets a failure end the service."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from llmlab_common.subjects import Topology

log = logging.getLogger(__name__)

CONSUMER_LIST_PAGE = 256  # JetStream's page size of CONSUMER.LIST
_MAX_PAGES = 64


@dataclass(frozen=True)
class ConsumerLoad:
    """One consumer's backlog: messages it has not been given yet, and given but not acked."""

    name: str
    durable: bool
    filter_subjects: tuple[str, ...]
    num_pending: int
    num_ack_pending: int


@dataclass(frozen=True)
class StreamLoad:
    messages: int
    bytes: int
    max_bytes: int | None  # None: no byte limit (-1 in JetStream's config)


@dataclass(frozen=True)
class PoolQueue:
    pending: int = 0
    ack_pending: int = 0


def consumer_load(info: Any) -> ConsumerLoad:
    """A :class:`ConsumerLoad` from nats-py's ``ConsumerInfo`` (or anything shaped like it)."""
    cfg = info.config
    subjects: list[str] = []
    if cfg is not None:
        if cfg.filter_subject:
            subjects.append(cfg.filter_subject)
        subjects.extend(getattr(cfg, "filter_subjects", None) or [])
    return ConsumerLoad(
        name=str(info.name),
        durable=bool(cfg is not None and cfg.durable_name),
        filter_subjects=tuple(subjects),
        num_pending=int(info.num_pending or 0),
        num_ack_pending=int(info.num_ack_pending or 0),
    )


def pending_by_pool(
    topo: Topology,
    consumers: Iterable[ConsumerLoad],
    pools: Sequence[str],
    alive: Callable[[str], bool] | None = None,
) -> dict[str, PoolQueue]:
    """Backlog of the requests stream per pool: the pool's shared consumer and its workers' own
    consumers, each placed by its filter subject. Every pool of ``pools`` is in the result (zero
    when it has no consumer); consumers of other pools are left out (bounded labels). With
    ``alive``, the own consumers of workers it says are gone are left out too: what a drained or
    dead worker left there no other worker can take (its gateway moves the stream on), and
    counting it would hold an autoscaler at its size until NATS removes the consumer."""
    out = {p: PoolQueue() for p in pools}
    for c in consumers:
        for subject in c.filter_subjects:
            pool = topo.request_subject_pool(subject)
            worker = topo.request_subject_worker(subject) if alive is not None else None
            if worker is not None and alive is not None and not alive(worker):
                break
            if pool in out:
                q = out[pool]
                out[pool] = PoolQueue(q.pending + c.num_pending, q.ack_pending + c.num_ack_pending)
                break
    return out


def pending_by_durable(consumers: Iterable[ConsumerLoad]) -> dict[str, int]:
    """num_pending of each durable consumer (ephemeral ones, with generated names, are left out)."""
    return {c.name: c.num_pending for c in consumers if c.durable}


class JetStreamInfo(Protocol):
    """What the probe calls on nats-py's ``JetStreamContext`` (kept a protocol: the summing and
    the gauges that import this module need no NATS client)."""

    async def stream_info(self, name: str) -> Any: ...

    async def consumers_info(self, stream: str, offset: int | None = None) -> list[Any]: ...


class JetStreamProbe:
    """Reads one stream's state and its consumers' backlogs."""

    def __init__(self, js: JetStreamInfo, stream: str) -> None:
        self.js = js
        self.stream = stream

    async def stream_load(self) -> StreamLoad:
        info = await self.js.stream_info(self.stream)
        max_bytes = info.config.max_bytes
        return StreamLoad(
            messages=int(info.state.messages),
            bytes=int(info.state.bytes),
            max_bytes=int(max_bytes) if max_bytes is not None and max_bytes >= 0 else None,
        )

    async def consumers(self) -> list[ConsumerLoad]:
        out: list[ConsumerLoad] = []
        offset = 0
        for _ in range(_MAX_PAGES):
            page = await self.js.consumers_info(self.stream, offset=offset or None)
            out.extend(consumer_load(i) for i in page)
            if len(page) < CONSUMER_LIST_PAGE:
                break
            offset += len(page)
        return out


async def run_probe(
    step: Callable[[], Awaitable[None]], period_s: float, what: str, warn_every_s: float = 60.0
) -> None:
    """Call ``step`` every ``period_s`` until cancelled. A failing step is logged (a warning at
    most every ``warn_every_s``, debug otherwise) and tried again at the next period."""
    last_warning = -float("inf")
    while True:
        try:
            await step()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            now = time.monotonic()
            if now - last_warning >= warn_every_s:
                last_warning = now
                log.warning("%s probe failed (retrying every %.1fs): %s", what, period_s, exc)
            else:
                log.debug("%s probe failed: %s", what, exc)
        await asyncio.sleep(period_s)
