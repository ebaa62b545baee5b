"""The twin's step scheduler on the event loop (the server's ``--mode twin``)."""

from __future__ import annotations

import asyncio

import pytest
from llmlab_engine_sim.scheduler import OutputPlan, SimRequest
from llmlab_engine_sim.twin_rt import RealtimeTwinScheduler
from llmlab_twin.kvcache import KVConfig
from llmlab_twin.sched import FixedStepCost, TwinConfig

pytestmark = pytest.mark.unit


async def test_realtime_twin_with_steps_shorter_than_the_timer_resolution() -> None:
    """Steps of 0.2 ms (below the real clock's 1 ms resolution) must not spin the loop."""
    twin = RealtimeTwinScheduler(TwinConfig(kv=KVConfig(num_gpu_blocks=100)), FixedStepCost(0.0002))
    twin.start()
    try:
        req = SimRequest("r", prompt_tokens=10, plan=OutputPlan(["x"] * 50, "length"))
        twin.submit(req)
        async with asyncio.timeout(5):
            while not req.sink.closed:
                await req.sink.wait()
                req.sink.take()
        assert req.generated == 50 and req.finish_reason == "length"
        assert twin.core.stats.steps == 50
        assert twin.snapshot()["twin"]["lag_ms"]["n"] == 50
    finally:
        await twin.stop()
