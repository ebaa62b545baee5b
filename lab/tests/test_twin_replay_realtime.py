"""The twin's replay command line in real time: a trace sent at its arrival times to a server."""

from __future__ import annotations

import pytest
from llmlab_engine_sim.api import create_app
from llmlab_engine_sim.settings import SimSettings
from llmlab_lab import twin_replay
from llmlab_testkit.inproc import serve_in_loop
from llmlab_twin import replay
from llmlab_twin import trace as tr

pytestmark = pytest.mark.integration


async def test_fixed_step_pins_the_itl_and_realtime_replay_records_it() -> None:
    trace = tr.generate(mix="short-chat", count=6, rate=20, seed=2)
    settings = SimSettings(model="m", mode="twin", fixed_step_ms=20, output_len=4096)
    async with serve_in_loop(create_app(settings), "twin") as base:
        rows, wall, _ = await twin_replay.run_realtime(trace, base_url=base + "/v1", model="m")
    assert all(r["ok"] for r in rows), rows
    assert [r["output_tokens"] for r in sorted(rows, key=lambda r: r["id"])] == [
        r.output_tokens for r in trace.requests
    ]
    itls = [x for r in rows for x in r["itls_s"]]
    itls.sort()
    assert 0.015 < itls[len(itls) // 2] < 0.03  # median chunk gap ~ the pinned 20 ms step
    summary = twin_replay.summarize_realtime(rows, wall, replay.load_slo_classes())
    assert summary["simulated"] is False and summary["ok"] == 6
