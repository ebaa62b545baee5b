"""§3.2 Paged attention: KV block size vs internal fragmentation (waste), block-table size and
prefix sharing (block reuse), for Llama-3.1-8B's KV size; the replay half runs on the engine twin.

Waste is computed from the trace's request lengths (exact: a request of L tokens holds
ceil(L/b) blocks); the replay figures (hit rate, preemptions, TTFT) are SIMULATED."""

from __future__ import annotations

import datetime as dt
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
from llmlab_twin.hwcatalog import get_model
from llmlab_twin.trace import generate

from llmlab_experiments.kv_common import MAX_NUM_SEQS, MODEL, first_hit_rate, ms, pc, replay, trace_meta
from llmlab_experiments.note import Note, write_experiment

log = logging.getLogger(__name__)

NAME = "kv_blocks"
BLOCK_SIZES = (8, 16, 32, 64, 128)
SYSTEM_PROMPT_TOKENS = 1000  # deliberately not a multiple of any block size: the partial block is never shared
KV_BUDGET_TOKENS = 16384  # the same KV memory for every block size (tight enough to show waste)
KV_DTYPE = "bf16"


def kv_bytes_per_token(model: str = MODEL, kv_dtype: str = KV_DTYPE) -> float:
    """§3.1: layers × 2 (K,V) × kv_heads × head_dim × bytes per element, from the model config."""
    return get_model(model).kv_bytes_per_token(kv_dtype)


