"""§5 Speculative decoding on the engine twin: draft/target pairs, speculative tokens k, concurrency, output
length and an ASSUMED acceptance rate α, with the tutorial's stop rules applied as code.

Model (built on the twin's roofline; the scheduler in ``llmlab_twin.sched`` has no multi-token steps, so this
module runs its own small step loop):

* a speculative decode step = the draft runs k single-token forward passes over the batch, then the target
  verifies k+1 tokens per sequence in one forward pass (the roofline cost of an n·(k+1)-token step whose
  attention reads each context once);
* each sequence then emits a+1 tokens, a = leading accepted drafts: P(a=i) = α^i (1-α) for i < k, P(a=k) = α^k,
  so the expected tokens per step are (1-α^(k+1)) / (1-α) (Leviathan et al. 2023);
* memory: the draft's weights and its KV (per token, beside the target's) come out of the target's KV budget
  (kvcalc), and each sequence reserves k look-ahead slots, so fewer sequences fit.

ITL is per token: a chunk of j tokens after a gap Δ counts as j samples of Δ/j (SGLang bench_serving's
convention for speculative decoding); the per-chunk gap (vLLM bench's ITL) is kept in the JSON.
Every figure is SIMULATED; α is an input, not a measurement.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from llmlab_twin import kvcalc
from llmlab_twin.hwcatalog import DeviceSpec, ModelSpec, get_device, get_model
from llmlab_twin.roofline import RooflineCostModel, StepBatch, params_for

from llmlab_experiments.note import Note, metadata, write_experiment

log = logging.getLogger(__name__)

NAME = "speculative"
GiB = 1024**3
ENGINE = "vllm"
GPU_MEM_UTIL = 0.9
PROMPT_TOKENS = 512
MAX_NUM_BATCHED_TOKENS = 8192
BLOCK = kvcalc.DEFAULT_BLOCK_SIZE
# ASSUMED: one draft forward pass inside an engine step pays a kernel-launch cost (CUDA graphs), not the
# engine's whole per-step overhead (scheduling, sampling, detokenising happen once per step).
DRAFT_FORWARD_OVERHEAD_S = 0.5e-3
SEED = 7


@dataclass(frozen=True)
class Pair:
    draft: str
    target: str
    device: str = "H100-SXM"

    @property
    def label(self) -> str:
        return f"{self.draft} -> {self.target}"


PAIRS: tuple[Pair, ...] = (Pair("Llama-3.2-1B", "Llama-3.1-8B"), Pair("Qwen3-0.6B", "Qwen3-32B"))


def expected_tokens_per_step(alpha: float, k: int) -> float:
    """Tokens a sequence emits per verification step: accepted drafts plus the target's own token."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1 - alpha ** (k + 1)) / (1 - alpha)


# -- memory -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Capacity:
    kv_budget_gib: float
    max_seqs: int  # sequences of `context` tokens that fit
    draft_weights_gib: float
    draft_kv_bytes_per_token: float


