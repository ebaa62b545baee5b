"""The simulated engine: one scheduler loop that owns time (no FastAPI, no NATS here).

Model (the "fixed latency" step model of this simulator):

* Requests wait in the engine queue (FIFO; lower ``priority`` first) until one of
  ``max_num_seqs`` slots is free. Queue time = admission - arrival.
* An admitted request emits its first token ``ttft`` after admission, then one token every
  ``itl``. All times lie on one grid of ticks ``t0 + k·tick`` (``tick`` = ``itl / phases``):
  an idle engine admits at once (re-anchoring ``t0``), a busy one at the next tick, so a request
  waits at most one tick for a free slot. Every token of every request falls on the emission grid
  ``t0 + ttft + k·tick``, and requests admitted at ticks ``k`` with the same ``k mod phases``
  share a phase: one wake-up emits a token for all of them. The loop therefore wakes at most
  ``phases`` times per ITL however many streams run (1,000 streams cost a few timers per ITL,
  not 1,000). ``phases = 1`` is a strict step loop: one wake-up per ITL, admissions at step
  boundaries (up to one ITL of queueing, as in a real engine between steps).
* Tick times are computed from the anchor, not accumulated, so there is no drift; a late
  wake-up emits the overdue ticks in order.
* Aborting a request (client gone) removes it at once: the running/waiting counts drop
  immediately, the data structures forget it lazily at its next tick.

Time comes from a :class:`Clock`: :class:`RealClock` (the event loop's monotonic time) in the
server, :class:`VirtualClock` in tests and for trace replay, where time jumps from event to event.
Requests may carry a future ``arrival`` (trace replay): they sit in a pending heap until then.

Extension points for the calibrated twin: :meth:`Scheduler._admit` (admission policy, KV blocks,
preemption), :meth:`Scheduler._process_tick` (what one step does) and the step-time model, here
the constants ``ttft_s``/``itl_s`` of :class:`SchedulerConfig`.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import heapq
import itertools
import logging
import math
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

log = logging.getLogger(__name__)


# -- clocks -------------------------------------------------------------------------------------


class TimerHandle(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    """Where the scheduler gets time from. ``resolution``: events this close to ``now`` are due."""

    resolution: float

    def now(self) -> float: ...

    def call_at(self, when: float, callback: Callable[[], None]) -> TimerHandle: ...

    async def sleep_until(self, when: float) -> None: ...


class RealClock:
    """The running event loop's monotonic clock (seconds)."""

    # uvloop's timers (and cached loop time) have millisecond resolution.
    resolution = 1e-3

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    def call_at(self, when: float, callback: Callable[[], None]) -> TimerHandle:
        return asyncio.get_running_loop().call_at(when, callback)

    async def sleep_until(self, when: float) -> None:
        await asyncio.sleep(max(0.0, when - self.now()))