def waste_rows(lengths: np.ndarray, bytes_per_token: float, block_sizes: tuple[int, ...]) -> list[dict[str, Any]]:
    """Internal fragmentation per block size: a request of L tokens holds ceil(L/b)·b token slots."""
    rows = []
    for b in block_sizes:
        alloc = np.ceil(lengths / b) * b
        waste = alloc - lengths
        rows.append(
            {
                "block_size": b,
                "waste_tokens_mean": round(float(waste.mean()), 2),
                "waste_share": round(float(waste.sum() / alloc.sum()), 5),
                "blocks_per_request_mean": round(float((alloc / b).mean()), 1),
                # what that waste costs when max_num_seqs requests run at once
                "waste_mib_at_max_seqs": round(float(waste.mean()) * MAX_NUM_SEQS * bytes_per_token / 2**20, 1),
                "shared_prefix_tokens_shareable": (SYSTEM_PROMPT_TOKENS // b) * b,
                "shared_prefix_saved_mib_per_request": round(
                    (SYSTEM_PROMPT_TOKENS // b) * b * bytes_per_token / 2**20, 2
                ),
            }
        )
    return rows


def run(out: Path, quick: bool, command: str) -> Path:
    started = dt.datetime.now(dt.UTC)
    t0 = time.monotonic()
    bpt = kv_bytes_per_token()
    m = get_model(MODEL)
    # Lengths: the §8.3 mix (short, chat, long documents, long generations) = realistic spread.
    mix = generate(mix="tutorial-8.3", count=300 if quick else 3000, rate=20, seed=1)
    lengths = np.asarray([r.prompt_tokens + r.output_tokens for r in mix.requests], dtype=float)
    rows = waste_rows(lengths, bpt, BLOCK_SIZES)
    # Short chats alone (64–256 in, 32–128 out): where a block's half-empty tail is a large share.
    chats = generate(mix="short-chat", count=300 if quick else 3000, rate=20, seed=1)
    chat_len = np.asarray([r.prompt_tokens + r.output_tokens for r in chats.requests], dtype=float)
    for row, chat_row in zip(rows, waste_rows(chat_len, bpt, BLOCK_SIZES), strict=True):
        row["waste_share_short_chat"] = chat_row["waste_share"]
    max_len = int(lengths.max())
    contiguous_waste = float((max_len - lengths).mean())  # pre-paged engines reserve max_model_len per request
    contiguous: dict[str, Any] = {
        "block_size": f"contiguous (reserve {max_len})",
        "waste_tokens_mean": round(contiguous_waste, 1),
        "waste_share": round(float((max_len - lengths).sum() / (max_len * lengths.size)), 5),
        "waste_mib_at_max_seqs": round(contiguous_waste * MAX_NUM_SEQS * bpt / 2**20, 1),
    }

    # Replay: one system prompt shared by every request, the same KV memory for every block size.
    shared = generate(
        mix="shared-system", count=100 if quick else 300, rate=40, seed=1, prefix_tokens=SYSTEM_PROMPT_TOKENS
    )
    for row in rows:
        b = row["block_size"]
        r = replay(shared.requests, num_gpu_blocks=KV_BUDGET_TOKENS // b, block_size=b)
        s = r.summary
        distinct = SYSTEM_PROMPT_TOKENS // b  # shared blocks in the cache (one copy)
        hit_blocks = sum(x.cached_tokens for x in r.seqs) // b
        row.update(
            {
                "replay_num_gpu_blocks": KV_BUDGET_TOKENS // b,
                "replay_hit_rate_first_admission": first_hit_rate(r.seqs),
                "replay_hit_rate_engine_counter": s["prefix_cache_hit_rate"],
                "replay_block_reuse_per_shared_block": round(hit_blocks / distinct, 1) if distinct else 0.0,
                "replay_kv_usage_max": s["kv_usage_max"],
                "replay_kv_usage_mean": s["kv_usage_mean"],
                "replay_preemptions": s["preemptions"],
                "replay_waiting_max": s["waiting_max"],
                "replay_ttft_p50_s": s["ttft_s"]["p50"],
                "replay_ttft_p95_s": s["ttft_s"]["p95"],
                "replay_ttft_p99_s": s["ttft_s"]["p99"],
            }
        )
        if not quick:  # a second seed, for the spread of the tail figures
            again = generate(
                mix="shared-system", count=len(shared.requests), rate=40, seed=2, prefix_tokens=SYSTEM_PROMPT_TOKENS
            )
            r2 = replay(again.requests, num_gpu_blocks=KV_BUDGET_TOKENS // b, block_size=b)
            row["replay_seed2_ttft_p95_s"] = r2.summary["ttft_s"]["p95"]
            row["replay_seed2_preemptions"] = r2.summary["preemptions"]

    def seed2(r_: dict[str, Any]) -> str:
        if "replay_seed2_ttft_p95_s" not in r_:
            return "— (quick)"
        return f"{ms(r_['replay_seed2_ttft_p95_s'])}, {r_['replay_seed2_preemptions']}"

    table = [
        f"KV bytes/token for {MODEL} ({KV_DTYPE}): {m.num_layers} layers × 2 × {m.num_key_value_heads} KV heads × "
        f"{m.head_dim} head_dim × 2 B = {bpt:,.0f} B (exact from the config). Lengths: §8.3 mix, "
        f"{lengths.size} requests, prompt+output. Replay: shared-system trace ({len(shared.requests)} requests, "
        f"{SYSTEM_PROMPT_TOKENS}-token system prompt, 40 req/s), {KV_BUDGET_TOKENS} KV tokens for every block size.",
        "",
        "| block size | waste/request (tokens) | waste share | waste share, short chats only | "
        "waste at 256 seqs (MiB) | blocks/request | "
        "shareable of 1000 prefix tokens | hit rate (first admission) | reuse per shared block | "
        "preemptions | KV max | TTFT p50 / p95 / p99 (ms) | seed 2: p95 (ms), preemptions |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r_ in rows:
        table.append(
            f"| {r_['block_size']} | {r_['waste_tokens_mean']:.1f} | {pc(r_['waste_share'])} | "
            f"{pc(r_['waste_share_short_chat'])} | "
            f"{r_['waste_mib_at_max_seqs']:.0f} | {r_['blocks_per_request_mean']:.0f} | "
            f"{r_['shared_prefix_tokens_shareable']} | {pc(r_['replay_hit_rate_first_admission'])} | "
            f"{r_['replay_block_reuse_per_shared_block']:.0f} | {r_['replay_preemptions']} | "
            f"{pc(r_['replay_kv_usage_max'])} | {ms(r_['replay_ttft_p50_s'])} / {ms(r_['replay_ttft_p95_s'])} / "
            f"{ms(r_['replay_ttft_p99_s'])} | {seed2(r_)} |"
        )
    table.append(
        f"| {contiguous['block_size']} | {contiguous['waste_tokens_mean']:.0f} | {pc(contiguous['waste_share'])} | — | "
        f"{contiguous['waste_mib_at_max_seqs']:.0f} | 1 | — | — | — | — | — | — | — |"
    )

    by = {r_["block_size"]: r_ for r_ in rows}
    b16, b128 = by[16], by[128]
    actual = (
        f"Mean waste per request grows from {by[8]['waste_tokens_mean']:.1f} tokens (block 8) to "
        f"{b128['waste_tokens_mean']:.1f} (block 128): {pc(by[8]['waste_share'])} → {pc(b128['waste_share'])} of "
        f"the allocated KV for the §8.3 mix ({pc(by[8]['waste_share_short_chat'])} → "
        f"{pc(b128['waste_share_short_chat'])} for short chats alone), "
        f"{by[8]['waste_mib_at_max_seqs']:.0f} → {b128['waste_mib_at_max_seqs']:.0f} MiB with 256 requests "
        f"running. Reserving a contiguous max-length region instead wastes {pc(contiguous['waste_share'])} "
        f"({contiguous['waste_mib_at_max_seqs'] / 1024:.0f} GiB at 256 requests, more "
        f"than an H100 holds, so far fewer requests could run). "
        f"Of the 1000-token system prompt, {b16['shared_prefix_tokens_shareable']} tokens are shareable at block 16 "
        f"and {b128['shared_prefix_tokens_shareable']} at block 128, so the first-admission hit rate falls from "
        f"{pc(b16['replay_hit_rate_first_admission'])} to {pc(b128['replay_hit_rate_first_admission'])}. With "
        f"{KV_BUDGET_TOKENS} KV tokens, block 128 preempts {b128['replay_preemptions']} times "
        f"(block 16: {b16['replay_preemptions']}) and TTFT p95 is {ms(b128['replay_ttft_p95_s'])} ms "
        f"vs {ms(b16['replay_ttft_p95_s'])} ms. The block table shrinks "
        f"{b16['blocks_per_request_mean'] / b128['blocks_per_request_mean']:.0f}x from block 16 to 128."
    )
    note = Note(
        title="§3.2 KV block size: waste, block table, prefix sharing",
        hypothesis=(
            "Bigger KV blocks waste more memory per request (about half a block each) and share less of a "
            "common prefix (only full blocks are shared). Smaller blocks mean longer block tables, which cost "
            "more to manage."
        ),
        fixed_conditions=[
            f"model {MODEL} KV layout ({bpt:,.0f} B/token, {KV_DTYPE}); H100-SXM roofline step time (twin)",
            f"length distribution: §8.3 mix, seed 1, {lengths.size} requests",
            f"replay: shared-system trace, {len(shared.requests)} requests, Poisson 40 req/s, seed 1, "
            f"{KV_BUDGET_TOKENS} KV tokens, max_num_seqs {MAX_NUM_SEQS}, vLLM-style hash prefix cache, LRU",
        ],
        changed_variable="block size: " + ", ".join(str(b) for b in BLOCK_SIZES) + " tokens",
        expected=(
            "Waste ≈ b/2 tokens per request, growing linearly with b. The hit rate drops once b no longer divides "
            "the 1000-token prompt well. Preemptions appear when waste eats into a tight KV budget."
        ),
        actual=actual,
        interpretation=(
            "Internal fragmentation is a per-request constant of about b/2 tokens. For requests that are "
            "hundreds to thousands of tokens long, it is a small share at block 16. It matters at 64–128 when "
            "requests are short (the short-chat column). The large losses are elsewhere. First, a contiguous "
            "per-request reservation wastes most of the memory, and that is the problem paged attention removes. "
            "Second, prefix sharing works only at block granularity: the tail of a shared prompt that does not "
            "fill a block is recomputed by every request, so a 1000-token prompt loses "
            f"{SYSTEM_PROMPT_TOKENS - b128['shared_prefix_tokens_shareable']} tokens per request at block 128. "
            "Under a tight KV budget, the extra waste of big blocks turns into preemptions and a much worse TTFT "
            "p95, not just lower utilisation. Block 16 (vLLM's default on GPU) keeps waste and hit-rate loss small, "
            f"with a block table of {b16['blocks_per_request_mean']:.0f} entries per request on this mix. Block 8 "
            "saves little more and doubles the table. Prompts that are block-aligned (e.g. a 1024-token system "
            "prompt) remove the sharing loss at any block size up to their alignment."
        ),
        unverified=[
            "all replay figures are SIMULATED (engine twin): no GPU here; H100 timing is a roofline fitted to "
            "TensorRT-LLM's published points",
            "management cost of long block tables (kernel indexing, scheduler bookkeeping) is reported only as "
            "the number of blocks per request; the twin's step time does not depend on block size",
            "how soon a freed block is reused by another request is not measured: the twin counts blocks, it "
            "does not name them. Reuse is shown as hits per shared block",
            "real vLLM on GPU restricts block sizes per attention backend (e.g. FlashAttention: multiples of "
            "16); the CPU backend needs multiples of 32 (see TWIN.md)",
        ],
        next_experiment=(
            "kv_traffic: the three §3.3 traffic shapes at block 16, sweeping the KV budget to find where the "
            "cache runs out."
        ),
    )
    meta = trace_meta(
        shared,
        started=started,
        duration_s=time.monotonic() - t0,
        command=command,
        block_sizes=list(BLOCK_SIZES),
        kv_budget_tokens=KV_BUDGET_TOKENS,
        kv_bytes_per_token=bpt,
    )

    def plot(path: Path) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        bs = [r_["block_size"] for r_ in rows]
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
        a1.plot(bs, [r_["waste_share"] * 100 for r_ in rows], "o-", label="waste share of allocated KV (%)")
        a1.plot(
            bs, [r_["waste_share_short_chat"] * 100 for r_ in rows], "o:", color="C1", label="same, short chats only"
        )
        a1.set_xscale("log", base=2)
        a1.set_xlabel("block size (tokens)")
        a1.set_ylabel("internal fragmentation (%)")
        a1b = a1.twinx()
        a1b.plot(bs, [r_["blocks_per_request_mean"] for r_ in rows], "s--", color="gray", label="blocks/request")
        a1b.set_ylabel("blocks per request (block table)")
        a1.set_title("Waste vs block table size")
        a1.legend(loc="upper left", fontsize=8)
        a2.plot(bs, [(r_["replay_hit_rate_first_admission"] or 0) * 100 for r_ in rows], "o-", label="hit rate (%)")
        a2.set_xscale("log", base=2)
        a2.set_xlabel("block size (tokens)")
        a2.set_ylabel("prefix hit rate (%)")
        a2b = a2.twinx()
        a2b.plot(bs, [(r_["replay_ttft_p95_s"] or 0) * 1000 for r_ in rows], "s--", color="C3", label="TTFT p95")
        a2b.set_ylabel("TTFT p95 (ms)", color="C3")
        a2.set_title(f"Shared 1000-token prompt, {KV_BUDGET_TOKENS} KV tokens")
        fig.suptitle(f"§3.2 block size — SIMULATED (engine twin, {MODEL})")
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)

    return write_experiment(
        out,
        name=NAME,
        simulated=True,
        rows={"block_sizes": rows, "contiguous_baseline": contiguous},
        table_md="\n".join(table),
        note=note,
        command=command,
        meta=meta,
        plot=plot,
    )
