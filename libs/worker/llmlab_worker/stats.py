"""Per-attempt timing: queue phases apart, ITL from engine arrival times (survives coalescing)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from llmlab_common.messages import Timings
from llmlab_common.stats import quantile


@dataclass
class AttemptClock:
    nats_queue_s: float
    taken_at: float  # monotonic, when the worker took the message
    engine_start: float | None = None  # monotonic, engine call sent
    token_times: list[float] = field(default_factory=list)  # monotonic arrival of each content chunk
    tokens: int = 0  # tokens of those chunks, as the engine counted them (a chunk may carry several)
    engine_queue_s: float | None = None  # inside the engine before scheduling, where it tells
    engine_queue_method: Literal["engine", "window_mean"] | None = None
    # The gateway's admission figures, passed through to the attempt's Timings.
    auth_s: float | None = None
    route_s: float | None = None
    dispatch_offset_s: float | None = None
    parse_s: float | None = None
    prep_s: float | None = None
    first_dispatch_offset_s: float | None = None

    def timings(self, completion_tokens: int, ended_at: float) -> Timings:
        engine_queue_s = self.engine_queue_s
        ttft = decode = tpot = p50 = p95 = p99 = None
        if self.engine_start is not None and self.token_times:
            first, last = self.token_times[0], self.token_times[-1]
            ttft = first - self.engine_start
            decode = last - first
            if completion_tokens > 1:
                tpot = decode / (completion_tokens - 1)
            gaps = sorted(b - a for a, b in zip(self.token_times, self.token_times[1:], strict=False))
            if gaps:
                p50, p95, p99 = quantile(gaps, 0.5), quantile(gaps, 0.95), quantile(gaps, 0.99)
        prefill = None if ttft is None or engine_queue_s is None else max(0.0, ttft - engine_queue_s)
        intake = finish = None
        if self.engine_start is not None:
            intake = self.engine_start - self.taken_at
            finish = ended_at - (self.token_times[-1] if self.token_times else self.engine_start)
        return Timings(
            nats_queue_s=self.nats_queue_s,
            engine_queue_s=engine_queue_s,
            ttft_s=ttft,
            prefill_s=prefill,
            decode_s=decode,
            e2e_s=ended_at - self.taken_at,
            itl_p50_s=p50,
            itl_p95_s=p95,
            itl_p99_s=p99,
            tpot_s=tpot,
            auth_s=self.auth_s,
            route_s=self.route_s,
            dispatch_offset_s=self.dispatch_offset_s,
            parse_s=self.parse_s,
            prep_s=self.prep_s,
            first_dispatch_offset_s=self.first_dispatch_offset_s,
            intake_s=intake,
            finish_s=finish,
            engine_queue_method=self.engine_queue_method if engine_queue_s is not None else None,
        )
