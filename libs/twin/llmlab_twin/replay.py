"""Trace replay in virtual time through N twins (every figure is **simulated**). The command line
(``python -m llmlab_lab.twin_replay virtual|realtime|speed|lag``) lives in the lab package.

Summary: goodput (requests meeting every limit of their SLO class, per second), SLO attainment
per class (``slo_classes`` of ``configs/catalog.yaml``: per request TTFT <= ``ttft_p95_s``,
TPOT <= ``tpot_s``, E2E <= ``e2e_s``, queue time <= ``queue_timeout_s``), TTFT/ITL/TPOT/E2E/queue
quantiles, tokens/s, cost per 1M tokens (device $/h x simulated hours x workers / tokens), prefix
hit rate, preemptions, KV usage, and overspend (``n/a`` until a budget hook is given).

Dispatch is pluggable: :data:`PICKERS` maps a name to ``pick(workers, seq) -> index``
(``round-robin``, ``least-loaded``); the router can register its own.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from llmlab_common import rules
from llmlab_common.catalog import load_catalog
from llmlab_common.settings import InfraSettings

from llmlab_twin.hwcatalog import get_device
from llmlab_twin.kvcache import KVConfig, num_gpu_blocks_from_kvcalc
from llmlab_twin.sched import (
    LinearCost,
    SeqState,
    StepCostModel,
    StepScheduler,
    TwinConfig,
    TwinSeq,
    group_keys,
    make_cost_model,
)
from llmlab_twin.trace import Trace, TraceRequest

log = logging.getLogger(__name__)

# -- SLO classes --------------------------------------------------------------------------------------


class Slo(rules.SloLimits):
    """An SLO class's per-request limits (the common :class:`~llmlab_common.rules.SloLimits`);
    :meth:`met` applies the one SLO rule, :func:`llmlab_common.rules.slo_verdict`, to a replayed
    request."""

    __slots__ = ()

    def met(self, s: TwinSeq) -> bool:
        # A twin request's TTFT and E2E run from its arrival: queue time included, as a client sees.
        return rules.slo_verdict(
            self,
            answered=s.state is SeqState.DONE,
            ttft_s=s.ttft,
            tpot_s=s.tpot,
            e2e_s=s.e2e,
            queue_s=s.queue_time,
        ).met


def load_slo_classes(catalog_path: str | Path | None = None) -> dict[str, Slo]:
    """The catalog's ``slo_classes`` (per-request limits: ``ttft_p95_s`` is applied per request).
    The catalog is ``catalog_path``, else the one of the settings (``LLMLAB_CATALOG_PATH``)."""
    cat = load_catalog(catalog_path or InfraSettings().catalog_path)
    return {
        name: Slo(ttft_s=c.ttft_p95_s, tpot_s=c.tpot_s, e2e_s=c.e2e_s, queue_s=c.queue_timeout_s)
        for name, c in cat.slo_classes.items()
    }


def device_usd_per_hour(device: str, catalog_path: str | Path | None = None) -> tuple[float | None, str]:
    """$/h of one device: the catalog's GPU price, else hardware.yaml's; (None, why) if neither."""
    try:
        cat = load_catalog(catalog_path or InfraSettings().catalog_path)
        price = cat.gpu_price(device)
        if price is not None:
            return price.usd_per_hour, f"catalog.yaml ({price.source}, as of {price.as_of})"
    except Exception as exc:  # a missing/invalid catalog falls through to the hardware file
        log.debug("catalog price lookup failed: %s", exc)
    try:
        d = get_device(device)
        return d.price.usd_per_hour, f"hardware.yaml ({d.price.source}, as of {d.price.as_of})"
    except Exception as exc:
        return None, f"no price for {device!r}: {exc}"


# -- dispatch -------------------------------------------------------------------------------------------


Picker = Callable[[Sequence[StepScheduler], TwinSeq], int]


def _round_robin() -> Picker:
    state = {"i": -1}

    def pick(workers: Sequence[StepScheduler], seq: TwinSeq) -> int:
        state["i"] = (state["i"] + 1) % len(workers)
        return state["i"]

    return pick


def _least_loaded() -> Picker:
    def pick(workers: Sequence[StepScheduler], seq: TwinSeq) -> int:
        best, best_load = 0, math.inf
        for i, w in enumerate(workers):
            load = w.num_running + w.num_waiting
            if load < best_load:
                best, best_load = i, load
        return best

    return pick


# name -> factory of a picker (a picker may keep state, e.g. the round-robin cursor)
PICKERS: dict[str, Callable[[], Picker]] = {"round-robin": _round_robin, "least-loaded": _least_loaded}


# -- virtual replay ---------------------------------------------------------------------------------------


@dataclass
class VirtualSetup:
    model: str = "Llama-3.1-8B"
    device: str = "H100-SXM"
    dtype: str = "bf16"
    workers: int = 1
    dispatch: str = "least-loaded"
    config: TwinConfig = field(default_factory=TwinConfig)
    usd_per_hour: float | None = None  # per worker; None: from the catalog/hardware.yaml
    price_source: str = ""


OverspendHook = Callable[[Sequence[TwinSeq]], dict[str, Any]]


def make_seq(r: TraceRequest, block_size: int) -> TwinSeq:
    keys = group_keys(r.prefix_group, r.prefix_tokens, block_size) if r.prefix_group else ()
    return TwinSeq(
        r.id,
        r.prompt_tokens,
        r.output_tokens,
        arrival=r.t,
        priority=r.priority,
        keys=keys,
        tenant=r.tenant,
        slo_class=r.slo_class,
    )


def run_virtual(
    requests: Sequence[TraceRequest],
    cost_model: StepCostModel | Sequence[StepCostModel],
    setup: VirtualSetup,
    pick: Picker | None = None,
    configs: Sequence[TwinConfig] | None = None,
) -> tuple[list[StepScheduler], list[TwinSeq], float]:
    """Replay in virtual time; returns the workers, every request, and the time the last one ended.

    ``configs``: one :class:`TwinConfig` per worker (workers of different models differ in KV
    capacity); default ``setup.config`` for all. ``pick`` may return -1: the request is refused
    before any worker (a router that finds no target), recorded as REJECTED with worker -1.
    ``pick`` is consulted only with 2+ workers (one worker takes every request)."""
    n = setup.workers
    costs = list(cost_model) if isinstance(cost_model, Sequence) else [cost_model] * n
    cfgs = list(configs) if configs is not None else [setup.config] * n
    workers = [StepScheduler(cfgs[i], costs[i]) for i in range(n)]
    pick = pick if pick is not None else PICKERS[setup.dispatch]()
    bs = setup.config.kv.block_size
    seqs: list[TwinSeq] = []
    reqs = sorted(requests, key=lambda r: r.t)
    i, total = 0, len(reqs)
    inf = math.inf
    t_last = 0.0
    if n == 1:
        w0 = workers[0]
        while True:
            t_arr = reqs[i].t if i < total else inf
            end = w0.step_end
            if end is not None and end < t_arr:
                t_last = end
                w0.step(end)
                continue
            if i >= total:
                break
            s = make_seq(reqs[i], bs)
            i += 1
            seqs.append(s)
            w0.add(s, t_arr)
            if end is None:
                w0.step(t_arr)
    else:
        while True:
            t_arr = reqs[i].t if i < total else inf
            wmin: StepScheduler | None = None
            tmin = inf
            for w in workers:
                e = w.step_end
                if e is not None and e < tmin:
                    tmin, wmin = e, w
            if wmin is not None and tmin < t_arr:
                t_last = tmin
                wmin.step(tmin)
                continue
            if i >= total:
                break
            s = make_seq(reqs[i], bs)
            i += 1
            seqs.append(s)
            k = pick(workers, s)
            s.worker = k
            if k < 0:
                s.state = SeqState.REJECTED
                s.finish_reason = "no_route"
                continue
            w = workers[k]
            w.add(s, t_arr)
            if w.step_end is None:
                w.step(t_arr)
    return workers, seqs, t_last


def quantiles(values: np.ndarray, qs: Sequence[float] = (50, 95, 99)) -> dict[str, float | None]:
    if values.size == 0:
        empty: dict[str, float | None] = {f"p{q:g}": None for q in qs}
        return empty | {"mean": None}
    out: dict[str, float | None] = {f"p{q:g}": round(float(np.percentile(values, q)), 6) for q in qs}
    out["mean"] = round(float(values.mean()), 6)
    return out


def _weighted_q(
    values: np.ndarray, weights: np.ndarray, extra: Sequence[float], qs: Sequence[float] = (50, 95, 99)
) -> dict[str, float | None]:
    if extra:
        values = np.concatenate([values, np.asarray(extra, dtype=float)])
        weights = np.concatenate([weights, np.ones(len(extra))])
    if values.size == 0 or weights.sum() <= 0:
        empty: dict[str, float | None] = {f"p{q:g}": None for q in qs}
        return empty | {"mean": None}
    order = np.argsort(values, kind="stable")
    v, w = values[order], weights[order]
    cw = np.cumsum(w)
    total = cw[-1]
    out: dict[str, float | None] = {}
    for q in qs:
        idx = int(np.searchsorted(cw, q / 100.0 * total, side="left"))
        out[f"p{q:g}"] = round(float(v[min(idx, v.size - 1)]), 6)
    out["mean"] = round(float((v * w).sum() / total), 6)
    return out


def summarize(
    workers: Sequence[StepScheduler],
    seqs: Sequence[TwinSeq],
    t_end: float,
    setup: VirtualSetup,
    slo: dict[str, Slo],
    *,
    duration: float | None = None,
    overspend_hook: OverspendHook | None = None,
) -> dict[str, Any]:
    """The replay's summary (every figure simulated)."""
    n = len(seqs)
    t0 = min((s.arrival or 0.0) for s in seqs) if seqs else 0.0
    span = max(t_end, (duration or 0.0)) - min(t0, 0.0)
    span = span if span > 0 else 1e-9
    done = [s for s in seqs if s.state is SeqState.DONE]

    def arr(vals: list[float | None]) -> np.ndarray:
        return np.asarray([v for v in vals if v is not None], dtype=float)

    ttft = arr([s.ttft for s in done])
    tpot = arr([s.tpot for s in done])
    e2e = arr([s.e2e for s in done])
    queue = arr([s.queue_time for s in done])
    durs = np.concatenate([np.asarray(w.step_durations, dtype=float) for w in workers]) if workers else np.zeros(0)
    wts = np.concatenate([np.asarray(w.step_decodes, dtype=float) for w in workers]) if workers else np.zeros(0)
    gaps = [g for w in workers for g in w.gap_itls]
    prompt_tokens = sum(s.prompt for s in seqs)
    gen_tokens = sum(w.stats.generation_tokens for w in workers)
    total_tokens = sum(s.prompt for s in done) + sum(s.generated for s in done)
    met_by_class: dict[str, list[int]] = {}
    met_total = 0
    for s in seqs:
        cls = s.slo_class or "interactive"
        limits = slo.get(cls)
        ok = limits.met(s) if limits is not None else s.state is SeqState.DONE
        m = met_by_class.setdefault(cls, [0, 0])
        m[1] += 1
        if ok:
            m[0] += 1
            met_total += 1
    queries = sum(w.stats.prefix_queries for w in workers)
    hits = sum(w.stats.prefix_hits for w in workers)
    busy = sum(w.stats.busy_s for w in workers)
    price = setup.usd_per_hour
    cost_usd = price * span / 3600.0 * setup.workers if price is not None else None
    overspend: Any = overspend_hook(seqs) if overspend_hook is not None else "n/a"
    return {
        "simulated": True,
        "model": setup.model,
        "device": setup.device,
        "dtype": setup.dtype,
        "workers": setup.workers,
        "dispatch": setup.dispatch,
        "config": {
            "max_num_seqs": setup.config.max_num_seqs,
            "max_num_batched_tokens": setup.config.max_num_batched_tokens,
            "num_gpu_blocks": setup.config.kv.num_gpu_blocks,
            "block_size": setup.config.kv.block_size,
            "prefix_caching": setup.config.kv.prefix_caching,
            "prefix_style": setup.config.kv.prefix_style,
            "eviction_policy": setup.config.kv.eviction_policy,
        },
        "requests": n,
        "finished": len(done),
        "rejected": sum(1 for s in seqs if s.state is SeqState.REJECTED),
        "unfinished": sum(1 for s in seqs if s.state in (SeqState.WAITING, SeqState.PREFILL, SeqState.DECODE)),
        "simulated_duration_s": round(span, 6),
        "goodput_rps": round(met_total / span, 6),
        "throughput_rps": round(len(done) / span, 6),
        "slo_attainment": round(met_total / n, 6) if n else None,
        "slo_attainment_by_class": {
            k: {"met": v[0], "total": v[1], "attainment": round(v[0] / v[1], 6)}
            for k, v in sorted(met_by_class.items())
        },
        "slo_classes": {k: v._asdict() for k, v in slo.items()},
        "ttft_s": quantiles(ttft),
        "tpot_s": quantiles(tpot),
        "itl_s": _weighted_q(durs, wts, gaps),
        "e2e_s": quantiles(e2e),
        "queue_s": quantiles(queue),
        "prompt_tokens": prompt_tokens,
        "generation_tokens": gen_tokens,
        "output_tokens_per_s": round(gen_tokens / span, 3),
        "total_tokens_per_s": round(total_tokens / span, 3),
        "prefix_cache_queries": queries,
        "prefix_cache_hits": hits,
        "prefix_cache_hit_rate": round(hits / queries, 6) if queries else None,
        "shared_prefix_request_share": round(sum(1 for s in seqs if s.keys) / n, 6) if n else None,
        "preemptions": sum(w.stats.preemptions for w in workers),
        "kv_usage_mean": round(sum(w.stats.kv_usage_integral for w in workers) / busy, 6) if busy else 0.0,
        "kv_usage_max": round(max((w.stats.kv_usage_max for w in workers), default=0.0), 6),
        "waiting_max": max((w.stats.waiting_max for w in workers), default=0),
        "gpu_busy_fraction": round(busy / (span * setup.workers), 6),
        "steps": sum(w.stats.steps for w in workers),
        "usd_per_hour_per_worker": price,
        "price_source": setup.price_source,
        "cost_usd": round(cost_usd, 6) if cost_usd is not None else None,
        "cost_per_1m_tokens_usd": round(cost_usd / total_tokens * 1e6, 6) if cost_usd and total_tokens else None,
        "cost_per_1m_output_tokens_usd": round(cost_usd / gen_tokens * 1e6, 6) if cost_usd and gen_tokens else None,
        "overspend": overspend,
    }