def capacity(target: ModelSpec, draft: ModelSpec | None, device: DeviceSpec, context: int, k: int) -> Capacity:
    """Sequences of `context` tokens that fit in the target's KV budget, with the draft's weights, its KV
    and k look-ahead slots per sequence taken out of it when there is a draft."""
    p = kvcalc.plan(target, device, dtype="bf16", gpu_mem_util=GPU_MEM_UTIL, context=context)
    budget = p.kv_budget_bytes_per_gpu
    per_tok = target.kv_bytes_per_token("bf16")
    dw, dkv, look = 0.0, 0.0, 0
    if draft is not None:
        dw, dkv, look = draft.weight_bytes("bf16"), draft.kv_bytes_per_token("bf16"), k
    blocks = int(max(0.0, budget - dw) // ((per_tok + dkv) * BLOCK))
    return Capacity(budget / GiB, blocks // math.ceil((context + look) / BLOCK), dw / GiB, dkv)


# -- the step loop --------------------------------------------------------------------------------------


def cost_models(pair: Pair) -> tuple[RooflineCostModel, RooflineCostModel]:
    device = get_device(pair.device)
    target = RooflineCostModel(get_model(pair.target), device, engine=ENGINE)
    dparams = replace(params_for(device, ENGINE), step_overhead_s=DRAFT_FORWARD_OVERHEAD_S, seq_overhead_s=0.0)
    draft = RooflineCostModel(get_model(pair.draft), device, params=dparams)
    return target, draft


def _wq(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    if values.size == 0:
        return 0.0
    order = np.argsort(values, kind="stable")
    v, cw = values[order], np.cumsum(weights[order])
    return float(v[min(int(np.searchsorted(cw, q / 100 * cw[-1])), v.size - 1)])


def simulate(
    target: RooflineCostModel,
    draft: RooflineCostModel | None,
    *,
    k: int,
    alpha: float,
    concurrency: int,
    output_tokens: int,
    max_seqs: int,
    prompt_tokens: int = PROMPT_TOKENS,
    seed: int = SEED,
) -> dict[str, Any]:
    """`concurrency` requests arrive at t=0; at most `max_seqs` run at once (KV), the rest wait and are
    prefilled (target and draft) when a slot frees; running sequences wait during a prefill step. Without a
    draft this is plain decoding (one token per sequence per step)."""
    rng = np.random.default_rng(seed)
    n_total = concurrency
    max_seqs = max(1, max_seqs)
    waiting = n_total
    ctx = np.zeros(0, dtype=np.int64)
    left = np.zeros(0, dtype=np.int64)
    last = np.zeros(0)
    t = 0.0
    ttft: list[float] = []
    e2e: list[float] = []
    itl_v: list[np.ndarray] = []
    itl_w: list[np.ndarray] = []
    gaps: list[np.ndarray] = []
    steps = 0
    step_time = 0.0
    emitted_total = seq_steps = 0
    proposed = accepted = 0
    while waiting or left.size:
        n_new = min(waiting, max_seqs - left.size)
        if n_new > 0:
            # Prefill in chunks of MAX_NUM_BATCHED_TOKENS; intra-prompt causal attention counted (p^2/2).
            toks = n_new * prompt_tokens
            for start in range(0, toks, MAX_NUM_BATCHED_TOKENS):
                chunk = min(MAX_NUM_BATCHED_TOKENS, toks - start)
                b = StepBatch(chunk, chunk * prompt_tokens // 2, 0, 0)
                t += target.step_seconds(b) + (draft.step_seconds(b) if draft is not None else 0.0)
            waiting -= n_new
            ttft += [t] * n_new
            ctx = np.concatenate([ctx, np.full(n_new, prompt_tokens + 1)])
            left = np.concatenate([left, np.full(n_new, output_tokens - 1)])
            last = np.concatenate([last, np.full(n_new, t)])
            done = left <= 0
            if done.any():
                e2e += [t] * int(done.sum())
                ctx, left, last = ctx[~done], left[~done], last[~done]
            continue
        n = left.size
        s = int(ctx.sum())
        if draft is None:
            dur = target.step_seconds(StepBatch(0, 0, n, s))
            j = np.ones(n, dtype=np.int64)
        else:
            dur = sum(draft.step_seconds(StepBatch(0, 0, n, s + n * i)) for i in range(k))
            dur += target.step_seconds(StepBatch(n * k, k * s + n * k * (k - 1) // 2, n, s))
            acc = np.cumprod(rng.random((n, k)) < alpha, axis=1).sum(axis=1)
            proposed += n * k
            accepted += int(acc.sum())
            j = acc + 1
        j = np.minimum(j, left)
        t += dur
        steps += 1
        step_time += dur
        gap = t - last
        itl_v.append(gap / j)
        itl_w.append(j.astype(float))
        gaps.append(gap)
        emitted_total += int(j.sum())
        seq_steps += n
        ctx = ctx + j
        left = left - j
        last = np.full(n, t)
        done = left <= 0
        if done.any():
            e2e += [t] * int(done.sum())
            ctx, left, last = ctx[~done], left[~done], last[~done]
    v = np.concatenate(itl_v) if itl_v else np.zeros(0)
    w = np.concatenate(itl_w) if itl_w else np.zeros(0)
    g = np.concatenate(gaps) if gaps else np.zeros(0)
    out_tokens = n_total * output_tokens
    return {
        "itl_p50_ms": round(1000 * _wq(v, w, 50), 3),
        "itl_p95_ms": round(1000 * _wq(v, w, 95), 3),
        "chunk_gap_p95_ms": round(1000 * float(np.percentile(g, 95)), 3) if g.size else 0.0,
        "ttft_p95_ms": round(1000 * float(np.percentile(ttft, 95)), 2),
        "e2e_p95_s": round(float(np.percentile(e2e, 95)), 4),
        "output_tok_s": round(out_tokens / t, 2),
        "decode_steps": steps,
        "mean_step_ms": round(1000 * step_time / steps, 3) if steps else 0.0,
        "tokens_per_seq_step": round(emitted_total / seq_steps, 3) if seq_steps else 0.0,
        # vLLM's draft acceptance rate: accepted / proposed draft tokens = (E[tokens/step] - 1) / k, not α itself
        "draft_acceptance_rate": round(accepted / proposed, 4) if proposed else None,
        "duration_s": round(t, 4),
    }


# -- stop rules (tutorial §5.3) -------------------------------------------------------------------------


def stop_rules(row: dict[str, Any], base: dict[str, Any]) -> tuple[bool, list[str]]:
    """A setting is not adopted when (1) its p95 ITL is worse than the baseline's, (2) the draft's memory
    lowers the concurrency the baseline could hold at this load, (3) the acceptance is too low for the
    extra computation to pay (tokens per step at or below the step-time ratio); a throughput loss no rule
    explains is a reason too. Returns (accepted, reasons)."""
    reasons: list[str] = []
    if row["itl_p95_ms"] > base["itl_p95_ms"]:
        reasons.append(f"p95 ITL worse: {row['itl_p95_ms']:.2f} ms vs {base['itl_p95_ms']:.2f} ms without speculation")
    wanted = min(row["concurrency"], base["max_seqs"])
    if row["max_seqs"] < wanted:
        reasons.append(
            f"concurrency lost to draft memory: {row['max_seqs']} sequences fit vs {base['max_seqs']} without the draft"
        )
    # Rule 3 compares what acceptance buys (tokens per sequence-step) with what the draft + verification
    # costs (spec step time / plain step time): below break-even the extra computation does not pay.
    breakeven = row["mean_step_ms"] / base["mean_step_ms"] if base["mean_step_ms"] else math.inf
    if row["tokens_per_seq_step"] <= breakeven:
        reasons.append(
            f"acceptance too low: α={row['alpha']} gives {row['tokens_per_seq_step']:.2f} tokens/step, "
            f"break-even {breakeven:.2f} (spec step {row['mean_step_ms']:.1f} ms vs {base['mean_step_ms']:.1f} ms)"
        )
    if row["output_tok_s"] <= base["output_tok_s"] and not reasons:
        reasons.append(
            f"throughput not above the baseline ({row['output_tok_s']:,.0f} vs {base['output_tok_s']:,.0f} tok/s)"
        )
    return (not reasons), reasons


# -- the experiment ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Grid:
    ks: tuple[int, ...] = (1, 3, 5, 8)
    concurrencies: tuple[int, ...] = (1, 8, 32)
    outputs: tuple[int, ...] = (32, 256, 1024)
    alphas: tuple[float, ...] = (0.5, 0.7, 0.85)


QUICK = Grid(ks=(1, 5), concurrencies=(1, 32), outputs=(256,), alphas=(0.5, 0.85))


def run_grid(pairs: tuple[Pair, ...], grid: Grid) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for pair in pairs:
        device = get_device(pair.device)
        target_m, draft_m = get_model(pair.target), get_model(pair.draft)
        tcm, dcm = cost_models(pair)
        for out_len in grid.outputs:
            context = PROMPT_TOKENS + out_len
            base_cap = capacity(target_m, None, device, context, 0)
            for c in grid.concurrencies:
                common = {"pair": pair.label, "device": pair.device, "output_tokens": out_len, "concurrency": c}
                base = {
                    **common,
                    "k": 0,
                    "alpha": None,
                    "max_seqs": base_cap.max_seqs,
                    "extra_memory_gib": 0.0,
                    **simulate(
                        tcm, None, k=0, alpha=0.0, concurrency=c, output_tokens=out_len, max_seqs=base_cap.max_seqs
                    ),
                }
                base.update(speedup=1.0, accepted=True, reasons=["baseline (no speculation)"], simulated=True)
                rows.append(base)
                for k in grid.ks:
                    cap = capacity(target_m, draft_m, device, context, k)
                    running = min(c, cap.max_seqs)
                    extra = cap.draft_weights_gib + cap.draft_kv_bytes_per_token * context * running / GiB
                    for a in grid.alphas:
                        sim = simulate(
                            tcm, dcm, k=k, alpha=a, concurrency=c, output_tokens=out_len, max_seqs=cap.max_seqs
                        )
                        row = {
                            **common,
                            "k": k,
                            "alpha": a,
                            "alpha_assumed": True,
                            "expected_tokens_per_step": round(expected_tokens_per_step(a, k), 3),
                            "efficiency": round(expected_tokens_per_step(a, k) / (k + 1), 3),
                            "max_seqs": cap.max_seqs,
                            "extra_memory_gib": round(extra, 3),
                            **sim,
                        }
                        row["speedup"] = round(row["output_tok_s"] / base["output_tok_s"], 3)
                        ok, why = stop_rules(row, base)
                        row.update(accepted=ok, reasons=why or ["adopted: no stop rule fired"], simulated=True)
                        rows.append(row)
        log.info("%s: %d rows", pair.label, sum(1 for r in rows if r["pair"] == pair.label))
    return rows


def tables(rows: list[dict[str, Any]]) -> str:
    out = [
        "α (per-position acceptance probability) is an ASSUMED input; the draft acceptance rate (accepted / proposed "
        "draft tokens, vLLM's counter) follows from it and k and is in results.json. ITL is per token (a chunk of j "
        "tokens = j samples of gap/j).",
        "",
        "## Best adopted setting per pair, concurrency and output length",
        "",
        "| pair | c | output | baseline tok/s | baseline ITL p95 (ms) | best adopted (k, α) | speed-up "
        "| ITL p95 (ms) | extra memory (GiB) | settings rejected |",
        "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|",
    ]
    keys = sorted({(r["pair"], r["concurrency"], r["output_tokens"]) for r in rows}, key=lambda x: (x[0], x[1], x[2]))
    for pair, c, o in keys:
        grp = [r for r in rows if (r["pair"], r["concurrency"], r["output_tokens"]) == (pair, c, o)]
        base = next(r for r in grp if r["k"] == 0)
        spec = [r for r in grp if r["k"] > 0]
        ok = [r for r in spec if r["accepted"]]
        best = max(ok, key=lambda r: r["speedup"]) if ok else None
        rej = f"{len(spec) - len(ok)}/{len(spec)}"
        if best is None:
            out.append(
                f"| {pair} | {c} | {o} | {base['output_tok_s']:,.0f} | {base['itl_p95_ms']:.2f} | none | — | — | — "
                f"| {rej} |"
            )
        else:
            out.append(
                f"| {pair} | {c} | {o} | {base['output_tok_s']:,.0f} | {base['itl_p95_ms']:.2f} | k={best['k']}, "
                f"α={best['alpha']} | {best['speedup']:.2f} | {best['itl_p95_ms']:.2f} | "
                f"{best['extra_memory_gib']:.2f} | {rej} |"
            )
    out += [
        "",
        "## Every setting",
        "",
        "| pair | c | output | k | α (assumed) | E[tokens/step] | ITL p50 / p95 (ms) | tok/s | speed-up | max seqs | "
        "extra mem (GiB) | verdict |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        verdict = (
            "baseline" if r["k"] == 0 else ("adopted" if r["accepted"] else "rejected: " + "; ".join(r["reasons"]))
        )
        e = r.get("expected_tokens_per_step", 1.0)
        alpha = "—" if r["alpha"] is None else r["alpha"]
        out.append(
            f"| {r['pair']} | {r['concurrency']} | {r['output_tokens']} | {r['k']} | {alpha} | "
            f"{e:.2f} | {r['itl_p50_ms']:.2f} / {r['itl_p95_ms']:.2f} | {r['output_tok_s']:,.0f} | "
            f"{r['speedup']:.2f} | {r['max_seqs']} | {r['extra_memory_gib']:.2f} | {verdict} |"
        )
    return "\n".join(out)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pairs = sorted({r["pair"] for r in rows})
    cs = sorted({r["concurrency"] for r in rows})
    outs = sorted({r["output_tokens"] for r in rows})
    o = 256 if 256 in outs else outs[0]
    fig, axes = plt.subplots(len(pairs), len(cs), figsize=(4.5 * len(cs), 3.8 * len(pairs)), squeeze=False)
    for i, pair in enumerate(pairs):
        for j, c in enumerate(cs):
            ax = axes[i][j]
            sel = [
                r
                for r in rows
                if r["pair"] == pair and r["concurrency"] == c and r["output_tokens"] == o and r["k"] > 0
            ]
            for a in sorted({r["alpha"] for r in sel}):
                pts = sorted((r["k"], r["speedup"], r["accepted"]) for r in sel if r["alpha"] == a)
                line = ax.plot([p[0] for p in pts], [p[1] for p in pts], label=f"α={a} (assumed)")[0]
                for kk, sp, ok in pts:
                    ax.plot(kk, sp, "o" if ok else "x", color=line.get_color(), markersize=7)
            ax.axhline(1.0, color="gray", lw=0.8, ls="--")
            ax.set_title(f"{pair}\nc={c}, output {o}: SIMULATED", fontsize=9)
            ax.set_xlabel("speculative tokens k")
            ax.set_ylabel("throughput speed-up vs no spec")
            ax.legend(fontsize=7, title="o adopted, x rejected", title_fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _verdict(r: dict[str, Any]) -> str:
    return "adopted" if r["accepted"] else "rejected: " + "; ".join(r["reasons"])


def run(out: Path, quick: bool, command: str) -> Path:
    started = dt.datetime.now(dt.UTC)
    t0 = time.monotonic()
    grid = QUICK if quick else Grid()
    rows = run_grid(PAIRS, grid)

    def find(pair: Pair, c: int, o: int, k: int, a: float | None) -> dict[str, Any] | None:
        return next(
            (
                r
                for r in rows
                if (r["pair"], r["concurrency"], r["output_tokens"], r["k"], r["alpha"]) == (pair.label, c, o, k, a)
            ),
            None,
        )

    o = 256
    lines = []
    for pair in PAIRS:
        for c in (min(grid.concurrencies), max(grid.concurrencies)):
            hi = find(pair, c, o, 5, max(grid.alphas))
            lo = find(pair, c, o, 5, min(grid.alphas))
            if hi and lo:
                lines.append(
                    f"{pair.label}, c={c}, output {o}, k=5: α={hi['alpha']} speed-up x{hi['speedup']:.2f} "
                    f"({_verdict(hi)}); α={lo['alpha']} x{lo['speedup']:.2f} ({_verdict(lo)}); "
                    f"draft + its KV {hi['extra_memory_gib']:.2f} GiB, {hi['max_seqs']} sequences fit."
                )
    adopted = sum(1 for r in rows if r["k"] > 0 and r["accepted"])
    total = sum(1 for r in rows if r["k"] > 0)
    fired: dict[str, int] = {}
    for r in rows:
        for reason in r["reasons"] if r["k"] > 0 and not r["accepted"] else ():
            rule = reason.split(":")[0].split(" (")[0]
            fired[rule] = fired.get(rule, 0) + 1
    big = PAIRS[1]
    o_big = max(grid.outputs)
    b32, s32 = (
        find(big, max(grid.concurrencies), o_big, 0, None),
        find(big, max(grid.concurrencies), o_big, 5, max(grid.alphas)),
    )
    seats = f"{b32['max_seqs']} -> {s32['max_seqs']}" if b32 and s32 else "?"
    note = Note(
        title="Speculative decoding on the engine twin: draft/target pairs, k, concurrency, output length (SIMULATED)",
        hypothesis=(
            "A small same-tokenizer draft lowers per-token latency and raises throughput at low concurrency, where "
            "a target decode step is bound by streaming its weights and verifying k+1 tokens costs about the same "
            "as decoding one; at high concurrency the verification step becomes compute-bound, rejected drafts "
            "waste target compute, and the draft's weights and KV take sequences away, so the gain shrinks or turns "
            "into a loss."
        ),
        fixed_conditions=[
            "engine twin roofline (H100-SXM calibration, vLLM per-step overhead) for both models, BF16 weights and KV",
            f"prompt {PROMPT_TOKENS} tokens; all requests arrive together; chunked prefill {MAX_NUM_BATCHED_TOKENS} "
            "tokens; gpu_memory_utilization 0.9, 1.5 GiB reserve",
            f"draft forward pass overhead {DRAFT_FORWARD_OVERHEAD_S * 1000:.1f} ms (ASSUMED; the engine's per-step "
            "overhead is paid once per verification step)",
            "acceptance per draft token independent with probability α (ASSUMED input, the same at every position)",
            f"seeded sampling of accepted tokens (seed {SEED}); one run per setting (deterministic)",
        ],
        changed_variable=(
            "draft/target pair (Llama-3.2-1B -> Llama-3.1-8B, Qwen3-0.6B -> Qwen3-32B), speculative tokens k "
            f"{'/'.join(map(str, grid.ks))}, concurrency {'/'.join(map(str, grid.concurrencies))}, output "
            f"{'/'.join(map(str, grid.outputs))}, α {'/'.join(map(str, grid.alphas))}"
        ),
        expected=(
            "Speed-up > 1 at concurrency 1 with α ≥ 0.7, largest for the 32B target (its step is longest relative "
            "to the draft's); smaller or negative at concurrency 32; the 0.6B draft's large KV (114,688 B/token, "
            "44% of the 32B target's) costs the 32B pair concurrency; low α with large k rejected."
        ),
        actual=(
            f"{adopted} of {total} speculative settings adopted by the stop rules; rules fired (a setting can "
            f"fire several): {', '.join(f'{k} {v}' for k, v in sorted(fired.items()))}. "
            + " ".join(lines)
            + " Full grid in table.md; all SIMULATED."
        ),
        interpretation=(
            "Single request vs high concurrency: at concurrency 1 the target's decode step streams all its weights "
            "(16 GB for 8B, 65 GB for 32B) to produce one token; the same pass can score k+1 tokens at almost no "
            "extra cost because the arithmetic stays far below the roofline's ridge point (~160 tokens per step on "
            "H100 with the fitted efficiencies), so every accepted draft token is nearly free and the draft's own k "
            "passes are cheap (its weights are 6-55x smaller). At concurrency 32 the verification step processes "
            "32·(k+1) = 64-288 tokens: the linear layers approach or pass the ridge and turn compute-bound, "
            "so its cost grows with k whether or not the drafts are accepted, and the rejected drafts are wasted "
            "target FLOPs; the baseline, meanwhile, already amortises the weight read over 32 sequences. The "
            "speed-up therefore falls with concurrency and with k at low α. Per-token p95 ITL is its own gate: "
            "when 1-α is large, a visible share of steps emit a single token after a draft+verify step that is "
            "longer than a plain decode step, so the tail worsens even when the mean improves; this rule is the "
            "one that fires most, and almost only α=0.85 with k=3-8 clears it (single-token chunks then stay "
            "under 5% of tokens; α=0.7 passes only in 32-token single-request runs, where p95 is over 31 tokens). "
            "The draft's memory is the third effect: for Qwen3-0.6B -> Qwen3-32B on one 80 GB GPU the "
            "target leaves ~9 GiB for KV, and the draft's 1.1 GiB of weights plus its KV (114,688 B/token, 44% of "
            f"the target's) cut the sequences that fit ({seats} at output {o_big}), so settings at concurrency 32 "
            "with long outputs are rejected for concurrency lost whatever their speed. The 1B Llama draft's KV is "
            "only 25% of the 8B target's and the 8B leaves ~55 GiB, so that pair keeps its concurrency."
        ),
        unverified=[
            "every figure: the twin, not a GPU (no GPU on this machine)",
            "acceptance rates are assumptions: real α depends on the pair, the prompt domain and sampling "
            "temperature and is not position-independent",
            "draft pass overhead and the verification kernel's efficiency are not calibrated (the twin's fit has "
            "no speculative points); vLLM's draft-model / EAGLE paths not run",
            "Llama-3.2-1B and Qwen3-0.6B configs written from their published config.json without network access "
            "(cross-checked against copies in public repositories)",
        ],
        next_experiment=(
            "On a GPU: vLLM --speculative-config with the same pairs, read spec_decode acceptance counters at each "
            "k and feed the measured α back into this model; add EAGLE/n-gram drafts (no draft KV) as a variable."
        ),
    )
    meta = metadata(
        started=started,
        duration_s=round(time.monotonic() - t0, 3),
        engine="engine twin (roofline, vLLM profile) + speculative step model (experiments/speculative.py)",
        model_id="; ".join(p.label for p in PAIRS),
        concurrency=list(grid.concurrencies),
        warmup="none (virtual time)",
        prompt_dataset="synthetic (token counts only)",
        input_length_distribution=f"fixed {PROMPT_TOKENS}",
        output_length_distribution="fixed " + "/".join(map(str, grid.outputs)),
        sampling_parameters=f"acceptance α {list(grid.alphas)} ASSUMED, seed {SEED}",
        command=command,
    )
    return write_experiment(
        out,
        name=NAME,
        simulated=True,
        rows=rows,
        table_md=tables(rows),
        note=note,
        command=command,
        meta=meta,
        plot=lambda p: plot(rows, p),
    )
