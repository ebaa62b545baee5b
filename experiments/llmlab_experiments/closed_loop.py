"""A closed-loop load on one engine twin, in virtual time: ``concurrency`` clients, each sending its next request
the moment its previous one ends (the benchmark clients' "concurrency C" of tutorial §2 and §0). The trace's
arrival times are ignored; its requests are taken in order. The first ``warmup`` requests are replayed but not
measured (warm-up apart from measurement). Every figure is SIMULATED."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import llmlab_twin.replay as replay
import numpy as np
from llmlab_twin.sched import SeqState, StepCostModel, StepScheduler, TwinSeq
from llmlab_twin.trace import TraceRequest


@dataclass
class ClosedLoopResult:
    worker: StepScheduler
    measured: list[TwinSeq]
    t_start: float  # issue time of the first measured request
    t_end: float  # the last request finished
    t_drain: float  # the request stream ran out: the load stops being steady here


def run_closed_loop(
    requests: Sequence[TraceRequest],
    concurrency: int,
    setup: replay.VirtualSetup,
    cost: StepCostModel,
    *,
    warmup: int = 0,
) -> ClosedLoopResult:
    if concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    w = StepScheduler(setup.config, cost)
    bs = setup.config.kv.block_size
    it = iter(requests)
    seqs: list[TwinSeq] = []
    drained: list[float] = []

    def issue(t: float) -> None:
        r = next(it, None)
        if r is None:
            if not drained:
                drained.append(t)
            return
        s = replay.make_seq(r, bs)
        s.arrival = t  # closed loop: sent when a client is free, not at the trace's time
        seqs.append(s)
        w.add(s, t)

    for _ in range(concurrency):
        issue(0.0)
    w.step(0.0)
    assert w.finished is not None
    seen = len(w.finished)  # requests the engine refused at add() are already there
    t_end = 0.0
    while w.step_end is not None:
        end = w.step_end
        w.step(end)
        t_end = end
        n = len(w.finished)
        for _ in range(n - seen):  # each finished request frees one client, which sends the next
            issue(end)
        seen = n
        if w.step_end is None and w.has_work:
            w.step(end)
    measured = seqs[warmup:]
    t_start = measured[0].arrival if measured and measured[0].arrival is not None else 0.0
    return ClosedLoopResult(w, measured, t_start, t_end, drained[0] if drained else t_end)


def summary(res: ClosedLoopResult, setup: replay.VirtualSetup, slo: dict[str, replay.Slo]) -> dict[str, Any]:
    """TTFT/TPOT over the measured requests, ITL over every decode step (weighted by sequences). Requests/s,
    goodput and tokens/s over the steady window, from the first measured issue until the request stream ran out
    (the drain tail, where fewer than ``concurrency`` clients remain, is left out), counting requests that
    finished inside it."""
    base = replay.summarize([res.worker], res.measured, res.t_end, setup, slo)
    hi = res.t_drain if res.t_drain > res.t_start else res.t_end
    span = max(hi - res.t_start, 1e-9)
    done = [s for s in res.measured if s.state is SeqState.DONE]
    inside = [s for s in done if s.finished_at is not None and s.finished_at <= hi]
    met = sum(1 for s in inside if (slo.get(s.slo_class or "interactive") or replay.Slo()).met(s))
    gen = sum(s.generated for s in inside)
    queries = sum(s.prompt for s in done)
    cached = sum(s.cached_tokens for s in done)
    return {
        "requests": len(res.measured),
        "finished": len(done),
        "window_s": round(span, 6),
        "ttft_s": base["ttft_s"],
        "tpot_s": base["tpot_s"],
        "itl_s": base["itl_s"],
        "e2e_s": base["e2e_s"],
        "queue_s": base["queue_s"],
        "throughput_rps": round(len(inside) / span, 6),
        "goodput_rps": round(met / span, 6),
        "output_tokens_per_s": round(gen / span, 3),
        "prefix_hit_rate_measured": round(cached / queries, 6) if queries else None,
        "preemptions": base["preemptions"],
        "kv_usage_max": base["kv_usage_max"],
        "mean_batch": round(float(np.mean(res.worker.step_decodes)), 3) if res.worker.step_decodes else 0.0,
    }
