"""Routing by request class on REAL vLLM on this CPU, the other pair (issue 20, scope 2): pipelines A
(throughput) and B (latency), one engine per core, against two engines of A alone and two of B alone, on the
mixed trace's batch part (A's medium requests in the ``batch`` SLO class, closed loop) and interactive part (B's
short questions, open loop). The method is :mod:`llmlab_experiments.real_routed_pipelines`' (B and C there):
together the two pairs put each of A, B and C against routing by class on real engines, which three engines on
this 2-core host could not do fairly at once. Everything MEASURED."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from llmlab_experiments import routed_pipelines as rp
from llmlab_experiments.real_pipelines import Sizes
from llmlab_experiments.real_routed_pipelines import Pair, run_pair

AB = Pair(
    name="real_routed_pipelines_ab",
    pipelines=("A", "B"),
    parts=("batch", "interactive"),
    # The twin's run's sizes, so A's and B's parts match it; C's fields are unused (no document or chat part).
    full=replace(rp.FULL, c_documents=1, c_questions=1, c_doc_sentences=60, c_max_tokens=4, c_short_chats=0),
    quick=Sizes(a_streams=3, a_requests_per_stream=1, a_max_tokens=8, a_rungs=(3,),
                b_requests=6, b_rate_per_s=2.0, b_max_tokens=8,
                c_documents=1, c_questions=1, c_doc_sentences=60, c_max_tokens=4, c_short_chats=0),
    hypothesis=(
        "Sending the batch requests to A and the short interactive ones to B keeps the short ones out of A's deep "
        "batches, so more requests meet their SLO than on two engines of either pipeline, where every engine takes "
        "both kinds."
    ),
    expected="by class: the highest SLO attainment, from the interactive part; A only: short requests late behind "
    "the batch; B only: close to by class if B's limits hold the batch too",
    interpretation=(
        "The per-part columns say where each variant loses requests. By class, A's one engine takes the whole batch "
        "and B's one engine every short question; alone, each pipeline spreads both over its two engines. On these "
        "small engines A and B differ in their batch and prefill limits (A: more sequences and a larger prefill "
        "budget) and B's priority scheduling; what routing by class buys here is mostly isolation of the two kinds."
    ),
)  # fmt: skip
NAME = AB.name


def run(out: Path, quick: bool, command: str) -> Path:
    return run_pair(AB, out, quick, command)
