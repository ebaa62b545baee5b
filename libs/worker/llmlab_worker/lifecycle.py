"""The NATS worker: connect, pull with capacity, run each attempt (:mod:`llmlab_worker.attempt`),
ack and report it, send heartbeats, drain. Publishes go through one ordered outbox
(:mod:`llmlab_worker.outbox`); engine specifics live in :mod:`llmlab_worker.engine` adapters."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import secrets
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from llmlab_common.catalog import Catalog
from llmlab_common.logging import request_id_var
from llmlab_common.messages import (
    AliveProbe,
    AliveReply,
    AttemptEvent,
    CancelRequest,
    EngineLoad,
    Heartbeat,
    InferenceRequest,
    Timings,
)
from llmlab_common.metrics import ITL_BUCKETS, LATENCY_BUCKETS, TOKEN_BUCKETS, Metrics
from llmlab_common.natsio import connect_as, ensure_streams
from llmlab_common.subjects import PRIORITY_LEVELS, Topology, attempt_event_msg_id
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from pydantic import ValidationError

from llmlab_worker.attempt import AttemptContext, AttemptResult, run_attempt
from llmlab_worker.engine import EngineAdapter, PushRelay
from llmlab_worker.outbox import Outbox
from llmlab_worker.pull import Capacity, PullFeeder
from llmlab_worker.settings import WorkerSettings

log = logging.getLogger(__name__)

CANCEL_MEMORY_S = 600.0  # remember cancels of not-yet-pulled attempts this long
SERVICE_WINDOW = 64  # the heartbeat's mean service time is over the last this many attempts
# Messages a queue pulled without reserved slots may hold here waiting for one: the worker's own
# queue of priority 0 up to 4 (at most a sixteenth of the slots), a higher priority's up to 16
# (a quarter). Heartbeats count them with the worker's own queue.
PREFETCH = 4
PREFETCH_HIGH = 16
LOOP_LAG_PROBE_S = 0.1  # the event-loop lag probe's timer


class EngineLoadCollector:
    """The engine's own figures as the worker last read them for its heartbeat, labelled pool and
    engine: gauges (running, waiting, KV-cache usage, prefix-cache hit ratio, batch size), absent
    while unknown, and ``<ns>_worker_engine_preemptions_total``, a counter that stays monotonic
    when the engine restarts (its counter starts again at zero: the old total is carried over)."""

    def __init__(self, namespace: str, pool: str, engine: str) -> None:
        self.prefix = f"{namespace}_" if namespace else ""
        self.label_values = [pool, engine]
        self.load = EngineLoad()
        self._preempt_base = 0.0  # what the engine had counted before its last restart(s)
        self._preempt_last: float | None = None

    def update(self, load: EngineLoad) -> None:
        self.load = load
        v = load.preemptions_total
        if v is None:
            return
        if self._preempt_last is not None and v < self._preempt_last:
            self._preempt_base += self._preempt_last  # the engine restarted
        self._preempt_last = v

    @property
    def preemptions(self) -> float | None:
        return None if self._preempt_last is None else self._preempt_base + self._preempt_last

    def collect(self) -> Iterable[Metric]:
        load, labels = self.load, ["pool", "engine"]
        for name, doc, value in (
            ("worker_engine_running_requests", "Requests running in the engine", load.running),
            ("worker_engine_waiting_requests", "Requests waiting in the engine's queue", load.waiting),
            ("worker_engine_kv_cache_usage_ratio", "Share of the engine's KV cache in use (0..1)", load.kv_cache_usage),
            (
                "worker_engine_prefix_cache_hit_ratio",
                "Prefix-cache hit ratio of the engine (0..1; windowed where the engine exports counters)",
                load.prefix_cache_hit_rate,
            ),
            (
                "worker_engine_batch_size",
                "Batch of the engine: mean tokens per step over the window (vLLM), else running requests",
                load.batch_size,
            ),
        ):
            if value is not None:
                g = GaugeMetricFamily(self.prefix + name, doc, labels=labels)
                g.add_metric(self.label_values, value)
                yield g
        total = self.preemptions
        if total is not None:
            c = CounterMetricFamily(
                self.prefix + "worker_engine_preemptions",
                "Preemptions in the engine (SGLang: retractions)",
                labels=labels,
            )
            c.add_metric(self.label_values, total)
            yield c


class WorkerMetrics:
    """The worker's families, every one labelled ``pool`` (a worker serves one pool, so the
    children are bound once here and the hot path never looks a label up)."""

    def __init__(self, metrics: Metrics, pool: str = "", engine: str = "") -> None:
        m = metrics
        self.pool = pool
        self._attempts = m.counter("worker_attempts_total", "Attempts taken, by outcome", ("pool", "outcome"))
        self._by_outcome: dict[str, Any] = {}
        p = ("pool",)

        def hist(name: str, doc: str, buckets: tuple[float, ...] = LATENCY_BUCKETS) -> Any:
            return m.histogram(name, doc, p, buckets=buckets).labels(pool)

        self.in_flight = m.gauge("worker_in_flight_requests", "Attempts running on the engine now", p).labels(pool)
        self.capacity = m.gauge("worker_capacity_requests", "Concurrent attempts this worker accepts", p).labels(pool)
        self.engine_ready = m.gauge("worker_engine_ready", "1 while the engine answers its health check", p).labels(
            pool
        )
        self.nats_queue = hist("worker_nats_queue_seconds", "Dispatch to take: wait in NATS")
        # Its legs: JetStream stored it -> this worker's handler has it (the wait for a pull, the
        # delivery), and the handler -> the attempt running (a slot, then the event loop's turn).
        # Dispatch -> stored, the rest, is the gateway's publish.
        self.jetstream_wait = hist("worker_jetstream_wait_seconds", "JetStream stored the request to the handler")
        self.intake = hist("worker_intake_seconds", "Message in the worker's handler to its attempt running")
        # How late a timer fires: every message and token waits about this long for its turn.
        self.loop_lag = hist(
            "worker_event_loop_lag_seconds", "How late a 0.1 s timer fires on the event loop", ITL_BUCKETS
        )
        self.ttft = hist("worker_ttft_seconds", "Engine call to first token")
        self.itl = m.bulk_histogram(
            "worker_itl_seconds", "Every gap between two engine chunks", {"pool": pool}, ITL_BUCKETS
        )
        self.engine_queue = hist("worker_engine_queue_seconds", "Inside the engine before scheduling, where known")
        self.prefill = hist("worker_prefill_seconds", "Scheduled to first token (TTFT less the engine queue)")
        self.decode = hist("worker_decode_seconds", "First token to last token")
        self.tpot = hist("worker_tpot_seconds", "Decode time per output token after the first", ITL_BUCKETS)
        self.e2e = hist("worker_e2e_seconds", "Take to terminal message")
        self.tokens = m.counter("worker_completion_tokens_total", "Completion tokens generated", p).labels(pool)
        self.prompt_tokens = m.counter("worker_prompt_tokens_total", "Prompt tokens processed", p).labels(pool)
        self.nats_msgs = m.counter(
            "worker_token_messages_total", "Token messages published (after coalescing)", p
        ).labels(pool)
        self.completion_len = hist("worker_request_completion_tokens", "Completion tokens per attempt", TOKEN_BUCKETS)
        self.event_publish_failures = m.counter(
            "worker_event_publish_failures_total",
            "Attempt events JetStream never confirmed within event_publish_retry_s (their charge is lost)",
            p,
        ).labels(pool)
        self.engine = EngineLoadCollector(m.namespace, pool, engine)
        m.registry.register(self.engine)

    def attempt(self, outcome: str) -> Any:
        """The attempts counter of one outcome (outcomes are a closed set: cached)."""
        child = self._by_outcome.get(outcome)
        if child is None:
            child = self._by_outcome[outcome] = self._attempts.labels(self.pool, outcome)
        return child

    def observe_timings(self, t: Timings, token_times: Sequence[float]) -> None:
        """One attempt's timings, at its end: each phase the engine reported, and every gap
        between consecutive engine chunks (ITL), not one figure per attempt."""
        if t.ttft_s is not None:
            self.ttft.observe(t.ttft_s)
        if t.engine_queue_s is not None:
            self.engine_queue.observe(t.engine_queue_s)
        if t.prefill_s is not None:
            self.prefill.observe(t.prefill_s)
        if t.decode_s is not None:
            self.decode.observe(t.decode_s)
        if t.tpot_s is not None:
            self.tpot.observe(t.tpot_s)
        self.e2e.observe(t.e2e_s)
        self.itl.observe_gaps(token_times)


@dataclass
class _Running:
    req: InferenceRequest
    msg: Msg
    received_at: float  # monotonic: the message reached this worker's handler
    task: asyncio.Task[None] | None = None
    last_progress: float = field(default_factory=time.monotonic)
    cancel_reason: str | None = None


class Worker:
    def __init__(self, settings: WorkerSettings, adapter: EngineAdapter, catalog: Catalog, metrics: Metrics) -> None:
        self.settings = settings
        self.adapter = adapter
        self.catalog = catalog
        self.topo = Topology(settings.infra.namespace)
        self.metrics = metrics
        self.m = WorkerMetrics(metrics, settings.pool, adapter.engine)
        self.m.capacity.set(settings.max_concurrency)
        self.models = settings.models or sorted({d.model for d in catalog.deployments if d.pool == settings.pool})
        self.nc: NATS | None = None
        self.js: JetStreamContext | None = None
        self.capacity = Capacity(settings.max_concurrency)
        self.running: dict[tuple[str, int], _Running] = {}
        self.cancelled: dict[tuple[str, int | None], float] = {}
        self.started_wall = 0.0  # wall clock at start(): older messages were sent to a predecessor
        self.engine_ready = False
        self.draining = False
        self._feeders: list[PullFeeder] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Task[None]] = set()
        self._engine_failures = 0
        self._outbox = Outbox(
            settings.publish_batch_ms / 1000.0, self.topo.batch_subject_for if settings.gateway_batches else None
        )
        self._load = EngineLoad()
        # Admission's inputs for the heartbeat: how long attempts held a slot lately, and how many
        # wait in the pool's queue (read with the engine's load, once per heartbeat interval).
        self._service_s: deque[float] = deque(maxlen=SERVICE_WINDOW)
        self._queued_by_priority: list[int] | None = None
        self._addressed_by_priority: list[int] | None = None
        self.instance_id = secrets.token_hex(6)  # this process's life under worker_id
        self._attempt_ctx = AttemptContext(
            worker_id=settings.worker_id,
            engine=adapter.engine,
            instance_id=self.instance_id,
            coalesce_s=settings.coalesce_ms / 1000.0,
            publish=self.publish_nowait,
            stream=adapter.stream,
            relay=_push_relay(adapter) if settings.push_relay else None,
            engine_queue_estimate=lambda: self._load.mean_queue_time_s,
            stall_timeout_s=settings.engine_stall_timeout_s,
            engine_lost=lambda: not self.engine_ready,
            on_engine_failure=self._engine_failed,
            lost_stall_s=settings.heartbeat_interval_s,
        )

    # -- lifecycle -------------------------------------------------------------------------
    def ready(self) -> bool:
        return bool(self.nc and self.nc.is_connected and self.engine_ready and not self.draining)

    async def start(self) -> None:
        s = self.settings
        self.started_wall = time.time()
        await self.adapter.start()
        self.nc = await connect_as(s.infra, f"worker-{s.worker_id}", metrics=self.metrics)
        self.js = self.nc.jetstream()
        await ensure_streams(self.js, self.topo, s.infra.events_max_bytes)
        common: dict[str, Any] = {
            "ack_policy": AckPolicy.EXPLICIT,
            "ack_wait": s.ack_wait_s,
            "max_deliver": s.max_deliver,
            "deliver_policy": DeliverPolicy.ALL,
            "max_ack_pending": -1,
            "max_waiting": 512,
        }
        levels = range(PRIORITY_LEVELS)
        # One queue per plan priority, in the pool and in this worker's own (attempts the router
        # addressed to it). Priority 0 of the pool is pulled with reserved slots; every other queue
        # up to `prefetch` messages at a time, each of which then waits for a slot at its level
        # (Capacity): higher priorities first, and a worker's own queue just ahead of the pool's
        # of the same priority. Prefetched, the next one is at hand when a slot frees (one at a
        # time, a lower waiter took every slot that freed during the next pull's round trip).
        for p in levels:
            await self.js.add_consumer(
                self.topo.requests_stream,
                ConsumerConfig(
                    durable_name=self.topo.pool_consumer(s.pool, p),
                    filter_subject=self.topo.pool_subject(s.pool, p),
                    **common,
                ),
            )
            await self.js.add_consumer(
                self.topo.requests_stream,
                ConsumerConfig(
                    durable_name=self.topo.worker_consumer(s.worker_id, p),
                    filter_subject=self.topo.worker_subject(s.pool, s.worker_id, p),
                    inactive_threshold=s.worker_consumer_inactive_s,
                    **common,
                ),
            )
        await self.nc.subscribe(self.topo.cancel_subject, cb=self._on_cancel)
        self._tasks.append(asyncio.create_task(self._outbox.run(self.nc), name="outbox"))

        nc = self.nc

        def unreserved(consumer: str, level: int) -> PullFeeder:
            # Priority 0's own queue holds little (other workers may be free for its messages);
            # a higher priority's queue is short and what it holds must be at hand.
            prefetch = (
                min(PREFETCH, s.max_concurrency // 16) if level < 2 else min(PREFETCH_HIGH, s.max_concurrency // 4)
            )
            f = PullFeeder(
                nc,
                self.topo.requests_stream,
                consumer,
                self.capacity,
                functools.partial(self._on_request, level=level),
                max_batch=max(1, prefetch),
                expires_s=s.pull_expires_s,
                reserve_slots=False,
            )
            self.capacity.watch_held(level, f.held)
            return f

        self._feeders = [
            PullFeeder(
                self.nc,
                self.topo.requests_stream,
                self.topo.pool_consumer(s.pool),
                self.capacity,
                functools.partial(self._on_request, level=0),
                max_batch=min(256, s.max_concurrency),
                expires_s=s.pull_expires_s,
            ),
            *(unreserved(self.topo.worker_consumer(s.worker_id, p), 2 * p + 1) for p in levels),
            *(unreserved(self.topo.pool_consumer(s.pool, p), 2 * p) for p in levels if p > 0),
        ]
        # Do not pull before the engine is known healthy.
        await self._check_engine()
        for f in self._feeders:
            if not self.engine_ready:
                f.gate.clear()
            await f.start()
        self._tasks.append(asyncio.create_task(self._heartbeat_loop(), name="heartbeat"))
        self._tasks.append(asyncio.create_task(self._loop_lag_probe(), name="loop-lag"))
        self._tasks.append(asyncio.create_task(self._engine_loop(), name="engine-watch"))
        log.info(
            "worker %s up: pool=%s engine=%s at %s, models=%s, concurrency=%d",
            s.worker_id,
            s.pool,
            self.adapter.engine,
            s.engine_url,
            self.models,
            s.max_concurrency,
        )

    async def drain(self, timeout: float) -> None:
        """Stop pulling, let running attempts finish (up to ``timeout``), then close."""
        self.draining = True
        for f in self._feeders:
            await f.stop_pulling()
        await self._publish_heartbeat()
        deadline = time.monotonic() + timeout
        while self.running and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for r in list(self.running.values()):
            r.cancel_reason = "worker_draining"
            if r.task:
                r.task.cancel()
        if self.running:
            await asyncio.sleep(0.1)
        for f in self._feeders:
            await f.close_after_pull(timeout=f.expires_s + 1)
        await self._outbox.flushed(2.0)
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.nc is not None:
            with contextlib.suppress(Exception):
                await self.nc.flush(timeout=2)
            await self.nc.close()
        await self.adapter.close()
        log.info("worker %s drained", self.settings.worker_id)

    def _pool_feeder(self) -> PullFeeder:
        return self._feeders[0]  # start() builds [pool, per-worker]

    # -- NATS plumbing ---------------------------------------------------------------------
    def publish_nowait(self, subject: str, payload: bytes) -> None:
        """Core publish from sync code, in order, without a task per message."""
        self._outbox.put(subject, payload)

    async def _publish_event(self, event: AttemptEvent) -> bool:
        """Publish the attempt's event and wait for JetStream's confirmation, retrying with backoff
        for up to ``event_publish_retry_s`` (the message id makes a retry land once); False if it
        never landed (logged and counted)."""
        assert self.js is not None
        payload = event.model_dump_json(exclude_none=True).encode()
        headers = {"Nats-Msg-Id": attempt_event_msg_id(event.request_id, event.attempt, event.source)}
        deadline = time.monotonic() + self.settings.event_publish_retry_s
        delay = 0.1
        while True:
            try:
                await self.js.publish(self.topo.attempt_event_subject, payload, headers=headers, timeout=5)
                return True
            except Exception:
                if time.monotonic() + delay > deadline:
                    self.m.event_publish_failures.inc()
                    log.exception("could not publish attempt event", extra={"request_id": event.request_id})
                    return False
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    async def _on_cancel(self, msg: Msg) -> None:
        try:
            c = CancelRequest.model_validate_json(msg.data)
        except ValidationError:
            log.warning("malformed cancel message dropped")
            return
        self.cancelled[(c.request_id, c.attempt)] = time.monotonic() + CANCEL_MEMORY_S
        hit = 0
        for key, r in list(self.running.items()):
            if key[0] == c.request_id and (c.attempt is None or key[1] == c.attempt) and r.task:
                r.cancel_reason = c.reason
                r.task.cancel()
                hit += 1
        if hit:
            log.info("cancel (%s) of %d running attempt(s)", c.reason, hit, extra={"request_id": c.request_id})

    def _is_cancelled(self, req: InferenceRequest) -> bool:
        return (req.request_id, req.attempt) in self.cancelled or (req.request_id, None) in self.cancelled

    # -- taking work -----------------------------------------------------------------------
    async def _on_request(self, msg: Msg, held_slot: bool, level: int = 0) -> None:
        """One request message from a queue whose slot level is ``level`` (``2 × priority`` for the
        pool's, ``2 × priority + 1`` for this worker's own; see :class:`~llmlab_worker.pull.Capacity`)."""
        received_at = time.monotonic()
        if self.draining or not self.engine_ready:
            # Someone else can run it now: hand it back without waiting for ack_wait.
            await msg.nak()
            if held_slot:
                await self.capacity.release(1)
            return
        try:
            req = InferenceRequest.model_validate_json(msg.data)
        except ValidationError as exc:
            await self._dead_letter(msg, str(exc))
            if held_slot:
                await self.capacity.release(1)
            return
        if not held_slot and not self.capacity.try_take(level) and not self._pool_feeder().steal_reserved():
            # Busy: wait for the next free slot, ahead of the pool feeder and of lower levels.
            await self.capacity.take_up_to(1, level=level)
        if not self._reply_subject_ok(req):
            # The worker publishes whatever the request names: only its gateway's token subject
            # for it may be named, never a subject of another role or another request.
            await self._dead_letter(
                msg, f"reply_subject {req.reply_subject[:100]!r} is not the request's token subject"
            )
            await self.capacity.release(1)
            return
        run = _Running(req=req, msg=msg, received_at=received_at)
        stored = getattr(msg.metadata, "timestamp", None)  # when JetStream stored it (wall clock)
        if stored is not None:
            self.m.jetstream_wait.observe(max(0.0, time.time() - stored.timestamp()))
        self.running[(req.request_id, req.attempt)] = run
        self.m.in_flight.set(len(self.running))
        run.task = asyncio.create_task(self._run(run), name=f"attempt:{req.request_id}:{req.attempt}")

    def _reply_subject_ok(self, req: InferenceRequest) -> bool:
        try:
            return req.reply_subject == self.topo.token_subject(req.gateway_id, req.request_id)
        except ValueError:  # a gateway or request id that is no subject token
            return False

    async def _dead_letter(self, msg: Msg, why: str) -> None:
        assert self.js is not None
        log.error("malformed request message dead-lettered: %s", why[:300])
        with contextlib.suppress(Exception):
            await self.js.publish(self.topo.dead_letter_subject, msg.data, headers={"Llmlab-Reason": why[:200]})
        await msg.term()
        self.m.attempt("malformed").inc()

    async def _still_wanted(self, req: InferenceRequest) -> bool:
        """A redelivered attempt runs only if its gateway still waits for exactly this attempt."""
        assert self.nc is not None
        probe = AliveProbe(request_id=req.request_id, attempt=req.attempt)
        try:
            reply = await self.nc.request(
                self.topo.alive_subject(req.gateway_id),
                probe.model_dump_json().encode(),
                timeout=self.settings.alive_probe_timeout_s,
            )
            return AliveReply.model_validate_json(reply.data).wanted
        except Exception:
            return False  # gateway gone or silent: nobody would read the stream

    async def _run(self, run: _Running) -> None:
        req, msg = run.req, run.msg
        token = request_id_var.set(req.request_id)
        t0 = time.monotonic()
        self.m.intake.observe(t0 - run.received_at)
        try:
            result = await run_attempt(
                self._attempt_ctx,
                req,
                taken_wall=time.time(),
                taken_at=time.monotonic(),
                cancelled=self._is_cancelled(req),
                # Delivered before, or sent before this process started (a restarted worker of the same
                # id reads its predecessor's queue, whose gateway may have declared it lost and moved
                # on): either may be stale, so its gateway is asked first.
                redelivered=msg.metadata.num_delivered > 1 or req.dispatched_at < self.started_wall,
                still_wanted=lambda: self._still_wanted(req),
            )
            if result.started:
                self.m.nats_queue.observe(result.nats_queue_s)
                self._service_s.append(time.monotonic() - t0)
            self.m.nats_msgs.inc(result.token_messages)
            await self._finish(run, result)
        finally:
            request_id_var.reset(token)

    async def _finish(self, run: _Running, result: AttemptResult) -> None:
        req, msg = run.req, run.msg
        self.running.pop((req.request_id, req.attempt), None)
        self.m.in_flight.set(len(self.running))
        await self.capacity.release(1)
        outcome, usage, t = result.outcome, result.usage, result.timings
        self.m.attempt(outcome).inc()
        if usage is not None:
            self.m.tokens.inc(usage.completion_tokens)
            self.m.prompt_tokens.inc(usage.prompt_tokens)
            self.m.completion_len.observe(usage.completion_tokens)
        if t is not None:
            self.m.observe_timings(t, result.token_times)
        deployment = self.catalog.deployment(req.deployment)
        event = AttemptEvent(
            request_id=req.request_id,
            attempt=req.attempt,
            outcome=outcome,
            source="worker",
            worker_id=self.settings.worker_id,
            pool=req.pool,
            deployment=req.deployment,
            model=deployment.model if deployment else req.model,
            engine=self.adapter.engine,
            endpoint=req.endpoint,
            principal=req.principal,
            finish_reason=result.finish,
            usage=usage,
            timings=t,
            error=result.error,
            route=req.route,
            created_at=req.created_at,
            ended_at=result.ended_wall or time.time(),
            resumed_tokens=req.resume.tokens if req.resume is not None else 0,
        )
        if run.cancel_reason:
            log.info("attempt %d cancelled: %s", req.attempt, run.cancel_reason)
        # The event (what the request is charged and billed by) is confirmed by JetStream before
        # the request message is acked: a crash in between redelivers the request (dropped as
        # stale, its event already stored), where acking first lost the charge.
        await self._publish_event(event)
        try:
            await msg.ack()
        except Exception:
            log.warning("ack failed (redelivery will be dropped as stale)")

    # -- health, load and heartbeats ---------------------------------------------------------
    async def _check_engine(self) -> None:
        probe_started = time.monotonic()
        ok = await self.adapter.healthy()
        if ok:
            self._engine_failures = 0
        elif self._attempt_ctx.activity.last_output_at >= probe_started - self.settings.heartbeat_interval_s:
            # A busy engine can answer its health probe late (vLLM's API server answers /health on
            # the event loop that relays every stream; a starved CPU host stalls both), but one
            # that sent tokens since the last check is alive: a failed probe then is not counted,
            # and a stream that does go silent is the stall watch's to end.
            log.info("engine health probe failed while the engine streams: not counted")
        else:
            self._engine_failures += 1
        await self._set_engine_ready(
            ok or (self.engine_ready and self._engine_failures < self.settings.engine_fail_threshold)
        )

    async def _set_engine_ready(self, ready: bool) -> None:
        was, self.engine_ready = self.engine_ready, ready
        self.m.engine_ready.set(1 if ready else 0)
        if was != ready:
            log.warning("engine %s", "ready" if ready else "LOST: stopped pulling, reporting unready")
            for f in self._feeders:
                if ready and not self.draining:
                    f.gate.set()
                elif not self.draining:  # draining: stop_pulling and close_after_pull own the feeders
                    await f.pause()
            await self._publish_heartbeat()  # tell gateways now, not at the next tick

    def _engine_failed(self) -> None:
        """An attempt failed for its engine's fault (connection lost, stream stalled, a 5xx): take
        no more work until a health check passes, so that the stream's continuation, or its retry,
        is taken by another worker rather than this one's broken engine."""
        self._engine_failures = max(self._engine_failures, self.settings.engine_fail_threshold)
        task = asyncio.create_task(self._set_engine_ready(False), name="engine-failed")
        self._background.add(task)  # held until done: the loop keeps only weak references
        task.add_done_callback(self._background.discard)

    async def _publish_heartbeat(self) -> None:
        if self.nc is None or not self.nc.is_connected:
            return
        hb = Heartbeat(
            worker_id=self.settings.worker_id,
            pool=self.settings.pool,
            engine=self.adapter.engine,
            models=self.models,
            max_concurrency=self.settings.max_concurrency,
            in_flight=len(self.running),
            ready=self.ready(),
            draining=self.draining,
            interval_s=self.settings.heartbeat_interval_s,
            sent_at=time.time(),
            load=self._load,
            instance_id=self.instance_id,
            queued_by_priority=self._queued_by_priority,
            addressed_by_priority=self._addressed_by_priority,
            mean_service_s=sum(self._service_s) / len(self._service_s) if self._service_s else None,
        )
        await self.nc.publish(
            self.topo.heartbeat_subject(self.settings.pool, self.settings.worker_id), hb.model_dump_json().encode()
        )

    async def _refresh_load(self) -> None:
        if not self.engine_ready:
            self._load = EngineLoad()
        else:
            try:
                self._load = await self.adapter.load()
            except Exception as exc:
                log.debug("engine metrics unavailable: %s", exc)
        self.m.engine.update(self._load)
        if self.js is not None:
            pool, topo = self.settings.pool, self.topo
            wid, levels = self.settings.worker_id, range(PRIORITY_LEVELS)
            counts = await asyncio.gather(
                *(self._pending(topo.pool_consumer(pool, p)) for p in levels),
                *(self._pending(topo.worker_consumer(wid, p)) for p in levels),
            )
            self._queued_by_priority = _known(counts[:PRIORITY_LEVELS])
            addressed = _known(counts[PRIORITY_LEVELS:])
            if addressed is not None:  # and what this worker holds, waiting for a slot
                for level, n in self.capacity.waiting_by_level().items():
                    addressed[level // 2] += n
            self._addressed_by_priority = addressed

    async def _pending(self, consumer: str) -> int | None:
        """Messages waiting in one of this worker's consumers; None (unknown, not 0: admission then
        does not guess) when JetStream does not answer."""
        assert self.js is not None
        try:
            return (await self.js.consumer_info(self.topo.requests_stream, consumer, timeout=1)).num_pending
        except Exception as exc:
            log.debug("queue length of %s unavailable: %s", consumer, exc)
            return None

    async def _loop_lag_probe(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            t = loop.time()
            await asyncio.sleep(LOOP_LAG_PROBE_S)
            self.m.loop_lag.observe(max(0.0, loop.time() - t - LOOP_LAG_PROBE_S))

    async def _heartbeat_loop(self) -> None:
        """Heartbeats on their own schedule, with the last known load: a hung engine (each health
        check and load poll waiting out its timeout) must not delay them, or gateways would take
        this worker for lost and move its streams although only its engine stalled."""
        interval = self.settings.heartbeat_interval_s
        while True:
            try:
                await self._publish_heartbeat()
                await self._keep_alive_running()
                now = time.monotonic()
                for key, expiry in list(self.cancelled.items()):
                    if expiry < now:
                        del self.cancelled[key]
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("heartbeat loop error")
            await asyncio.sleep(interval)

    async def _engine_loop(self) -> None:
        """Health checks and load polls of the engine, one heartbeat interval apart."""
        interval = self.settings.heartbeat_interval_s
        while True:
            try:
                await self._check_engine()
                await self._refresh_load()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("engine check error")
            await asyncio.sleep(interval)

    async def _keep_alive_running(self) -> None:
        """In-progress acks so JetStream does not redeliver a long generation."""
        now = time.monotonic()
        for r in list(self.running.values()):
            if now - r.last_progress > self.settings.ack_wait_s / 3:
                r.last_progress = now
                with contextlib.suppress(Exception):
                    await r.msg.in_progress()


def _push_relay(adapter: EngineAdapter) -> PushRelay | None:
    """The adapter's push path where it has one (the OpenAI-compatible HTTP adapters)."""
    push = getattr(adapter, "push_relay", None)
    return push() if push is not None else None


def _known(counts: Sequence[int | None]) -> list[int] | None:
    """Pending counts per priority, or None (unknown, not 0: admission then does not guess) when
    JetStream did not answer for one of them."""
    return None if any(n is None for n in counts) else [n or 0 for n in counts]
