"""Routing by request class through the whole stack: one model deployed as pipelines A, B and C
(``configs/pipelines-catalog.yaml``, policy ``by-class``), a simulator and a worker per pipeline. Each
request class reaches its pipeline's engine, the class coming from what the gateway knows (the SLO class
header, the prompt's estimated length, max_tokens); with C's worker gone, a long prompt is served by another
pipeline rather than refused."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from llmlab_testkit.e2e import eventually, metric, sim_stats
from llmlab_testkit.fixtures import DEV_KEY
from llmlab_testkit.procs import ManagedProcess, Stack, url

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
CATALOG = REPO / "configs" / "pipelines-catalog.yaml"
MODEL = "SmolLM2-135M-Instruct"
AUTH = {"Authorization": f"Bearer {DEV_KEY}"}
# 4,000 bytes: about 1,340 tokens by the gateway's estimate (3 bytes a token), over the catalog's 1,024
DOCUMENT = "The harbour office files its tide report every week. " * 75


async def chat(gw: ManagedProcess, user: str, system: str | None = None, max_tokens: int = 8, **headers: str) -> str:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
    async with httpx.AsyncClient() as h:
        r = await h.post(
            url(gw) + "/v1/chat/completions",
            headers={**AUTH, **headers},
            timeout=30,
            json={"model": MODEL, "messages": messages, "max_tokens": max_tokens},
        )
    assert r.status_code == 200, r.text
    return r.headers["x-llmlab-deployment"]


async def test_each_request_class_reaches_its_pipeline_and_falls_back_when_it_is_gone(stack: Stack) -> None:
    env = {"LLMLAB_CATALOG_PATH": str(CATALOG)}
    sims, workers = {}, {}
    for p in ("a", "b", "c"):
        sims[p] = stack.sim("vllm", MODEL, ttft_ms=10, itl_ms=2, output_len=4)
        workers[p] = stack.worker("vllm", f"pipeline-{p}", url(sims[p]), worker_id=f"w-{p}", env=env)
    gw = stack.gateway(env=env)
    await eventually(lambda: metric(gw, "llmlab_gateway_live_workers") == 3, what="three workers heard")

    assert await chat(gw, "one word for tides?") == "smollm2-b-latency"  # the plan's class: interactive
    assert await chat(gw, "one word for tides?", **{"x-llmlab-slo-class": "batch"}) == "smollm2-a-throughput"
    assert await chat(gw, "write a long story", max_tokens=1000) == "smollm2-a-throughput"  # over B's output cap
    assert await chat(gw, "which office files most often?", system=DOCUMENT) == "smollm2-c-long-context"
    # the engines that answered are the ones the router chose
    assert [sim_stats(sims[p])["received"] for p in ("a", "b", "c")] == [2, 1, 1]

    workers["c"].stop(timeout=30)
    await eventually(lambda: metric(gw, "llmlab_gateway_live_workers") == 2, timeout=15, what="C's worker gone")
    assert await chat(gw, "which office files most often?", system=DOCUMENT) in {
        "smollm2-a-throughput",
        "smollm2-b-latency",
    }
