"""``make autoscale-demo``, CI-sized: the controller scales the simulator's workers 1 -> N -> 1 under
a burst and the low load after it, reading the manifest's metric from a real Prometheus, and no
request fails or is cut short while workers drain away."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from llmlab_lab import autoscale

pytestmark = [pytest.mark.e2e]


@pytest.mark.timeout(240)
def test_a_burst_scales_up_and_the_silence_back_to_one_without_losing_a_stream(tmp_path: Path) -> None:
    assert autoscale.main(["--quick", "--out", str(tmp_path)]) == 0
    [run] = (tmp_path / "autoscale").glob("2*")
    doc = json.loads((run / "result.json").read_text())
    s = doc["summary"]
    assert s["requests"] > 50 and s["failed"] == 0 and s["cut_short"] == 0, s
    low, peak, final = s["replicas_min_max_final"]
    assert low == 1 and peak >= 3 and final == 1, s
    # Every worker that left drained and exited (-15: uvicorn re-raises the SIGTERM once the drain is
    # done), and some left while they still held streams: those finished (no failed or cut request).
    # (The ramp may scale up again after a first scale-down: more than peak - 1 may leave.)
    assert s["drained_workers"] == s["workers_started"] - final >= peak - 1 and s["drained_not_exited"] == 0
    assert set(s["drained_exit_codes"]) <= {0, -15}, s["drained_exit_codes"]
    assert s["drained_with_streams"] >= 1, s
    # Scale-up came while the burst lasted; the workers were ready within the run.
    assert s["first_scale_up_after_burst_s"] is not None and s["first_scale_up_after_burst_s"] < 10
    # The backlog the controller read crossed the target per worker (the metric is real).
    assert s["max_metric"] > doc["policy"]["threshold"]
    assert (run / "result.md").is_file() and (run / "result.png").stat().st_size > 0
    assert doc["meta"]["simulated"] is True
