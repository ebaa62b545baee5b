"""The simulated DCGM families of the fixed-latency mode (both flavours), on a virtual clock:
utilisation from the running batch over the scrape window, framebuffer from weights + the KV pool
in use, power between idle and TDP. Twin mode's are covered in test_twin_contract."""

from __future__ import annotations

import pytest
from llmlab_common.metrics import check_exposition
from llmlab_engine_sim.engine import SimEngine
from llmlab_engine_sim.gpu import FixedGpuCollector, gpu_block_size
from llmlab_engine_sim.scheduler import OutputPlan, SimRequest, VirtualClock
from llmlab_engine_sim.settings import SimSettings
from prometheus_client import CollectorRegistry, generate_latest

pytestmark = pytest.mark.unit
ITL_MS = 50.0


def _values(collector: FixedGpuCollector) -> dict[str, float]:
    out: dict[str, float] = {}
    for fam in collector.collect():
        (sample,) = fam.samples
        assert sample.labels == {"gpu": "0", "modelName": "H100-SXM", "simulated": "true"}
        out[fam.name] = sample.value
    return out


@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
async def test_utilisation_memory_and_power_follow_the_running_batch(flavor: str) -> None:
    """Catches: utilisation that ignores the batch (or the window), memory without the weights or
    the KV in use, power outside [idle, TDP], or a missing family in one flavour."""
    clock = VirtualClock(start=1000.0)
    settings = SimSettings(
        flavor=flavor, max_num_seqs=4, ttft_ms=ITL_MS, itl_ms=ITL_MS, tick_ms=ITL_MS, kv_cache_tokens=4096
    )
    engine = SimEngine(settings, clock=clock)
    gpu = FixedGpuCollector(lambda: engine.scheduler, engine.metrics, settings, gpu_block_size(flavor))
    idle = _values(gpu)
    assert idle["DCGM_FI_DEV_GPU_UTIL"] == 0 and idle["DCGM_FI_DEV_POWER_USAGE"] == 90.0
    weights_mib = idle["DCGM_FI_DEV_FB_USED"]
    assert 14_000 < weights_mib < 16_000  # Llama-3.1-8B in bf16, nothing in the KV cache
    assert idle["DCGM_FI_DEV_FB_USED"] + idle["DCGM_FI_DEV_FB_FREE"] == pytest.approx(79.65 * 1024, rel=1e-3)
    engine.scheduler.start()
    try:
        for i in range(2):  # 2 of 4 slots busy for 40 ITLs
            plan = OutputPlan([" t"] * 40, "stop")
            engine.scheduler.submit(SimRequest(id=f"r{i}", prompt_tokens=500, plan=plan))
        await clock.advance(20 * ITL_MS / 1000)
        busy = _values(gpu)
        assert busy["DCGM_FI_DEV_GPU_UTIL"] == pytest.approx(50.0, abs=6.0)  # half the batch slots
        assert busy["DCGM_FI_DEV_FB_USED"] > weights_mib  # KV of 2 x (500 + generated) tokens
        assert 90.0 < busy["DCGM_FI_DEV_POWER_USAGE"] < 700.0
        await clock.run_until_idle()
        await clock.advance(1.0)
        after = _values(gpu)
        assert after["DCGM_FI_DEV_FB_USED"] == pytest.approx(weights_mib)
    finally:
        await engine.stop()


async def test_the_app_serves_the_gpu_families_and_the_process_collectors() -> None:
    """Catches: the fixed mode's collector not registered (only twin mode had GPU gauges)."""
    from llmlab_engine_sim.api import create_app

    app = create_app(SimSettings(flavor="sglang"))
    registry: CollectorRegistry = app.state.engine.registry
    text = generate_latest(registry).decode()
    for name in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_POWER_USAGE"):
        assert text.count(f"\n{name}{{") == 1
    assert "process_cpu_seconds_total" in text
    assert check_exposition(text) == []
