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


def test_the_servers_twin_settings_reach_its_scheduler() -> None:
    """--long-prefill-token-threshold and --max-num-batched-tokens, as a pipeline launches them."""
    from llmlab_engine_sim.settings import SimSettings
    from llmlab_engine_sim.twin_rt import twin_scheduler_from_settings

    s = SimSettings(
        mode="twin",
        twin_model="SmolLM2-135M",
        twin_device="cpu-local",
        twin_dtype="fp32",
        max_num_batched_tokens=4096,
        long_prefill_token_threshold=2048,
        num_gpu_blocks=182,
        block_size=128,
    )
    cfg = twin_scheduler_from_settings(s).config
    assert (cfg.max_num_batched_tokens, cfg.long_prefill_token_threshold) == (4096, 2048)
    assert (cfg.kv.num_gpu_blocks, cfg.kv.block_size) == (182, 128)
