"""worker-vllm against REAL vLLM on the CPU: the shared worker contract."""

from __future__ import annotations

import pytest
from llmlab_testkit import contract
from llmlab_testkit.contract import EngineUnderTest
from llmlab_testkit.procs import Stack
from llmlab_testkit.vllm import SERVED_NAME, vllm_gauge

pytestmark = [pytest.mark.integration, pytest.mark.vllm_cpu]


@pytest.fixture
def engine(vllm_url: str) -> EngineUnderTest:
    return EngineUnderTest(
        "vllm", "cpu-vllm", vllm_url, SERVED_NAME, lambda: vllm_gauge(vllm_url, "vllm:num_requests_running")
    )


async def test_streams_tokens_usage_and_timings(stack: Stack, engine: EngineUnderTest) -> None:
    await contract.streams_tokens_usage_and_timings(stack, engine)


async def test_stop_sequence_on_completions(stack: Stack, engine: EngineUnderTest) -> None:
    await contract.stop_sequence_on_completions(stack, engine, prompt="1, 2, 3, 4,", stop=",")


async def test_cancel_stops_generation_on_the_engine(stack: Stack, engine: EngineUnderTest) -> None:
    await contract.cancel_stops_generation_on_the_engine(stack, engine)


async def test_heartbeat_carries_engine_load(stack: Stack, engine: EngineUnderTest) -> None:
    await contract.heartbeat_carries_engine_load(stack, engine)