def records(seqs: Sequence[TwinSeq]) -> list[dict[str, Any]]:
    def r6(x: float | None) -> float | None:
        return None if x is None else round(x, 6)

    return [
        {
            "id": s.id,
            "worker": s.worker,
            "tenant": s.tenant,
            "priority": s.priority,
            "slo_class": s.slo_class,
            "arrival": r6(s.arrival),
            "prompt_tokens": s.prompt,
            "output_tokens": s.generated,
            "cached_tokens": s.cached_tokens,
            "queue_s": r6(s.queue_time),
            "ttft_s": r6(s.ttft),
            "tpot_s": r6(s.tpot),
            "e2e_s": r6(s.e2e),
            "preemptions": s.preemptions,
            "max_preemption_gap_s": r6(s.gap_max) if s.preemptions else None,
            "finish_reason": s.finish_reason,
        }
        for s in seqs
    ]


def markdown(summary: dict[str, Any], title: str = "Twin replay (simulated)") -> str:
    def ms(d: dict[str, Any], k: str) -> str:
        v = d.get(k)
        return "—" if v is None else f"{v * 1000:.1f}"

    lines = [
        f"# {title}",
        "",
        f"All figures are **simulated** by the engine twin ({summary.get('model')} on "
        f"{summary.get('workers')} x {summary.get('device')}, dispatch {summary.get('dispatch')}); "
        "no GPU was used.",
        "",
        "## Simulated service level",
        "",
        "| metric | value |",
        "|---|---|",
        f"| requests (finished / total) | {summary['finished']} / {summary['requests']} |",
        f"| simulated duration | {summary['simulated_duration_s']:.1f} s |",
        f"| goodput | {summary['goodput_rps']:.3f} req/s |",
        f"| SLO attainment | {summary['slo_attainment']} |",
        f"| output tokens/s | {summary['output_tokens_per_s']:.0f} |",
        f"| total tokens/s | {summary['total_tokens_per_s']:.0f} |",
        f"| cost per 1M tokens | {summary['cost_per_1m_tokens_usd']} USD |",
        f"| overspend | {summary['overspend']} |",
        f"| prefix cache hit rate | {summary['prefix_cache_hit_rate']} |",
        f"| preemptions | {summary['preemptions']} |",
        f"| KV usage mean / max | {summary['kv_usage_mean']} / {summary['kv_usage_max']} |",
        f"| GPU busy fraction | {summary['gpu_busy_fraction']} |",
        "",
        "## Simulated SLO attainment by class",
        "",
        "| class | met | total | attainment |",
        "|---|---|---|---|",
    ]
    for k, v in summary["slo_attainment_by_class"].items():
        lines.append(f"| {k} | {v['met']} | {v['total']} | {v['attainment']} |")
    lines += ["", "## Simulated latency (ms)", "", "| | p50 | p95 | p99 | mean |", "|---|---|---|---|---|"]
    for name in ("ttft_s", "itl_s", "tpot_s", "e2e_s", "queue_s"):
        d = summary[name]
        lines.append(f"| {name[:-2]} | {ms(d, 'p50')} | {ms(d, 'p95')} | {ms(d, 'p99')} | {ms(d, 'mean')} |")
    return "\n".join(lines) + "\n"