class _VirtualTimer:
    __slots__ = ("callback", "cancelled", "when")

    def __init__(self, when: float, callback: Callable[[], None]) -> None:
        self.when = when
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class VirtualClock:
    """Simulated time that only moves when told to (:meth:`advance_to`) or from event to event
    (:meth:`run_until_idle`); timers fire in time order and the tasks they wake run before time
    moves on. Exact: no wall time is involved."""

    resolution = 1e-9

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._timers: list[tuple[float, int, _VirtualTimer]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        return self._now

    def call_at(self, when: float, callback: Callable[[], None]) -> TimerHandle:
        timer = _VirtualTimer(max(when, self._now), callback)
        heapq.heappush(self._timers, (timer.when, next(self._seq), timer))
        return timer

    async def sleep_until(self, when: float) -> None:
        if when <= self._now:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.call_at(when, lambda: None if fut.done() else fut.set_result(None))
        await fut

    def next_deadline(self) -> float | None:
        timers = self._timers
        while timers and timers[0][2].cancelled:
            heapq.heappop(timers)
        return timers[0][0] if timers else None

    @staticmethod
    async def settle(rounds: int = 20) -> None:
        """Let ready tasks run (a few event-loop rounds) without moving time."""
        for _ in range(rounds):
            await asyncio.sleep(0)

    async def advance_to(self, when: float) -> None:
        await self.settle()
        while (deadline := self.next_deadline()) is not None and deadline <= when:
            _, _, timer = heapq.heappop(self._timers)
            self._now = max(self._now, timer.when)
            timer.callback()
            await self.settle()
        self._now = max(self._now, when)
        await self.settle()

    async def advance(self, seconds: float) -> None:
        await self.advance_to(self._now + seconds)

    async def run_until_idle(self, limit: float = math.inf) -> None:
        """Jump from timer to timer until none is left (or the next is after ``limit``)."""
        await self.settle()
        while (deadline := self.next_deadline()) is not None and deadline <= limit:
            await self.advance_to(deadline)


# -- requests -----------------------------------------------------------------------------------


class RequestState(enum.Enum):
    PENDING = "pending"  # arrival time still in the future (trace replay)
    WAITING = "waiting"  # in the engine queue
    PREFILL = "prefill"  # admitted, first token not yet out
    DECODE = "decode"
    DONE = "done"
    ABORTED = "aborted"


RUNNING_STATES = (RequestState.PREFILL, RequestState.DECODE)


@dataclass(slots=True)
class OutputPlan:
    """What the request will generate: one text piece per token (a piece may be empty, e.g. the
    tokens of a stop string), and the finish reason once all are out."""

    tokens: list[str]
    finish_reason: str

    def __post_init__(self) -> None:
        if not self.tokens:
            raise ValueError("an output plan needs at least one token")


class TokenSink:
    """Per-request mailbox of emitted token texts: the scheduler pushes, one consumer drains.

    Cheaper than an ``asyncio.Queue``: one future per wait, and the consumer takes everything
    buffered at once (several tokens after a late wake-up)."""

    __slots__ = ("_waiter", "buf", "closed", "eager")

    def __init__(self, eager: bool = True) -> None:
        self.buf: list[str] = []
        self.closed = False
        self.eager = eager  # False: wake the consumer only when the request ends
        self._waiter: asyncio.Future[None] | None = None

    def push(self, text: str) -> None:
        self.buf.append(text)
        if self.eager:
            self._wake()

    def close(self) -> None:
        self.closed = True
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self) -> None:
        """Return once there is something to take (eager sinks) or the request has ended."""
        if self.closed or (self.buf and self.eager):
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiter = waiter
        try:
            await waiter
        finally:
            self._waiter = None

    def take(self) -> list[str]:
        buf, self.buf = self.buf, []
        return buf


@dataclass(slots=True, eq=False)
class SimRequest:
    id: str
    prompt_tokens: int
    plan: OutputPlan
    priority: int = 0  # lower is served first (vLLM's convention); FIFO among equals
    arrival: float | None = None  # clock time; None: when submitted; later: trace replay
    sink: TokenSink = field(default_factory=TokenSink)
    token_times: list[float] | None = None  # set to [] to record each token's emission time
    state: RequestState = RequestState.WAITING
    admitted_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    finished_at: float | None = None
    generated: int = 0
    finish_reason: str | None = None  # the plan's reason, or "abort"
    seq: int = 0

    @property
    def queue_time(self) -> float | None:
        if self.admitted_at is None or self.arrival is None:
            return None
        return self.admitted_at - self.arrival

    @property
    def ttft(self) -> float | None:
        if self.first_token_at is None or self.arrival is None:
            return None
        return self.first_token_at - self.arrival

    @property
    def e2e(self) -> float | None:
        if self.finished_at is None or self.arrival is None:
            return None
        return self.finished_at - self.arrival


# -- scheduler ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    max_num_seqs: int
    ttft_s: float
    itl_s: float
    # Target tick (timer granularity): the ITL is split into round(itl / tick) phases.
    tick_s: float = 0.001

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1 or self.ttft_s <= 0 or self.itl_s <= 0 or self.tick_s <= 0:
            raise ValueError("max_num_seqs must be >= 1 and ttft_s, itl_s, tick_s > 0")

    @property
    def phases(self) -> int:
        return max(1, round(self.itl_s / self.tick_s))


