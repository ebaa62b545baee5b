"""Routing by request class on the pipelines' catalog (``configs/pipelines-catalog.yaml``): one model as
pipelines A, B and C, each class of request to its own, through the router core (catalog, live state,
decision), and another pipeline when the class's own has no live worker."""

from __future__ import annotations

from pathlib import Path

import pytest
from llmlab_common.messages import RouteQuery
from llmlab_routing.config import load_router_catalog
from llmlab_routing.core import RouterCore
from llmlab_testkit.routing import heartbeat as hb

pytestmark = pytest.mark.unit

CATALOG = Path("configs") / "pipelines-catalog.yaml"
MODEL = "SmolLM2-135M-Instruct"
POOLS = ("pipeline-a", "pipeline-b", "pipeline-c")


def core(pools: tuple[str, ...] = POOLS) -> RouterCore:
    c = RouterCore(load_router_catalog(CATALOG), clock=lambda: 1000.0)
    for pool in pools:
        c.state.on_heartbeat(hb(f"w-{pool}", pool=pool), now=1000.0)
    return c


def routed(c: RouterCore, prompt_tokens: int, max_output_tokens: int, slo_class: str | None = None) -> list[str]:
    q = RouteQuery(
        request_id="r",
        model=MODEL,
        plan="pro",
        prompt_tokens=prompt_tokens,
        max_output_tokens=max_output_tokens,
        slo_class=slo_class,
    )
    reply, _, _ = c.route(q)
    assert reply.error is None, reply.error
    return list(dict.fromkeys(t.deployment for t in reply.targets))  # a replica retry repeats the deployment


@pytest.mark.parametrize(
    ("prompt", "out", "slo_class", "deployment"),
    [
        (40, 16, None, "smollm2-b-latency"),  # the plan's class: interactive
        (40, 16, "batch", "smollm2-a-throughput"),
        (100, 1000, None, "smollm2-a-throughput"),  # beyond B's output cap
        (1800, 12, None, "smollm2-c-long-context"),
        (1800, 12, "batch", "smollm2-c-long-context"),
    ],
)
def test_each_request_class_goes_to_its_pipeline(prompt: int, out: int, slo_class: str | None, deployment: str) -> None:
    assert routed(core(), prompt, out, slo_class) == [deployment]


def test_a_class_whose_pipeline_is_down_is_served_by_another() -> None:
    targets = routed(core(("pipeline-a", "pipeline-b")), 1800, 12)
    assert targets and "smollm2-c-long-context" not in targets
