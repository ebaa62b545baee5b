"""The decision as a whole: hard vs soft filters, weighted scores, the bounded chain, refusals."""

from __future__ import annotations

import random

import pytest
from llmlab_routing.decide import decide
from llmlab_testkit.routing import dep, inputs, worker

pytestmark = pytest.mark.unit


def test_weighted_normalised_score_picks_and_ranks() -> None:
    cheap = dep("cheap", quality=0.3, input_usd_per_mtok=0.1, output_usd_per_mtok=0.1)
    good = dep("good", quality=0.9, input_usd_per_mtok=1.0, output_usd_per_mtok=1.0, ttft_p95_s=0.4)
    d = decide(inputs([cheap, good], weights={"quality": 1.0}))
    assert d.ranking == ["good", "cheap"]
    d = decide(inputs([cheap, good], weights={"cost": 1.0}))
    assert d.ranking == ["cheap", "good"]
    for per in d.scores.values():
        assert all(0.0 <= v <= 1.0 for v in per.values())


def test_no_scorers_keeps_catalog_order() -> None:
    d = decide(inputs([dep("a"), dep("b", quality=1.0)], weights={}))
    assert d.ranking == ["a", "b"]


def test_soft_filter_is_relaxed_only_when_it_would_empty_the_set() -> None:
    low, mid = dep("low", quality=0.2), dep("mid", quality=0.5)
    d = decide(inputs([low, mid], difficulty_floor=0.6, difficulty_class="hard"))
    assert d.targets and d.verdicts["low"]["difficulty"].startswith("relaxed:")
    d = decide(inputs([low, mid], difficulty_floor=0.4, difficulty_class="medium"))
    assert d.ranking == ["mid"] and not d.verdicts["low"]["difficulty"].startswith("relaxed")


@pytest.mark.parametrize(
    ("kw", "status", "code"),
    [
        ({"prompt_tokens": 10_000}, 400, "context_length_exceeded"),
        ({"quality_floor": 0.99}, 422, "no_route"),
        ({"cost_cap_usd": 1e-9}, 422, "no_route"),
    ],
)
def test_refusals_name_the_blocking_filter(kw: dict, status: int, code: str) -> None:
    d = decide(inputs([dep("a"), dep("b")], **kw))
    assert (d.targets, d.error_status, d.error_code) == ([], status, code)


def test_no_live_worker_is_503() -> None:
    d = decide(inputs([dep("a", workers=[])]))
    assert (d.error_status, d.error_code) == (503, "no_workers")


def test_chain_is_bounded_and_never_repeats_a_target_over_random_clusters() -> None:
    rng = random.Random(7)
    for trial in range(300):
        deps = [
            dep(
                f"d{i}",
                quality=rng.random(),
                workers=[worker(f"d{i}-w{j}", rng.randrange(8)) for j in range(rng.randrange(0, 4))],
            )
            for i in range(rng.randrange(1, 6))
        ]
        max_chain, retries = rng.randrange(1, 6), rng.randrange(0, 3)
        picker = rng.choice(["least-load", "power-of-two", "round-robin", "prefix-affinity"])
        d = decide(inputs(deps, max_chain=max_chain, replica_retries=retries, picker=picker, seed=trial))
        pairs = [(t.deployment, t.worker_id) for t in d.targets]
        assert len(pairs) <= max_chain
        assert len(pairs) == len(set(pairs)), pairs
        per_dep: dict[str, int] = {}
        for dep_id, _ in pairs:
            per_dep[dep_id] = per_dep.get(dep_id, 0) + 1
        assert all(n <= 1 + retries for n in per_dep.values())
        # the same inputs decide the same (the seed is part of the inputs)
        again = decide(inputs(deps, max_chain=max_chain, replica_retries=retries, picker=picker, seed=trial))
        assert again.to_json() == d.to_json()


def test_single_worker_deployment_retries_through_its_pool() -> None:
    d = decide(inputs([dep("a"), dep("b")], weights={"quality": 1.0}, max_chain=3, replica_retries=1))
    assert [(t.deployment, t.worker_id) for t in d.targets] == [("a", "a-w1"), ("a", None), ("b", "b-w1")]


def _pipelines() -> list:  # type: ignore[type-arg]
    return [dep(p, pipeline=p, model="m") for p in ("throughput", "latency", "long_context")]


@pytest.mark.parametrize("cls", ["throughput", "latency", "long_context"])
def test_pipeline_filter_takes_each_request_class_to_its_pipeline(cls: str) -> None:
    d = decide(inputs(_pipelines(), request_class=cls, filters=["healthy", "pipeline"]))
    assert d.ranking == [cls]


def test_pipeline_filter_is_relaxed_when_the_class_pipeline_has_no_live_worker() -> None:
    deps = _pipelines()
    deps[2].workers = []  # long_context down: another pipeline serves it rather than none
    d = decide(inputs(deps, request_class="long_context", filters=["healthy", "pipeline"]))
    assert d.targets and set(d.ranking) == {"throughput", "latency"}
    assert d.verdicts["latency"]["pipeline"].startswith("relaxed:")
