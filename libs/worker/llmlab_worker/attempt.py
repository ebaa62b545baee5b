"""One attempt, from the message taken to its terminal message: the worker's per-attempt logic,
with no NATS in it. The NATS worker (:mod:`llmlab_worker.lifecycle`) takes a message, calls
:func:`run_attempt` with the engine's stream and a publish function, then acks, counts and
reports what it returns (as the gateway splits ``service.py`` from ``dispatch.py``)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import cast

from llmlab_common import rules
from llmlab_common.codes import Code
from llmlab_common.errors import EngineError, InvalidRequest, LLMLabError, NotFound, PayloadTooLarge, UpstreamTimeout
from llmlab_common.messages import (
    AttemptOutcome,
    ErrorInfo,
    FinishReason,
    InferenceRequest,
    StreamEnd,
    StreamError,
    StreamStarted,
    Timings,
    Usage,
    token_chunk_json,
)

from llmlab_worker.engine import EngineEvent, EngineRequestError, PushRelay
from llmlab_worker.stats import AttemptClock

log = logging.getLogger(__name__)

FINISH_REASONS: set[str] = {"stop", "length", "tool_calls", "content_filter"}
Publish = Callable[[str, bytes], None]  # core publish, in order, from sync code


class Coalescer:
    """Turns engine chunks into token messages: a chunk goes out at once unless the previous
    flush was under ``window`` ago, in which case it waits for the window to close. At low
    rates that adds nothing; under load it bounds messages per stream to 1/window."""

    def __init__(self, req: InferenceRequest, publish: Publish, window: float) -> None:
        self.req = req
        self.publish = publish
        self.window = window
        self.seq = 1  # 0 is the "started" message
        self.sent = 0  # token messages published
        self.text: list[str] = []
        self.times: list[float] = []
        self.tokens = 0  # tokens of the chunks waiting in text/times
        self.tools: list[dict[str, object]] = []
        self.last_flush = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self.engine_start = 0.0

    def add(self, text: str, tool_calls: list[dict[str, object]] | None, at: float, tokens: int = 1) -> None:
        if text:
            self.text.append(text)
        if tool_calls:
            self.tools.extend(tool_calls)
        self.times.append(at - self.engine_start)
        self.tokens += tokens
        if at - self.last_flush >= self.window:
            self.flush()
        elif self._timer is None:
            delay = max(0.0, self.last_flush + self.window - at)
            self._timer = asyncio.get_running_loop().call_later(delay, self.flush)

    def flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self.times:
            return
        # Written straight from our own fields (no model, no validation) on the per-token path.
        payload = token_chunk_json(
            self.req.request_id,
            self.req.attempt,
            self.next_seq(),
            "".join(self.text),
            self.times,
            self.tokens,
            self.tools or None,
        )
        self.text, self.times, self.tools, self.tokens = [], [], [], 0
        self.last_flush = time.monotonic()
        self.publish(self.req.reply_subject, payload)
        self.sent += 1

    def next_seq(self) -> int:
        s = self.seq
        self.seq += 1
        return s

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


@dataclass
class AttemptResult:
    """How an attempt ended: what the event reports and the metrics count."""

    outcome: AttemptOutcome
    started: bool  # StreamStarted went out (the engine was called)
    usage: Usage | None
    finish: FinishReason | None
    error: ErrorInfo | None
    timings: Timings | None  # None when it never started
    nats_queue_s: float
    token_messages: int
    # Monotonic arrival of each content chunk (the worker's ITL histogram observes every gap).
    token_times: list[float] = field(default_factory=list)
    # Wall clock when the attempt ended (its terminal message ready): the event's ended_at, so
    # accepted → ended spans exactly the phases of its timings (explain-latency checks the sum).
    ended_wall: float = 0.0


@dataclass
class EngineActivity:
    """When the engine last sent an attempt's content (monotonic), across the worker's attempts:
    an engine that streams is alive whatever its health endpoint answers meanwhile."""

    last_output_at: float = float("-inf")


@dataclass(frozen=True)
class AttemptContext:
    """What the attempt needs from the worker that runs it."""

    worker_id: str
    engine: str
    instance_id: str
    coalesce_s: float
    publish: Publish
    stream: Callable[[InferenceRequest], AsyncIterator[EngineEvent]]
    # The same events pushed to a callback as they are read, where the adapter can (preferred).
    relay: PushRelay | None = None
    # The engine's windowed mean queue time, for engines that do not report it per request.
    engine_queue_estimate: Callable[[], float | None] | None = None
    # An engine that sends nothing for this long after the first token has stalled (0: never).
    stall_timeout_s: float = 0.0
    # Whether the worker's health checks gave the engine up: then an attempt silent for one
    # check period has stalled too, before its first token as well.
    engine_lost: Callable[[], bool] | None = None
    lost_stall_s: float = 1.0
    # Told when an attempt failed for the engine's fault (no connection, a broken or stalled
    # stream, a 5xx): the worker takes no more work until a health check passes.
    on_engine_failure: Callable[[], None] | None = None
    activity: EngineActivity = field(default_factory=EngineActivity)


class StallWatch:
    """Ends an attempt whose engine went silent without closing its connection (a hung engine
    process, a wedged GPU): no output for ``stall_timeout_s`` after the first token, or for
    ``lost_stall_s`` once the health checks gave the engine up. Checked by one timer per attempt,
    not per token: the last output time is what the clock already records."""

    def __init__(self, ctx: AttemptContext, clock: AttemptClock, limit: asyncio.Timeout) -> None:
        self.ctx, self.clock, self.limit = ctx, clock, limit
        self.fired_after: float | None = None
        self.period = min(x for x in (ctx.stall_timeout_s or 1.0, ctx.lost_stall_s, 1.0) if x > 0)
        self._timer: asyncio.TimerHandle | None = asyncio.get_running_loop().call_later(self.period, self._check)

    def _check(self) -> None:
        c = self.clock
        silent = time.monotonic() - (c.token_times[-1] if c.token_times else c.engine_start or time.monotonic())
        lost = self.ctx.engine_lost is not None and self.ctx.engine_lost()
        stalled = (lost and silent >= self.ctx.lost_stall_s) or (
            self.ctx.stall_timeout_s > 0 and bool(c.token_times) and silent >= self.ctx.stall_timeout_s
        )
        if stalled:
            self._timer = None
            if not self.limit.expired():  # (the request's deadline may have fired first)
                self.fired_after = silent
                self.limit.reschedule(asyncio.get_running_loop().time())  # TimeoutError where the attempt waits
        else:
            self._timer = asyncio.get_running_loop().call_later(self.period, self._check)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


async def run_attempt(
    ctx: AttemptContext,
    req: InferenceRequest,
    *,
    taken_wall: float,
    taken_at: float,
    cancelled: bool,
    redelivered: bool,
    still_wanted: Callable[[], Awaitable[bool]],
) -> AttemptResult:
    """Run one attempt to its end. Never raises for the attempt's own failures, nor when the task
    running it is cancelled (a cancel is an outcome): each ends in one result, after the terminal
    message (StreamEnd or StreamError) when the stream had started."""
    clock = AttemptClock(
        nats_queue_s=max(0.0, taken_wall - req.dispatched_at),
        taken_at=taken_at,
        auth_s=req.auth_s,
        route_s=req.route_s,
        dispatch_offset_s=max(0.0, req.dispatched_at - req.created_at),
        parse_s=req.parse_s,
        prep_s=req.prep_s,
        first_dispatch_offset_s=req.first_dispatch_offset_s,
    )
    outcome: AttemptOutcome = "completed"
    usage: Usage | None = None
    finish: FinishReason | None = None
    error: ErrorInfo | None = None
    coalescer = Coalescer(req, ctx.publish, ctx.coalesce_s)
    started = False
    try:
        if cancelled:
            outcome = "cancelled"
            log.info("dropping attempt %d: cancelled before it started", req.attempt)
        elif taken_wall > req.start_deadline:
            outcome = "expired"
            log.info(
                "discarding expired attempt %d (%.2fs past its start deadline)",
                req.attempt,
                taken_wall - req.start_deadline,
            )
        elif redelivered and not await still_wanted():
            outcome = "stale"
            log.info("dropping redelivered attempt %d: its gateway no longer waits for it", req.attempt)
        else:
            log.debug("took attempt %d (%.1f ms in NATS)", req.attempt, clock.nats_queue_s * 1000)
            _publish(
                ctx,
                req,
                StreamStarted(
                    request_id=req.request_id,
                    attempt=req.attempt,
                    seq=0,
                    worker_id=ctx.worker_id,
                    engine=ctx.engine,
                    nats_queue_s=clock.nats_queue_s,
                    instance_id=ctx.instance_id,
                ),
            )
            started = True
            usage, finish = await _generate(ctx, req, clock, coalescer)
    except asyncio.CancelledError:
        outcome = "cancelled"
        finish = "cancelled"
    except EngineRequestError as exc:
        outcome = "engine_error"
        error = engine_error_info(exc)
        if rules.engine_failed(exc.status) and ctx.on_engine_failure is not None:
            ctx.on_engine_failure()
    except TimeoutError:
        outcome = "engine_error"
        error = UpstreamTimeout("request deadline reached").to_info()
    except Exception as exc:
        log.exception("attempt failed")
        outcome = "engine_error"
        error = LLMLabError(str(exc)[:300], code=Code.WORKER_ERROR).to_info()
    coalescer.flush()
    coalescer.close()
    ended, ended_wall = time.monotonic(), time.time()
    if usage is None and clock.token_times:
        # Cancelled or failed mid-stream: the engine sent no final usage; count what was generated
        # (the chunks' own token counts: a chunk may carry several tokens).
        usage = Usage(completion_tokens=clock.tokens, total_tokens=clock.tokens)
    timings = clock.timings(usage.completion_tokens if usage else len(clock.token_times), ended)
    if started and outcome == "completed" and usage is not None and finish not in (None, "cancelled"):
        _publish(
            ctx,
            req,
            StreamEnd(
                request_id=req.request_id,
                attempt=req.attempt,
                seq=coalescer.next_seq(),
                finish_reason=finish,
                usage=usage,
                timings=timings,
            ),
        )
    elif started and error is not None:
        _publish(
            ctx,
            req,
            StreamError(
                request_id=req.request_id,
                attempt=req.attempt,
                seq=coalescer.next_seq(),
                error=error,
                before_first_token=not clock.token_times,
                # Nothing reached the client and the engine may be fine elsewhere: retry.
                retryable=not clock.token_times and rules.engine_failed(error.status),
            ),
        )
    return AttemptResult(
        outcome=outcome,
        started=started,
        usage=usage,
        finish=finish,
        error=error,
        timings=timings if started else None,
        nats_queue_s=clock.nats_queue_s,
        token_messages=coalescer.sent,
        token_times=clock.token_times,
        ended_wall=ended_wall,
    )


async def _generate(
    ctx: AttemptContext, req: InferenceRequest, clock: AttemptClock, coalescer: Coalescer
) -> tuple[Usage, FinishReason]:
    remaining = req.deadline - time.time()
    watch: StallWatch | None = None
    try:
        async with asyncio.timeout(max(0.0, remaining)) as limit:
            clock.engine_start = coalescer.engine_start = time.monotonic()
            if ctx.stall_timeout_s > 0 or ctx.engine_lost is not None:
                watch = StallWatch(ctx, clock, limit)
            usage, finish = await _relay(ctx, req, clock, coalescer)
    except TimeoutError:
        if watch is None or watch.fired_after is None:
            raise  # the request's deadline
        # The engine failed, not the request: the gateway continues the stream elsewhere.
        raise EngineRequestError(504, f"engine stalled: no output for {watch.fired_after:.1f}s") from None
    finally:
        if watch is not None:
            watch.stop()
    if clock.engine_queue_s is None and ctx.engine_queue_estimate is not None:
        # The engine does not say how long this request queued inside it (vLLM's and SGLang's
        # OpenAI servers do not): take its mean queue time over the last heartbeat window.
        estimate = ctx.engine_queue_estimate()
        if estimate is not None:
            clock.engine_queue_s, clock.engine_queue_method = estimate, "window_mean"
    if usage is None:
        # Engines send usage last when asked (stream_options.include_usage); count what we saw.
        usage = Usage(completion_tokens=clock.tokens, total_tokens=clock.tokens)
    reason = cast(FinishReason, finish if finish in FINISH_REASONS else "stop")
    return usage, reason


class _Take:
    """The engine's events into the coalescer, one call per event (from the stream's loop, or
    pushed from the connection's reads): the clock's tokens and times, and the usage and finish
    reason when the engine sends them."""

    __slots__ = ("activity", "clock", "coalescer", "finish", "held", "usage")

    def __init__(self, clock: AttemptClock, coalescer: Coalescer, activity: EngineActivity) -> None:
        self.clock, self.coalescer, self.activity = clock, coalescer, activity
        self.held = 0  # tokens of chunks without text yet (a partial character): they come with the next
        self.usage: Usage | None = None
        self.finish: str | None = None

    def __call__(self, ev: EngineEvent) -> None:
        if ev.text or ev.tool_calls:
            n, self.held = ev.tokens + self.held, 0
            clock = self.clock
            clock.token_times.append(ev.at)
            self.activity.last_output_at = ev.at
            clock.tokens += n
            self.coalescer.add(ev.text, ev.tool_calls, ev.at, n)
        elif ev.engine_counted and ev.finish_reason is None:
            self.held += ev.tokens
        if ev.engine_queue_s is not None:
            self.clock.engine_queue_s, self.clock.engine_queue_method = ev.engine_queue_s, "engine"
        if ev.finish_reason:
            self.finish = ev.finish_reason
        if ev.usage is not None:
            self.usage = ev.usage


async def _relay(
    ctx: AttemptContext, req: InferenceRequest, clock: AttemptClock, coalescer: Coalescer
) -> tuple[Usage | None, str | None]:
    """The engine's stream into the coalescer; its usage and finish reason when it sent them."""
    take = _Take(clock, coalescer, ctx.activity)
    if ctx.relay is not None:
        await ctx.relay(req, take)
        return take.usage, take.finish
    stream = ctx.stream(req)
    try:
        async for ev in stream:
            take(ev)
    finally:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()
    return take.usage, take.finish


def _publish(ctx: AttemptContext, req: InferenceRequest, message: StreamStarted | StreamEnd | StreamError) -> None:
    ctx.publish(req.reply_subject, message.model_dump_json(exclude_none=True).encode())


def engine_error_info(exc: EngineRequestError) -> ErrorInfo:
    if exc.status in (400, 404, 413, 422):
        # The engine refused the request itself (e.g. prompt longer than the context): the
        # client's error, reported as such.
        rejected = {404: NotFound, 413: PayloadTooLarge}.get(exc.status, InvalidRequest)
        return rejected(exc.message, code=Code.ENGINE_REJECTED).to_info()
    return EngineError(f"engine error ({exc.status or 'no connection'}): {exc.message}").to_info()