def build_setup(
    *,
    model: str,
    device: str,
    dtype: str = "bf16",
    workers: int = 1,
    dispatch: str = "least-loaded",
    max_num_seqs: int = 256,
    max_num_batched_tokens: int = 8192,
    block_size: int = 16,
    num_gpu_blocks: int | None = None,
    gpu_memory_utilization: float = 0.9,
    prefix_caching: bool = True,
    prefix_style: str = "vllm",
    eviction_policy: str = "lru",
    usd_per_hour: float | None = None,
) -> VirtualSetup:
    if num_gpu_blocks is None:
        num_gpu_blocks = num_gpu_blocks_from_kvcalc(
            model, device, block_size=block_size, gpu_memory_utilization=gpu_memory_utilization, dtype=dtype
        )
    source = "given"
    if usd_per_hour is None:
        usd_per_hour, source = device_usd_per_hour(device)
    cfg = TwinConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        kv=KVConfig(
            num_gpu_blocks=num_gpu_blocks,
            block_size=block_size,
            prefix_caching=prefix_caching,
            prefix_style=prefix_style,
            eviction_policy=eviction_policy,
        ),
    )
    return VirtualSetup(model, device, dtype, workers, dispatch, cfg, usd_per_hour, source)


def cost_model_for(name: str, model: str, device: str, dtype: str, engine: str | None = None) -> StepCostModel:
    if name == "roofline":
        return make_cost_model(model, device, dtype, engine)
    if name == "linear":
        return LinearCost()
    raise ValueError(f"unknown cost model {name!r} (roofline, linear)")


def replay_trace(
    trace: Trace,
    setup: VirtualSetup,
    cost: StepCostModel,
    *,
    slo: dict[str, Slo] | None = None,
    overspend_hook: OverspendHook | None = None,
) -> tuple[dict[str, Any], list[TwinSeq], float]:
    """Replay a whole trace; returns (summary, requests, wall seconds of the replay)."""
    slo = slo if slo is not None else load_slo_classes()
    w0 = time.perf_counter()
    workers, seqs, t_end = run_virtual(trace.requests, cost, setup)
    wall = time.perf_counter() - w0
    summary = summarize(workers, seqs, t_end, setup, slo, duration=trace.duration, overspend_hook=overspend_hook)
    summary["replay_wall_s"] = round(wall, 3)
    summary["trace"] = trace.header
    return summary, seqs, wall