class SchedulerObserver:
    """Hooks for metrics; every method is called synchronously from the scheduler loop (or from
    ``abort``) and must be cheap. The base class ignores everything."""

    def request_admitted(self, req: SimRequest, now: float) -> None:
        """Left the queue (``req.queue_time`` is known)."""

    def tokens_emitted(self, now: float, first: list[SimRequest], decode_count: int, itl: float) -> None:
        """One tick: ``first`` emitted their first token, ``decode_count`` others one more token
        each, all ``itl`` seconds after their previous one."""

    def request_finished(self, req: SimRequest, now: float) -> None:
        """Ended: ``req.finish_reason`` is the plan's reason or ``"abort"``."""


@dataclass
class SchedulerStats:
    received: int = 0
    finished: int = 0  # ended normally (stop/length); aborted ones are counted apart
    aborted: int = 0
    finished_by_reason: dict[str, int] = field(default_factory=dict)
    prompt_tokens: int = 0  # of admitted requests
    generation_tokens: int = 0


class LoopScheduler:
    """What every real-time scheduler shares: one loop task that owns time, request counters, the
    stop that aborts what has not ended. Subclasses provide ``_run``, ``_live_ids``, ``abort`` and
    the ``num_*`` figures."""

    _task_name = "engine-sim-scheduler"
    stats: SchedulerStats
    clock: Clock
    _task: asyncio.Task[None] | None = None

    @property
    def num_running(self) -> int:
        raise NotImplementedError

    @property
    def num_waiting(self) -> int:
        raise NotImplementedError

    @property
    def num_pending(self) -> int:
        raise NotImplementedError

    @property
    def alive(self) -> bool:
        return self._task is not None and not self._task.done()

    async def _run(self) -> None:
        raise NotImplementedError

    def _live_ids(self) -> list[str]:
        raise NotImplementedError

    def abort(self, req_id: str) -> bool:
        raise NotImplementedError

    def submit(self, req: SimRequest) -> None:
        raise NotImplementedError

    def running_requests(self) -> Iterator[SimRequest]:
        raise NotImplementedError

    def snapshot(self) -> dict[str, Any]:
        s = self.stats
        return {
            "received": s.received,
            "running": self.num_running,
            "waiting": self.num_waiting,
            "pending": self.num_pending,
            "aborted": s.aborted,
            "finished": s.finished,
            "finished_by_reason": dict(s.finished_by_reason),
            "prompt_tokens": s.prompt_tokens,
            "generation_tokens": s.generation_tokens,
        }

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=self._task_name)

    async def stop(self) -> None:
        """Stop the loop and abort whatever has not ended (their consumers see ``"abort"``)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for req_id in self._live_ids():
            self.abort(req_id)


class Scheduler(LoopScheduler):
    """Continuous batching on a tick grid, driven by one loop task; see the module docstring."""

    def __init__(
        self,
        config: SchedulerConfig,
        clock: Clock | None = None,
        observer: SchedulerObserver | None = None,
    ) -> None:
        self.config = config
        self.clock: Clock = clock if clock is not None else RealClock()
        self.observer = observer if observer is not None else SchedulerObserver()
        self.stats = SchedulerStats()
        self._max = config.max_num_seqs
        self._ttft = config.ttft_s
        self._itl = config.itl_s
        self._phases = config.phases
        self._tick = config.itl_s / self._phases
        self._requests: dict[str, SimRequest] = {}  # every request not yet ended, by id
        self._pending: list[tuple[float, int, SimRequest]] = []  # future arrivals
        self._waiting: list[tuple[int, int, SimRequest]] = []  # (priority, seq): FIFO among equals
        self._num_pending = 0
        self._num_waiting = 0
        self._num_running = 0
        # Admitted, first token not yet out: buckets by emission tick, in tick order.
        self._prefill: deque[tuple[int, list[SimRequest]]] = deque()
        # Decoding requests by phase: phase p emits at every tick k with k % phases == p.
        self._decode: list[list[SimRequest]] = [[] for _ in range(self._phases)]
        self._t0 = 0.0  # anchor of the tick grid
        self._next_tick = 0  # first emission tick not yet processed
        self._last_tick_at: list[float | None] = [None] * self._phases  # per phase
        self._seq = itertools.count()
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Future[None] | None = None

    # -- public API -------------------------------------------------------------------------

    @property
    def num_running(self) -> int:
        return self._num_running

    @property
    def num_waiting(self) -> int:
        return self._num_waiting

    @property
    def num_pending(self) -> int:
        return self._num_pending

    def get(self, req_id: str) -> SimRequest | None:
        return self._requests.get(req_id)

    def running_requests(self) -> Iterator[SimRequest]:
        return (r for r in self._requests.values() if r.state in RUNNING_STATES)

    def _live_ids(self) -> list[str]:
        return list(self._requests)

    def submit(self, req: SimRequest) -> None:
        if req.id in self._requests:
            raise ValueError(f"duplicate request id {req.id}")
        now = self.clock.now()
        if req.arrival is None:
            req.arrival = now
        req.seq = next(self._seq)
        self._requests[req.id] = req
        self.stats.received += 1
        if req.arrival > now + self.clock.resolution:
            req.state = RequestState.PENDING
            heapq.heappush(self._pending, (req.arrival, req.seq, req))
            self._num_pending += 1
            self._kick()
        else:
            self._enqueue(req)
            if self._num_running < self._max:
                self._kick()

    def abort(self, req_id: str) -> bool:
        """End a request now (client disconnected). False if it had already ended."""
        req = self._requests.pop(req_id, None)
        if req is None:
            return False
        state = req.state
        if state in RUNNING_STATES:
            self._num_running -= 1
            if self._num_waiting:
                self._kick()  # a slot is free for the queue
        elif state is RequestState.WAITING:
            self._num_waiting -= 1
        elif state is RequestState.PENDING:
            self._num_pending -= 1
        now = self.clock.now()
        req.state = RequestState.ABORTED
        req.finish_reason = "abort"
        req.finished_at = now
        self.stats.aborted += 1
        self.observer.request_finished(req, now)
        req.sink.close()
        return True

    # -- the loop -----------------------------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        log.info(
            "scheduler started",
            extra={"max_num_seqs": self._max, "ttft_s": self._ttft, "itl_s": self._itl, "phases": self._phases},
        )
        try:
            while True:
                now = self.clock.now()
                self._advance(now)
                when = self._next_event_time(now)
                wake: asyncio.Future[None] = loop.create_future()
                self._wake = wake
                timer = self.clock.call_at(when, self._kick) if when is not None else None
                try:
                    await wake  # idle (no timer) until submit/abort kicks us
                finally:
                    self._wake = None
                    if timer is not None:
                        timer.cancel()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("scheduler loop crashed; aborting every request")
            for req_id in list(self._requests):
                self.abort(req_id)
            raise

    def _kick(self) -> None:
        wake = self._wake
        if wake is not None and not wake.done():
            wake.set_result(None)

    def _advance(self, now: float) -> None:
        """Process everything due at ``now``."""
        due = now + self.clock.resolution
        pending = self._pending
        while pending and pending[0][0] <= due:
            _, _, req = heapq.heappop(pending)
            if req.state is RequestState.PENDING:
                self._num_pending -= 1
                self._enqueue(req)
        self._admit(now)
        self._emit_due(now)
        self._admit(now)  # slots freed by requests that finished at this tick

    def _next_event_time(self, now: float) -> float | None:
        times: list[float] = []
        if self._num_running:
            tick = self._next_emission_tick()
            if tick is not None:
                times.append(self._tick_time(tick))
            if self._num_waiting and self._num_running < self._max:
                times.append(self._t0 + self._boundary_after(now) * self._tick)
        if self._pending:
            times.append(self._pending[0][0])
        return min(times) if times else None

    # -- grid arithmetic ------------------------------------------------------------------------

    def _tick_time(self, tick: int) -> float:
        return self._t0 + self._ttft + tick * self._tick

    def _boundary_at_or_after(self, now: float) -> int:
        return max(0, math.ceil((now - self._t0 - self.clock.resolution) / self._tick))

    def _boundary_after(self, now: float) -> int:
        return max(0, math.floor((now - self._t0 + self.clock.resolution) / self._tick) + 1)

    def _next_emission_tick(self) -> int | None:
        """The first tick from ``_next_tick`` on with something to emit (empty ticks are skipped)."""
        best = self._prefill[0][0] if self._prefill else None
        decode, phases, start = self._decode, self._phases, self._next_tick
        for offset in range(phases):
            if best is not None and start + offset >= best:
                break
            if decode[(start + offset) % phases]:
                return start + offset
        return best

    # -- steps ------------------------------------------------------------------------------------

    def _enqueue(self, req: SimRequest) -> None:
        req.state = RequestState.WAITING
        heapq.heappush(self._waiting, (req.priority, req.seq, req))
        self._num_waiting += 1

    def _admit(self, now: float) -> None:
        if not self._num_waiting or self._num_running >= self._max:
            return
        if self._num_running == 0:
            # Idle engine: a step starts now; re-anchor the grid (drop lazily-kept aborted ones).
            self._t0 = now
            self._next_tick = 0
            self._last_tick_at = [None] * self._phases
            self._prefill.clear()
            self._decode = [[] for _ in range(self._phases)]
            tick = 0
        else:
            tick = self._boundary_at_or_after(now)
            if self._t0 + tick * self._tick > now + self.clock.resolution:
                return  # admitted at the next tick
            tick = max(tick, self._next_tick)
        if self._prefill and self._prefill[-1][0] == tick:
            bucket = self._prefill[-1][1]
        else:
            bucket = []
            self._prefill.append((tick, bucket))
        waiting = self._waiting
        while self._num_waiting and self._num_running < self._max:
            _, _, req = heapq.heappop(waiting)
            if req.state is not RequestState.WAITING:
                continue  # aborted while waiting
            self._num_waiting -= 1
            self._num_running += 1
            req.state = RequestState.PREFILL
            req.admitted_at = now
            self.stats.prompt_tokens += req.prompt_tokens
            bucket.append(req)
            self.observer.request_admitted(req, now)

    def _emit_due(self, now: float) -> None:
        due = now + self.clock.resolution
        while self._num_running:
            tick = self._next_emission_tick()
            if tick is None or self._tick_time(tick) > due:
                return
            self._process_tick(tick, now)
            self._next_tick = tick + 1

    def _process_tick(self, tick: int, now: float) -> None:
        """One tick: the requests of this tick's phase emit their next token, those whose prefill
        ends here their first one (and join the phase)."""
        phase = tick % self._phases
        last = self._last_tick_at[phase]
        itl = now - last if last is not None else 0.0
        survivors: list[SimRequest] = []
        decode_count = 0
        for req in self._decode[phase]:
            if req.state is not RequestState.DECODE:
                continue  # aborted since its last token
            decode_count += 1
            if self._emit(req, now):
                survivors.append(req)
        first: list[SimRequest] = []
        if self._prefill and self._prefill[0][0] == tick:
            _, bucket = self._prefill.popleft()
            for req in bucket:
                if req.state is not RequestState.PREFILL:
                    continue
                req.state = RequestState.DECODE
                req.first_token_at = now
                first.append(req)
                if self._emit(req, now):
                    survivors.append(req)
        self._decode[phase] = survivors
        self._last_tick_at[phase] = now
        self.stats.generation_tokens += decode_count + len(first)
        self.observer.tokens_emitted(now, first, decode_count, itl)

    def _emit(self, req: SimRequest, now: float) -> bool:
        """Emit the request's next token; False if that was its last."""
        tokens = req.plan.tokens
        i = req.generated
        req.sink.push(tokens[i])
        req.generated = i + 1
        req.last_token_at = now
        if req.token_times is not None:
            req.token_times.append(now)
        if i + 1 < len(tokens):
            return True
        self._finish(req, now, req.plan.finish_reason)
        return False

    def _finish(self, req: SimRequest, now: float, reason: str) -> None:
        req.state = RequestState.DONE
        req.finish_reason = reason
        req.finished_at = now
        self._num_running -= 1
        self._requests.pop(req.id, None)
        stats = self.stats
        stats.finished += 1
        stats.finished_by_reason[reason] = stats.finished_by_reason.get(reason, 0) + 1
        self.observer.request_finished(req, now)
        req.sink.close()
