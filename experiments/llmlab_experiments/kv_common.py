"""Shared pieces of the §3 KV-cache experiments (``kv_blocks``, ``kv_traffic``, ``kv_eviction``):
one twin replay with a given KV budget, block size and eviction policy, and the figures the notes
need beyond the replay summary (first-admission hit rate, per-tenant figures). Every figure here is
SIMULATED by the engine twin (roofline step time fitted to published H100 points)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from llmlab_twin.replay import VirtualSetup, build_setup, load_slo_classes, run_virtual, summarize
from llmlab_twin.roofline import RooflineCostModel
from llmlab_twin.sched import SeqState, StepCostModel, TwinSeq
from llmlab_twin.trace import Trace, TraceRequest

from llmlab_experiments.note import metadata

MODEL = "Llama-3.1-8B"
DEVICE = "H100-SXM"
MAX_NUM_SEQS = 256
MAX_NUM_BATCHED_TOKENS = 8192

_COST: dict[tuple[str, str], StepCostModel] = {}


def cost_model(model: str = MODEL, device: str = DEVICE) -> StepCostModel:
    key = (model, device)
    if key not in _COST:
        _COST[key] = RooflineCostModel.from_names(model, device)
    return _COST[key]


def pct(values: Iterable[float | None], q: float) -> float | None:
    arr = np.asarray([v for v in values if v is not None], dtype=float)
    return round(float(np.percentile(arr, q)), 4) if arr.size else None


@dataclass
class Run:
    summary: dict[str, Any]
    seqs: list[TwinSeq]
    setup: VirtualSetup
    prefill_tokens: int  # prompt tokens computed, recomputes included, cache hits excluded
    evicted_blocks: int


def replay(
    requests: Sequence[TraceRequest],
    *,
    num_gpu_blocks: int,
    block_size: int = 16,
    policy: str = "lru",
    style: str = "vllm",
    prefix_caching: bool = True,
    model: str = MODEL,
    device: str = DEVICE,
) -> Run:
    setup = build_setup(
        model=model,
        device=device,
        max_num_seqs=MAX_NUM_SEQS,
        max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
        block_size=block_size,
        num_gpu_blocks=num_gpu_blocks,
        prefix_caching=prefix_caching,
        prefix_style=style,
        eviction_policy=policy,
        usd_per_hour=0.0,  # cost is not a figure of these experiments
    )
    workers, seqs, t_end = run_virtual(requests, cost_model(model, device), setup)
    summary = summarize(workers, seqs, t_end, setup, load_slo_classes())
    w = workers[0]
    cache = w.kv.cache
    return Run(summary, seqs, setup, w.stats.prefill_tokens, cache.evicted_blocks if cache is not None else 0)


def first_hit_rate(seqs: Sequence[TwinSeq]) -> float | None:
    """Prompt tokens served from the cache at each request's first admission / prompt tokens: what
    a user's request saved. The engine counter (vLLM's ``prefix_cache_hits/queries``) also counts
    the re-admissions after a preemption, where a request hits its own blocks again."""
    prompt = sum(s.prompt for s in seqs)
    return round(sum(s.cached_tokens for s in seqs) / prompt, 4) if prompt else None


def shared_token_share(requests: Sequence[TraceRequest]) -> float:
    """Share of prompt tokens that belong to a shared (identical across requests) prefix."""
    total = sum(r.prompt_tokens for r in requests)
    return round(sum(r.prefix_tokens for r in requests if r.prefix_group) / total, 4) if total else 0.0


def by_tenant(seqs: Sequence[TwinSeq], fn: Callable[[list[TwinSeq]], Any]) -> dict[str, Any]:
    groups: dict[str, list[TwinSeq]] = {}
    for s in seqs:
        groups.setdefault(s.tenant or "-", []).append(s)
    return {k: fn(v) for k, v in sorted(groups.items())}


def ttft_p95(seqs: Sequence[TwinSeq]) -> float | None:
    return pct((s.ttft for s in seqs if s.state is SeqState.DONE), 95)


def ms(x: float | None) -> str:
    return "—" if x is None else f"{x * 1000:.0f}"


def pc(x: float | None) -> str:
    return "—" if x is None else f"{x * 100:.1f}%"


def trace_meta(trace: Trace, *, started: dt.datetime, duration_s: float, command: str, **extra: Any) -> dict[str, Any]:
    reqs = trace.requests
    p = [r.prompt_tokens for r in reqs]
    o = [r.output_tokens for r in reqs]
    return metadata(
        started=started,
        duration_s=duration_s,
        engine="llmlab engine twin (virtual time, vLLM-style step scheduler, roofline step cost)",
        model_id=f"{MODEL} (config only; simulated on {DEVICE})",
        concurrency=f"open loop, arrivals from the trace (max_num_seqs {MAX_NUM_SEQS})",
        warmup="none (virtual time: the twin has no warm-up effects)",
        prompt_dataset=f"synthetic trace {trace.header.get('params', {}).get('mix')} seed {trace.header.get('seed')}",
        input_length_distribution=f"prompt tokens min {min(p)} / median {int(np.median(p))} / max {max(p)}",
        output_length_distribution=f"output tokens min {min(o)} / median {int(np.median(o))} / max {max(o)}",
        sampling_parameters="n/a (simulated: fixed output lengths from the trace, ignore_eos)",
        command=command,
        simulated=True,
        **extra,
    )
