"""worker-sglang against the simulator's SGLang flavour (SGLang has no CPU build; the same
contract runs against real SGLang in `make gpu-smoke`)."""

from __future__ import annotations

import httpx
import pytest
from llmlab_common.metrics import parse_prometheus_text
from llmlab_testkit import contract
from llmlab_testkit.contract import EngineUnderTest
from llmlab_testkit.procs import Stack, url

pytestmark = pytest.mark.integration
MODEL = "Qwen/Qwen3-32B"


@pytest.fixture
def engine(stack: Stack) -> EngineUnderTest:
    sim = stack.sim("sglang", MODEL, ttft_ms=30, itl_ms=10, output_len=2000)
    base = url(sim)

    def running() -> float:
        return parse_prometheus_text(httpx.get(base + "/metrics").text).get("sglang:num_running_reqs", 0.0)

    return EngineUnderTest("sglang", "gpu-sglang", base, MODEL, running)


async def test_streams_tokens_usage_and_timings(stack: Stack, engine: EngineUnderTest) -> None:
    await contract.streams_tokens_usage_and_timings(stack, engine)


async def test_cancel_stops_generation_on_the_engine(stack: Stack, engine: EngineUnderTest) -> None:
    await contract.cancel_stops_generation_on_the_engine(stack, engine)


async def test_heartbeat_carries_engine_load(stack: Stack, engine: EngineUnderTest) -> None:
    await contract.heartbeat_carries_engine_load(stack, engine)
