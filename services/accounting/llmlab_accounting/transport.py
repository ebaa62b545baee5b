"""NATS side of the accounting service: one durable pull consumer on the events stream, batched by
size and time, acked only after the batch is in ClickHouse; and the periodic attribution loop.

Ingest is a pipeline: fetch → decode (per fetched chunk, in worker processes when configured) →
commit (insert in a thread, then ack), in stream order."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from llmlab_common.messages import Heartbeat
from llmlab_common.natsio import ensure_consumer, event_consumer_config
from llmlab_common.pull import BatchPuller
from llmlab_common.subjects import Topology
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.api import ConsumerInfo
from nats.js.errors import NotFoundError
from pydantic import ValidationError

from llmlab_accounting.attribution import period_bounds
from llmlab_accounting.decode import Decoded, Decoder, Item
from llmlab_accounting.domain import HeartbeatRow, heartbeat_row
from llmlab_accounting.isolate import insert_isolating
from llmlab_accounting.service import AccountingService, Batch
from llmlab_accounting.settings import AccountingSettings

log = logging.getLogger(__name__)
# Heartbeats kept while the store refuses them (then the oldest are dropped): an hour of 25 workers.
MAX_BUFFERED_HEARTBEATS = 100_000
# Whole batches queued for the commit loop while the next one is fetched: bounds memory, and the
# unacked messages (max_ack_pending covers them).
PIPELINE_BATCHES = 2


@dataclass
class _Pending:
    """A batch being fetched: its messages in stream order and the decode of each fetched chunk."""

    msgs: list[Msg] = field(default_factory=list)
    parts: list[asyncio.Task[tuple[list[Msg], Decoded]]] = field(default_factory=list)
    due: float = 0.0  # monotonic time by which it is committed, full or not

    def add(self, msgs: list[Msg], part: asyncio.Task[tuple[list[Msg], Decoded]]) -> None:
        self.msgs += msgs
        self.parts.append(part)


class _Sources:
    """The message each row of a batch came from, in row order (per table): a fetched ``Msg``, or
    a stream message read back by recovery (both have ``subject`` and ``data``)."""

    def __init__(self) -> None:
        self.attempts: list[Any] = []
        self.requests: list[Any] = []

    def add(self, ours: Sequence[Any], d: Decoded) -> None:
        self.attempts += [ours[i] for i in d.attempt_src]
        self.requests += [ours[i] for i in d.request_src]

    def of(self, kind: str, row: int) -> Any:
        return (self.attempts if kind == "attempt" else self.requests)[row]


class AccountingTransport:
    def __init__(
        self,
        nc: NATS,
        js: JetStreamContext,
        topo: Topology,
        service: AccountingService,
        settings: AccountingSettings,
        decoder: Decoder,
    ) -> None:
        self.nc, self.js, self.topo = nc, js, topo
        self.service = service
        self.decoder = decoder
        self.settings = settings
        self._puller: BatchPuller | None = None
        self._hb_sub: Subscription | None = None
        self._heartbeats: list[HeartbeatRow] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self.last_flush_at = 0.0
        self.failing_since: float | None = None  # monotonic time inserts started failing

    async def start(self) -> None:
        s = self.settings
        # The contract's consumer (ensure_streams made it with the stream: interest retention
        # keeps every event from then on for it). Ack-all: one ack per batch (the ack of its
        # highest sequence) instead of one per event, which halves the NATS work per event at
        # ingest rate. Safe because batches are inserted in order, one at a time, and because
        # what a dead predecessor had fetched but not acked is re-read below before this process
        # acks anything.
        config = event_consumer_config(
            self.topo,
            self.topo.ACCOUNTING_CONSUMER,
            ack_wait=s.ack_wait_s,
            max_ack_pending=max((PIPELINE_BATCHES + 2) * s.batch_rows, 10_000),
        )
        try:
            before: ConsumerInfo | None = await self.js.consumer_info(
                self.topo.events_stream, self.topo.ACCOUNTING_CONSUMER
            )
        except NotFoundError:
            before = None
        await ensure_consumer(self.js, self.topo.events_stream, config)  # idempotent for the same config
        if before is not None and before.num_ack_pending and before.ack_floor and before.delivered:
            await self._recover(before.ack_floor.stream_seq + 1, before.delivered.stream_seq)
        self._puller = BatchPuller(self.nc, self.topo.events_stream, self.topo.ACCOUNTING_CONSUMER)
        await self._puller.start()
        self._tasks.append(asyncio.create_task(self._ingest_loop(self._puller), name="accounting-ingest"))
        self._tasks.append(asyncio.create_task(self._attribution_loop(), name="accounting-attribution"))
        self._hb_sub = await self.nc.subscribe(self.topo.heartbeat_wildcard, cb=self._on_heartbeat)
        self._tasks.append(asyncio.create_task(self._heartbeat_loop(), name="accounting-heartbeats"))

    async def stop(self) -> None:
        """Stop fetching, insert and ack what is already fetched, then return."""
        self._stopping = True
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(t, timeout=self.settings.drain_timeout_s)
        if self._puller is not None:
            await self._puller.close()
        if self._hb_sub is not None:
            with contextlib.suppress(Exception):
                await self._hb_sub.unsubscribe()

    # -- ingest -------------------------------------------------------------------------------------
    async def _recover(self, first: int, last: int) -> None:
        """Insert what a previous process fetched and may not have inserted (stream sequences
        ``first..last``), read straight from the stream; duplicates of rows it did insert are
        collapsed by the tables' keys. Only then may an ack-all move the ack floor past them."""
        log.warning("recovering events %d..%d fetched by a previous process and never acked", first, last)
        items: list[Item] = []
        raws: list[Any] = []
        n = 0
        for seq in range(first, last + 1):
            try:
                raw = await self.js.get_msg(self.topo.events_stream, seq)
            except NotFoundError:
                raw = None  # aged out of the stream
            if raw is not None and raw.subject in (self.topo.attempt_event_subject, self.topo.request_event_subject):
                items.append((raw.subject == self.topo.attempt_event_subject, raw.data or b""))
                raws.append(raw)
            if items and (len(items) >= self.settings.batch_rows or seq == last):
                # Malformed ones: the previous process dead-lettered them, or their redelivery will.
                d = await self.decoder.decode(items)
                batch = d.batch()
                sources = _Sources()
                sources.add(raws, d)
                # A poison event must not crash-loop the restart: the same isolation as ingest.
                if not await self._insert_and_ack(batch, [], sources):
                    return
                n, items, raws = n + len(batch), [], []
        log.warning("recovered %d events", n)

    async def _ingest_loop(self, puller: BatchPuller) -> None:
        """Fetch, and start decoding each fetched chunk at once; hand whole batches (size or time
        bound) to the commit loop, which inserts and acks them in order. With decode processes
        the three stages overlap: the event loop keeps fetching while earlier chunks are decoded
        in another process and an earlier batch is inserted by chdb in a thread."""
        s = self.settings
        commits: asyncio.Queue[_Pending | None] = asyncio.Queue(maxsize=PIPELINE_BATCHES)
        committer = asyncio.create_task(self._commit_loop(commits), name="accounting-commit")
        batch = _Pending()
        try:
            while not self._stopping and not committer.done():
                wait = s.flush_interval_s if not batch.msgs else max(0.01, batch.due - time.monotonic())
                want = min(s.fetch_batch, s.batch_rows - len(batch.msgs))
                try:
                    msgs = await puller.pull(want, wait)
                except Exception as exc:
                    if self._stopping:
                        break
                    log.warning("events fetch failed: %s", exc)
                    await asyncio.sleep(1)
                    continue
                if msgs:
                    if not batch.msgs:
                        batch.due = time.monotonic() + s.flush_interval_s
                    batch.add(msgs, self._start_decode(msgs))
                if batch.msgs and (len(batch.msgs) >= s.batch_rows or time.monotonic() >= batch.due):
                    await commits.put(batch)  # waits while PIPELINE_BATCHES are ahead: backpressure
                    batch = _Pending()
            if batch.msgs:
                await commits.put(batch)
        finally:
            if not committer.done():
                await commits.put(None)
            await committer

    def _start_decode(self, msgs: list[Msg]) -> asyncio.Task[tuple[list[Msg], Decoded]]:
        attempt_subject, request_subject = self.topo.attempt_event_subject, self.topo.request_event_subject
        # Dead letters and any future event kinds are not ours; they are acked with the batch.
        ours = [m for m in msgs if m.subject in (attempt_subject, request_subject)]
        self.service.m.events.labels("ignored").inc(len(msgs) - len(ours))

        async def run() -> tuple[list[Msg], Decoded]:
            return ours, await self.decoder.decode([(m.subject == attempt_subject, m.data) for m in ours])

        return asyncio.create_task(run())

    async def _commit_loop(self, commits: asyncio.Queue[_Pending | None]) -> None:
        """Batches in fetch order: dead-letter the malformed, insert, and only then ack (ack-all
        needs inserts in stream order, hence one loop)."""
        m = self.service.m
        gave_up = False
        while (batch := await commits.get()) is not None:
            if gave_up:
                continue  # after an unacked batch nothing may be acked (ack-all would cover it)
            decoded = Decoded()
            sources = _Sources()
            for part in batch.parts:
                ours, d = await part
                for i, why in d.bad:
                    await self._dead_letter(ours[i], why)
                sources.add(ours, d)
                decoded.extend(d)
            rows = decoded.batch()
            m.events.labels("attempt").inc(rows.attempts.num_rows)
            m.events.labels("request").inc(rows.requests.num_rows)
            gave_up = not await self._insert_and_ack(rows, batch.msgs, sources)

    async def _insert(self, batch: Batch) -> None:
        await asyncio.to_thread(self.service.insert, batch)

    async def _store_answers(self) -> bool:
        try:
            return bool(await asyncio.to_thread(self.service.store.scalar, "SELECT 1") == 1)
        except Exception:
            return False

    def ingest_healthy(self) -> bool:
        """For /ready: the ingest loop runs, and no insert has been failing for longer than
        ``ingest_unhealthy_after_s`` (a store that refuses everything, a loop that died)."""
        if self._tasks and self._tasks[0].done():
            return False
        since = self.failing_since
        return since is None or time.monotonic() - since < self.settings.ingest_unhealthy_after_s

    async def _insert_and_ack(self, batch: Batch, msgs: list[Msg], sources: _Sources | None = None) -> bool:
        """Insert (retrying while the store is down, until it works or the service stops), then
        ack; False: not acked. Rows the store refuses while it answers otherwise are found by
        bisection and dead-lettered (their messages, with why): a poison row neither blocks
        ingest nor is retried forever."""
        delay = 0.5
        while True:
            try:
                refused = await insert_isolating(self._insert, self._store_answers, batch)
                break
            except Exception:
                # Keep the batch and retry: nothing is acked, so a crash now loses nothing either.
                self.service.m.insert_errors.inc()
                if self.failing_since is None:
                    self.failing_since = time.monotonic()
                log.exception("insert of %d rows failed; retrying in %.1fs", len(batch), delay)
                if self._stopping:
                    return False  # unacked: redelivered to the next process
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
        self.failing_since = None
        for r in refused:
            if sources is not None:
                await self._dead_letter(sources.of(r.kind, r.row), f"refused by the store: {r.why}")
        if msgs:
            # Ack-all: the last delivered message acks everything up to its stream sequence. (A
            # redelivery there has a lower one: then less is acked and more redelivered, which the
            # tables' keys absorb.)
            with contextlib.suppress(Exception):
                await msgs[-1].ack()
        self.last_flush_at = time.time()
        return True

    async def _dead_letter(self, msg: Any, why: str) -> None:
        self.service.m.events.labels("dead_letter").inc()
        log.error("malformed event on %s dead-lettered: %s", msg.subject, why[:300])
        with contextlib.suppress(Exception):
            await self.js.publish(self.topo.dead_letter_subject, msg.data, headers={"Llmlab-Reason": why[:200]})

    # -- heartbeats (who was up: standby workers cost their deployment) -----------------------------
    async def _on_heartbeat(self, msg: Msg) -> None:
        try:
            hb = Heartbeat.model_validate_json(msg.data)
        except ValidationError:
            self.service.m.events.labels("heartbeat_malformed").inc()
            return
        if not self.topo.heartbeat_matches(msg.subject, hb.pool, hb.worker_id):
            self.service.m.events.labels("heartbeat_malformed").inc()
            return
        self.service.m.events.labels("heartbeat").inc()
        self._heartbeats.append(heartbeat_row(hb, self.service.catalog))

    async def _heartbeat_loop(self) -> None:
        """Record buffered heartbeats every ``heartbeat_flush_s`` (and once more when stopping)."""
        while True:
            stopping = self._stopping
            rows, self._heartbeats = self._heartbeats, []
            if rows:
                try:
                    await asyncio.to_thread(self.service.record_heartbeats, rows)
                except Exception:
                    log.exception("recording %d heartbeats failed; kept for the next try", len(rows))
                    self._heartbeats = (rows + self._heartbeats)[-MAX_BUFFERED_HEARTBEATS:]
            if stopping:
                return
            await self._pause(self.settings.heartbeat_flush_s)

    # -- attribution --------------------------------------------------------------------------------
    async def _attribution_loop(self) -> None:
        s = self.settings
        while not self._stopping:
            try:
                for t0, t1 in period_bounds(
                    time.time(), s.attribution_period_s, s.attribution_lag_s, s.attribution_lookback_periods
                ):
                    await asyncio.to_thread(self.service.attribute_period, t0, t1)
            except Exception:
                self.service.m.attribution_errors.inc()
                log.exception("attribution failed")
            await self._pause(s.attribution_period_s)

    async def _pause(self, seconds: float) -> None:
        """Sleep in short steps, so that a stop is not held up by a long interval."""
        deadline = time.monotonic() + seconds
        while not self._stopping and time.monotonic() < deadline:
            await asyncio.sleep(min(0.2, seconds))
