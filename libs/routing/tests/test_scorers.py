"""One test per scorer plug-in: every score is in 0..1 and 1 is the best candidate."""

from __future__ import annotations

import pytest
from llmlab_routing.plugins import SCORERS
from llmlab_testkit.routing import dep, inputs, worker

pytestmark = pytest.mark.unit


def scores(name: str, deps, **kw):  # type: ignore[no-untyped-def]
    return SCORERS[name].score(inputs(deps, **kw), deps)


def test_quality_is_the_catalog_score() -> None:
    assert scores("quality", [dep("a", quality=0.2), dep("b", quality=0.9)]) == [0.2, 0.9]


def test_latency_is_a_ratio_to_the_fastest() -> None:
    fast, slow = dep("a", ttft_p95_s=0.1, itl_p95_s=0.01), dep("b", ttft_p95_s=0.4, itl_p95_s=0.04)
    s = scores("latency", [fast, slow], max_output_tokens=1)
    assert s[0] == pytest.approx(1.0) and s[1] == pytest.approx(0.25)


def test_cost_is_a_ratio_to_the_cheapest_and_tolerates_free() -> None:
    s = scores(
        "cost",
        [dep("a", input_usd_per_mtok=1, output_usd_per_mtok=1), dep("b", input_usd_per_mtok=4, output_usd_per_mtok=4)],
    )
    assert s == [pytest.approx(1.0), pytest.approx(0.25, rel=1e-4)]
    free = scores("cost", [dep("a", input_usd_per_mtok=0, output_usd_per_mtok=0), dep("b")])
    assert free[0] == 1.0 and 0 <= free[1] < 1e-3


def test_cache_is_the_share_of_leading_blocks_a_worker_holds() -> None:
    warm = dep("a", workers=[worker("w1", match=3), worker("w2")])
    cold = dep("b")
    assert scores("cache", [warm, cold], prefix_blocks=4) == [0.75, 0.0]
    assert scores("cache", [warm, cold], prefix_blocks=0) == [0.0, 0.0]
