"""The engine twin in real time: the twin's step scheduler (:mod:`llmlab_twin.sched`) on the event
loop behind the simulator's HTTP layer (``python -m llmlab_engine_sim --mode twin``), plus GPU-style
gauges of the simulated device. The scheduling itself is the twin library's; this module only
sleeps until each step's end and emits the step's tokens into the requests' sinks."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Hashable, Iterator, Sequence
from typing import Any

from llmlab_common.stats import quantile
from llmlab_twin.kvcache import KVConfig, num_gpu_blocks_from_kvcalc
from llmlab_twin.sched import (
    FixedStepCost,
    SeqState,
    StepCostModel,
    StepListener,
    StepScheduler,
    TwinConfig,
    TwinSeq,
    make_cost_model,
)

from llmlab_engine_sim.gpu import GpuProfile, UtilWindow
from llmlab_engine_sim.scheduler import (
    Clock,
    LoopScheduler,
    RealClock,
    RequestState,
    SchedulerObserver,
    SchedulerStats,
    SimRequest,
)

log = logging.getLogger(__name__)


class RealtimeTwinScheduler(LoopScheduler, StepListener):
    _task_name = "engine-twin-scheduler"

    """The step scheduler on the event loop, with the interface of
    :class:`llmlab_engine_sim.scheduler.Scheduler` that the HTTP layer and the flavours' metrics
    use. Sleeps until each step's end, then emits its tokens into the requests' sinks."""

    def __init__(
        self,
        config: TwinConfig,
        cost_model: StepCostModel,
        clock: Clock | None = None,
        observer: SchedulerObserver | None = None,
        *,
        lag_samples: int = 200_000,
    ) -> None:
        self.core = StepScheduler(config, cost_model, listener=self, keep_finished=False, record_steps=False)
        self.config = config
        self.clock: Clock = clock if clock is not None else RealClock()
        self.observer = observer if observer is not None else SchedulerObserver()
        self.stats = SchedulerStats()
        self._seqs: dict[str, TwinSeq] = {}
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Future[None] | None = None
        self.lags: deque[float] = deque(maxlen=lag_samples)  # wall lateness of each step's emission
        self.started_at: float | None = None

    # -- Scheduler interface -------------------------------------------------------------------

    @property
    def num_running(self) -> int:
        return self.core.num_running

    @property
    def num_waiting(self) -> int:
        return self.core.num_waiting

    @property
    def num_pending(self) -> int:
        return 0

    def get(self, req_id: str) -> SimRequest | None:
        s = self._seqs.get(req_id)
        return s.payload if s is not None else None

    def running_requests(self) -> Iterator[SimRequest]:
        return (s.payload for s in self.core.running())

    def snapshot(self) -> dict[str, Any]:
        tw = self.core.stats
        return {
            **super().snapshot(),
            "twin": {
                "simulated": True,
                "steps": tw.steps,
                "busy_s": tw.busy_s,
                "preemptions": tw.preemptions,
                "prefix_cache_queries": tw.prefix_queries,
                "prefix_cache_hits": tw.prefix_hits,
                "kv_usage": self.core.kv.usage,
                "kv_used_blocks": self.core.kv.used_blocks,
                "num_gpu_blocks": self.core.kv.total,
                "lag_ms": self.lag_summary_ms(),
            },
        }

    def lag_summary_ms(self) -> dict[str, float | int | None]:
        lags = sorted(self.lags)
        if not lags:
            return {"n": 0, "p50": None, "p99": None, "max": None}
        ms = 1000.0
        return {"n": len(lags), "p50": quantile(lags, 0.5) * ms, "p99": quantile(lags, 0.99) * ms, "max": lags[-1] * ms}

    def _live_ids(self) -> list[str]:
        return list(self._seqs)

    def submit(self, req: SimRequest, keys: Sequence[Hashable] = ()) -> None:
        if req.id in self._seqs:
            raise ValueError(f"duplicate request id {req.id}")
        now = self.clock.now()
        if req.arrival is None:
            req.arrival = now
        s = TwinSeq(
            req.id,
            max(1, req.prompt_tokens),
            len(req.plan.tokens),
            arrival=req.arrival,
            priority=req.priority,
            keys=keys,
            payload=req,
        )
        self._seqs[req.id] = s
        self.stats.received += 1
        req.state = RequestState.WAITING
        self.core.add(s, now)
        if s.state is SeqState.REJECTED:
            self._close(s, now, "abort")
            return
        if not self.core.busy:
            self._kick()

    def abort(self, req_id: str) -> bool:
        s = self._seqs.get(req_id)
        if s is None:
            return False
        now = self.clock.now()
        self.core.abort(s, now)
        self._close(s, now, "abort")
        return True

    def _close(self, s: TwinSeq, now: float, reason: str) -> None:
        self._seqs.pop(s.id, None)
        req: SimRequest = s.payload
        req.finished_at = now
        if reason == "abort":
            req.state = RequestState.ABORTED
            req.finish_reason = "abort"
            self.stats.aborted += 1
        else:
            req.state = RequestState.DONE
            req.finish_reason = reason
            st = self.stats
            st.finished += 1
            st.finished_by_reason[reason] = st.finished_by_reason.get(reason, 0) + 1
        self.observer.request_finished(req, now)
        req.sink.close()

    # -- StepListener ------------------------------------------------------------------------------

    def admitted(self, seqs: list[TwinSeq], t: float) -> None:
        for s in seqs:
            req: SimRequest = s.payload
            if req.admitted_at is None:
                req.admitted_at = s.admitted_at
                req.state = RequestState.PREFILL
                self.stats.prompt_tokens += req.prompt_tokens
                self.observer.request_admitted(req, t)

    def step_done(
        self, t: float, dur: float, first: list[TwinSeq], decoded: list[TwinSeq], finished: list[TwinSeq]
    ) -> None:
        self.lags.append(max(0.0, self.clock.now() - t))
        new: list[SimRequest] = []
        for s in decoded:
            self._emit(s.payload, t)
        for s in first:
            req: SimRequest = s.payload
            if req.first_token_at is None:
                req.first_token_at = t
                req.state = RequestState.DECODE
                new.append(req)
            self._emit(req, t)
        self.stats.generation_tokens += len(decoded) + len(first)
        self.observer.tokens_emitted(t, new, len(decoded) + len(first) - len(new), dur)
        for s in finished:
            self._close(s, t, s.payload.plan.finish_reason)

    @staticmethod
    def _emit(req: SimRequest, t: float) -> None:
        tokens = req.plan.tokens
        i = req.generated
        if i < len(tokens):
            req.sink.push(tokens[i])
            req.generated = i + 1
            req.last_token_at = t
            if req.token_times is not None:
                req.token_times.append(t)

    # -- the loop --------------------------------------------------------------------------------

    def _kick(self) -> None:
        wake = self._wake
        if wake is not None and not wake.done():
            wake.set_result(None)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        self.started_at = self.clock.now()
        log.info("twin scheduler started", extra={"max_num_seqs": self.config.max_num_seqs})
        try:
            while True:
                now = self.clock.now()
                end = self.core.step(now)
                while end is not None and end <= now + self.clock.resolution:
                    end = self.core.step(max(now, end))  # late: emit overdue steps, anchored to their ends
                wake: asyncio.Future[None] = loop.create_future()
                self._wake = wake
                timer = self.clock.call_at(end, self._kick) if end is not None else None
                try:
                    await wake
                finally:
                    self._wake = None
                    if timer is not None:
                        timer.cancel()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("twin scheduler loop crashed; aborting every request")
            for req_id in list(self._seqs):
                self.abort(req_id)
            raise


# -- the server's twin mode ------------------------------------------------------------------------------


def twin_scheduler_from_settings(
    settings: Any, clock: Clock | None = None, observer: SchedulerObserver | None = None
) -> RealtimeTwinScheduler:
    """The real-time twin for :class:`llmlab_engine_sim.settings.SimSettings` (``--mode twin``)."""
    s = settings
    if s.num_gpu_blocks is None:
        blocks = max(1, s.kv_cache_tokens // s.block_size)
    elif s.num_gpu_blocks == 0:
        blocks = num_gpu_blocks_from_kvcalc(
            s.twin_model,
            s.twin_device,
            block_size=s.block_size,
            gpu_memory_utilization=s.gpu_memory_utilization,
            dtype=s.twin_dtype,
        )
    else:
        blocks = s.num_gpu_blocks
    cost: StepCostModel = (
        FixedStepCost(s.fixed_step_ms / 1000.0)
        if s.fixed_step_ms is not None
        else make_cost_model(s.twin_model, s.twin_device, s.twin_dtype, engine=s.flavor)
    )
    cfg = TwinConfig(
        max_num_seqs=s.max_num_seqs,
        max_num_batched_tokens=s.max_num_batched_tokens,
        long_prefill_token_threshold=s.long_prefill_token_threshold,
        kv=KVConfig(
            num_gpu_blocks=blocks,
            block_size=s.block_size,
            prefix_caching=s.prefix_caching,
            prefix_style=s.prefix_style or ("sglang" if s.flavor == "sglang" else "vllm"),
            eviction_policy=s.eviction_policy,
        ),
    )
    log.info(
        "twin mode",
        extra={
            "twin_model": s.twin_model,
            "twin_device": s.twin_device,
            "num_gpu_blocks": blocks,
            "block_size": s.block_size,
            "fixed_step_ms": s.fixed_step_ms,
            "prefix_style": cfg.kv.prefix_style,
        },
    )
    return RealtimeTwinScheduler(cfg, cost, clock=clock, observer=observer)


class TwinGpuCollector:
    """GPU-style gauges of the twin (:mod:`llmlab_engine_sim.gpu`), under dcgm-exporter's names
    with ``simulated="true"``: utilisation = busy fraction of time since the previous window
    (percent), framebuffer used = weights + KV blocks in use (MiB), power = idle + (TDP - idle) x
    utilisation (W). All **simulated**: no GPU is read."""

    def __init__(self, twin: RealtimeTwinScheduler, settings: Any) -> None:
        self.twin = twin
        self.profile = GpuProfile(settings)
        self._window: UtilWindow | None = None

    def utilisation(self) -> float:
        now = self.twin.clock.now()
        if self._window is None:
            self._window = UtilWindow(self.twin.started_at if self.twin.started_at is not None else now)
        return self._window.update(now, self.twin.core.stats.busy_s)

    def collect(self) -> Iterator[Any]:
        util = self.utilisation()
        kv = self.twin.core.kv
        used = self.profile.weight_bytes + kv.used_blocks * kv.block_size * self.profile.kv_bytes_per_token
        return self.profile.families(util, used)
