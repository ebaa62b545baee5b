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
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from llmlab_experiments import routed_pipelines as rp
from llmlab_experiments.note import Note, metadata, write_experiment
from llmlab_experiments.real_caching_batching import cpu_vllm_fields
from llmlab_experiments.real_pipelines import QUEUE_TIMEOUT_S, SHORT_MAX_TOKENS, CpuLaunch, Sizes, vllm_process

NAME = "real_routed_pipelines"
DESIGN = rp.Design(
    variants={"by class": ("B", "C"), "B only": ("B", "B"), "C only": ("C", "C")},
    parts=("interactive", "documents", "chats"),
)
# A's fields are unused (the trace has no batch part); B's and C's as the twin's run, so the parts match it.
FULL = Sizes(a_streams=1, a_requests_per_stream=1, a_max_tokens=4, a_rungs=(1,),
             b_requests=24, b_rate_per_s=1.0, b_max_tokens=16,
             c_documents=3, c_questions=2, c_doc_sentences=60, c_max_tokens=12, c_short_chats=6)  # fmt: skip
QUICK = Sizes(a_streams=1, a_requests_per_stream=1, a_max_tokens=4, a_rungs=(1,),
              b_requests=6, b_rate_per_s=2.0, b_max_tokens=8,
              c_documents=1, c_questions=2, c_doc_sentences=60, c_max_tokens=6, c_short_chats=2)  # fmt: skip


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
    s = QUICK if quick else FULL
    t_start = time.time()
    rows = rp.execute(s, spawn=pinned_vllm_process, design=DESIGN)
    return report(out, command, s, rows, t_start, time.time() - t_start)


def report(out: Path, command: str, s: Sizes, rows: list[dict[str, Any]], t_start: float, duration: float) -> Path:
    summary = rp.summarize(rows, DESIGN)
    v = rp.verdict(summary)
    rounds = sorted({r["round"] for r in rows})
    meta = metadata(
        **cpu_vllm_fields(
            t_start,
            duration,
            command,
            "vLLM OpenAI server on CPU x2, one core each (taskset + VLLM_CPU_OMP_THREADS_BIND), "
            "behind gateway -> NATS -> worker-vllm",
        ),
        prompt_dataset="real_pipelines' synthetic, seeded workloads, mixed (one trace, three parts at once)",
        input_length_distribution="B's one-line questions, C's ~60-clause documents and short chats",
        output_length_distribution=f"fixed: interactive {s.b_max_tokens}, documents {s.c_max_tokens}, "
        f"chats {SHORT_MAX_TOKENS} (end tokens banned)",
        concurrency=f"interactive Poisson {s.b_rate_per_s}/s ({s.b_requests} requests); {s.c_documents} document "
        f"streams of {s.c_questions} questions; {s.c_short_chats} chats 2 s apart",
        warmup="two short requests through the stack per variant, not measured",
        sampling_parameters={"temperature": 0},
        rounds=len(rounds),
        catalog=str(rp.CATALOG),
        worker_concurrency={p: rp.CONCURRENCY[p] for p in ("B", "C")},
        cores={"engines": "one each, pinned", "stack_and_client": "both, shared"},
    )
    note = Note(
        title="Routing by request class across pipelines B and C on real vLLM (one core per engine), against "
        "either pipeline alone",
        hypothesis=(
            "Sending short interactive requests to B and long documents to C keeps the short ones from waiting "
            "behind document prefills, so more requests meet their SLO than on two engines of either pipeline, "
            "where every engine takes both kinds."
        ),
        fixed_conditions=[
            "two real vLLM-on-CPU engines per variant (SmolLM2-135M, fp32, --enforce-eager), each on one core of "
            "its own; a fresh pair per variant and round",
            f"one gateway (embedded router, catalog {rp.CATALOG}), one worker per engine at its pipeline's "
            f"concurrency (B {rp.CONCURRENCY['B']}, C {rp.CONCURRENCY['C']}), queue bound {QUEUE_TIMEOUT_S:g} s",
            "the same mixed trace in every variant (seeded per round), rounds in ABBA order",
        ],
        changed_variable="which pipeline each of the two engines runs: B and C, routed by class; or both the same",
        expected="by class: the highest SLO attainment, from the interactive and chat parts; B only or C only: "
        "short requests late behind documents on the engine they share",
        actual=rp.actual(summary, v, rows, "both single pipelines"),
        interpretation=(
            "The per-part columns say where each variant loses requests. By class, C's one engine takes every "
            "document and B's one engine every short request; alone, each pipeline spreads both kinds over its "
            "two engines. On these small engines B and C differ in their batch and prefill limits (C: more "
            "sequences, a larger prefill budget, a long-prefill threshold), not in what a GPU adds (tensor "
            "parallelism, memory), so what routing by class buys here is mostly isolation of the two kinds."
        ),
        unverified=[
            "pipeline A and the batch part of the trace (a third engine needs a third core); the twin's run "
            "(results/routed_pipelines) has them, SIMULATED",
            "the stack and the load client share the engines' cores (their CPU falls on both engines alike)",
            "GPU-only flags of B and C (tensor parallelism, GPU memory) are not launched here (configs/pipelines)",
        ],
        next_experiment="the three pipelines with the batch part on a host with a core set per engine",
    )
    doc = {"runs": rows, "summary": summary, "verdict": v, "sizes": vars(s), "rounds": rounds}
    return write_experiment(
        out,
        name=NAME,
        simulated=False,
        rows=doc,
        table_md=rp.table(summary, DESIGN),
        note=note,
        command=command,
        meta=meta,
        plot=lambda p: rp.plot(summary, p, DESIGN, label="MEASURED, real vLLM"),
    )
