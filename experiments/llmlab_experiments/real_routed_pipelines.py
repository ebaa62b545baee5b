"""Routing by request class on REAL vLLM on this CPU (issue 20, scope 2): pipelines B (latency) and C (long
context) as deployments of one model (``configs/pipelines-catalog.yaml``), one engine per core, against two
engines of B alone and two of C alone. The twin's run (:mod:`llmlab_experiments.routed_pipelines`) has three
engines (A, B, C); this host has two cores, so the real run keeps the two pipelines whose classes meet in one
interactive service (short questions and chats beside long documents) and gives each engine a core of its own:
its process is pinned there (``taskset``) and so are its OpenMP threads (``VLLM_CPU_OMP_THREADS_BIND``), so an
idle engine's core does not speed up the busy one, as on GPUs. The stack (gateway, workers, NATS) and the load
client share both cores with them, alike in every variant.

The trace is routed_pipelines' mixed trace without A's batch part: B's short questions (open loop), C's
documents asked questions in turn, and C's short chats beside them, each request judged by its own class's CPU
SLO (``real_pipelines.CPU_SLO``). Same trace, same engine count in every variant; a fresh pair of engines per
variant and round (a reused engine would hold the documents an earlier variant cached). Everything MEASURED.

The method is a :class:`Pair` (two pipelines, the trace's parts, sizes, note texts) run by :func:`run_pair`;
:mod:`llmlab_experiments.real_routed_pipelines_ab` is the other pair, A and B.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from llmlab_experiments import routed_pipelines as rp
from llmlab_experiments.note import Note, metadata, write_experiment
from llmlab_experiments.real_caching_batching import cpu_vllm_fields
from llmlab_experiments.real_pipelines import QUEUE_TIMEOUT_S, SHORT_MAX_TOKENS, CpuLaunch, Sizes, vllm_process


@dataclass(frozen=True)
class Pair:
    """Two pipelines, one engine each (a core each), routed by class against two engines of either alone, on the
    parts of the mixed trace their classes take; the texts of its note."""

    name: str  # the experiment, and its folder under results/
    pipelines: tuple[str, str]
    parts: tuple[str, ...]
    full: Sizes
    quick: Sizes
    hypothesis: str
    expected: str
    interpretation: str

    @property
    def design(self) -> rp.Design:
        a, b = self.pipelines
        return rp.Design({"by class": (a, b), f"{a} only": (a, a), f"{b} only": (b, b)}, self.parts)


# What each part of the trace is, for the metadata.
_INPUT = {
    "batch": "A's paragraphs",
    "interactive": "B's one-line questions",
    "documents": "C's ~60-clause documents",
    "chats": "C's short chats",
}

BC = Pair(
    name="real_routed_pipelines",
    pipelines=("B", "C"),
    parts=("interactive", "documents", "chats"),
    # The twin's run's sizes, so the parts match it request for request; A's fields are unused (no batch part).
    full=replace(rp.FULL, a_streams=1, a_requests_per_stream=1, a_max_tokens=4, a_rungs=(1,)),
    quick=Sizes(a_streams=1, a_requests_per_stream=1, a_max_tokens=4, a_rungs=(1,),
                b_requests=6, b_rate_per_s=2.0, b_max_tokens=8,
                c_documents=1, c_questions=2, c_doc_sentences=60, c_max_tokens=6, c_short_chats=2),
    hypothesis=(
        "Sending short interactive requests to B and long documents to C keeps the short ones from waiting behind "
        "document prefills, so more requests meet their SLO than on two engines of either pipeline, where every "
        "engine takes both kinds."
    ),
    expected="by class: the highest SLO attainment, from the interactive and chat parts; B only or C only: short "
    "requests late behind documents on the engine they share",
    interpretation=(
        "The per-part columns say where each variant loses requests. By class, C's one engine takes every document "
        "and B's one engine every short request; alone, each pipeline spreads both kinds over its two engines. On "
        "these small engines B and C differ in their batch and prefill limits (C: more sequences, a larger prefill "
        "budget, a long-prefill threshold), not in what a GPU adds (tensor parallelism, memory), so what routing by "
        "class buys here is mostly isolation of the two kinds."
    ),
)  # fmt: skip
NAME = BC.name
DESIGN = BC.design
FULL = BC.full
QUICK = BC.quick


def core_of(key: str, cores: list[int]) -> int:
    """The core of engine ``key`` (a pipeline letter and the engine's number, from 1: "B1", "C2"): engine i on
    the i-th core this process may use, round robin."""
    return cores[(int(key[1:]) - 1) % len(cores)]


def pinned_vllm_process(key: str, port: int, launch: CpuLaunch) -> Any:
    """Real vLLM with the pipeline's flags, its processes and its OpenMP threads on one core of their own."""
    core = core_of(key, sorted(os.sched_getaffinity(0)))
    p = vllm_process(key, port, launch)
    p.cmd = ["taskset", "-c", str(core), *p.cmd]  # the engine core process inherits the affinity
    p.env["VLLM_CPU_OMP_THREADS_BIND"] = str(core)  # vLLM binds its OpenMP threads to this list
    return p


def run(out: Path, quick: bool, command: str) -> Path:
    return run_pair(BC, out, quick, command)


def report(out: Path, command: str, s: Sizes, rows: list[dict[str, Any]], t_start: float, duration: float) -> Path:
    return report_pair(BC, out, command, s, rows, t_start, duration)


def run_pair(pair: Pair, out: Path, quick: bool, command: str) -> Path:
    s = pair.quick if quick else pair.full
    t_start = time.time()
    rows = rp.execute(s, spawn=pinned_vllm_process, design=pair.design)
    return report_pair(pair, out, command, s, rows, t_start, time.time() - t_start)


def _concurrency(s: Sizes, part: str) -> str:
    return {
        "batch": f"batch {s.a_streams} closed-loop streams of {s.a_requests_per_stream}",
        "interactive": f"interactive Poisson {s.b_rate_per_s}/s ({s.b_requests} requests)",
        "documents": f"{s.c_documents} document streams of {s.c_questions} questions",
        "chats": f"{s.c_short_chats} chats 2 s apart",
    }[part]


def _output_len(s: Sizes, part: str) -> int:
    return {
        "batch": s.a_max_tokens,
        "interactive": s.b_max_tokens,
        "documents": s.c_max_tokens,
        "chats": SHORT_MAX_TOKENS,
    }[part]


def report_pair(
    pair: Pair, out: Path, command: str, s: Sizes, rows: list[dict[str, Any]], t_start: float, duration: float
) -> Path:
    design = pair.design
    summary = rp.summarize(rows, design)
    v = rp.verdict(summary)
    rounds = sorted({r["round"] for r in rows})
    a, b = pair.pipelines
    meta = metadata(
        **cpu_vllm_fields(
            t_start,
            duration,
            command,
            "vLLM OpenAI server on CPU x2, one core each (taskset + VLLM_CPU_OMP_THREADS_BIND), "
            "behind gateway -> NATS -> worker-vllm",
        ),
        prompt_dataset=f"real_pipelines' synthetic, seeded workloads, mixed (one trace, {len(pair.parts)} parts "
        "at once)",
        input_length_distribution=", ".join(_INPUT[p] for p in pair.parts),
        output_length_distribution="fixed: "
        + ", ".join(f"{p} {_output_len(s, p)}" for p in pair.parts)
        + " (end tokens banned)",
        concurrency="; ".join(_concurrency(s, p) for p in pair.parts),
        warmup="two short requests through the stack per variant, not measured",
        sampling_parameters={"temperature": 0},
        rounds=len(rounds),
        catalog=str(rp.CATALOG),
        worker_concurrency={p: rp.CONCURRENCY[p] for p in pair.pipelines},
        cores={"engines": "one each, pinned", "stack_and_client": "both, shared"},
    )
    left_out = [p for p in rp.PARTS if p not in pair.parts]
    note = Note(
        title=f"Routing by request class across pipelines {a} and {b} on real vLLM (one core per engine), "
        "against either pipeline alone",
        hypothesis=pair.hypothesis,
        fixed_conditions=[
            "two real vLLM-on-CPU engines per variant (SmolLM2-135M, fp32, --enforce-eager), each on one core of "
            "its own; a fresh pair per variant and round",
            f"one gateway (embedded router, catalog {rp.CATALOG}), one worker per engine at its pipeline's "
            f"concurrency ({a} {rp.CONCURRENCY[a]}, {b} {rp.CONCURRENCY[b]}), queue bound {QUEUE_TIMEOUT_S:g} s",
            f"the same mixed trace in every variant (its parts {', '.join(pair.parts)}; seeded per round), rounds "
            "in ABBA order",
        ],
        changed_variable=f"which pipeline each of the two engines runs: {a} and {b}, routed by class; or both the same",
        expected=pair.expected,
        actual=rp.actual(summary, v, rows, "both single pipelines"),
        interpretation=pair.interpretation,
        unverified=[
            "the three pipelines at once on the whole trace (a third engine needs a third core): the twin's run "
            f"(results/routed_pipelines) has them, SIMULATED; this pair's trace leaves out {', '.join(left_out)}",
            "the stack and the load client share the engines' cores (their CPU falls on both engines alike)",
            f"GPU-only flags of {a} and {b} (tensor parallelism, GPU memory) are not launched here (configs/pipelines)",
        ],
        next_experiment="the three pipelines on the whole trace on a host with a core set per engine",
    )
    doc = {"runs": rows, "summary": summary, "verdict": v, "sizes": vars(s), "rounds": rounds}
    return write_experiment(
        out,
        name=pair.name,
        simulated=False,
        rows=doc,
        table_md=rp.table(summary, design),
        note=note,
        command=command,
        meta=meta,
        plot=lambda path: rp.plot(summary, path, design, label="MEASURED, real vLLM"),
    )
