"""The fleet in the engine twin (llmlab_lab.twin_fleet): pods start after download and load, pull
only with free slots, and faults lose no request: a killed pod's streams continue elsewhere with
what was delivered, a rolling update keeps capacity, a node loss is replaced."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from llmlab_lab import twin_fleet as tf
from llmlab_twin.replay import build_setup
from llmlab_twin.sched import make_cost_model

pytestmark = pytest.mark.unit

SPEC = tf.FleetSpec(slots=64, download_s=20, load_s=10, prompt_tokens=128, output_tokens=64)


def _fleet() -> tf.Fleet:
    setup = build_setup(model=tf.MODEL, device=tf.DEVICE, max_num_seqs=SPEC.slots)
    return tf.Fleet(SPEC, setup.config, make_cost_model(tf.MODEL, tf.DEVICE, "bf16"))


def test_a_new_pod_is_ready_after_download_and_load_and_the_next_after_load_only() -> None:
    f = _fleet()
    first, second = f.add_pod(100.0), f.add_pod(110.0)
    assert (first.ready_at, second.ready_at) == (130.0, 120.0)  # 100 + 20 + 10; 110 + 10 (cache warm)
    for i in range(5):
        f.arrive(f"r{i}", 125.0)
    f.dispatch(125.0)  # only the second pod is ready
    assert (first.in_flight, second.in_flight, len(f.queue)) == (0, 5, 0)


def test_a_pod_pulls_no_more_than_its_slots() -> None:
    f = _fleet()
    pod = f.add_pod(0.0, warm=True)
    for i in range(SPEC.slots + 10):
        f.arrive(f"r{i}", 0.0)
    f.dispatch(0.0)
    assert pod.in_flight == SPEC.slots and len(f.queue) == 10


@pytest.mark.parametrize("fault", ["pod-kill", "node-loss", "rolling-update"])
def test_a_fault_loses_no_request(fault: str) -> None:
    sc = tf.Scenario("f", ((120, 20, 20),), fault=fault, fault_at=40)
    row = tf.simulate(sc, "fixed-peak", SPEC, {"fixed-peak": 2})
    assert row["requests"] == 2400 and row["answered"] == row["requests"], row["answered"]
    series = row["series"]
    if fault == "rolling-update":
        # maxUnavailable 0: never fewer ready pods than before, and every pod replaced.
        assert min(x["ready"] for x in series if x["t"] >= 40) >= 2
        assert row["pods_created"] == 4
    else:
        assert row["continued_streams"] > 0  # streams under way on the lost pods went on elsewhere
        assert row["pods_created"] == 3  # 2 + the replacement (node-loss: half of 2 pods was on the node)


def test_the_tuned_target_is_where_one_pod_still_meets_the_slo() -> None:
    tuned = tf.tune_threshold(SPEC, (5, 10, 20, 40, 80, 160))
    assert tuned["slo_attainment"] >= 0.99
    above = [r for r in (5, 10, 20, 40, 80, 160) if r > tuned["rate"]]
    if above:  # the next rate breaks it
        row = tf.simulate(tf.Scenario("t", ((120, above[0], above[0]),)), "fixed-peak", SPEC, {"fixed-peak": 1})
        assert row["slo_attainment"] < 0.99
    assert tuned["threshold"] == max(1, round(tf.HEADROOM * tuned["backlog"]))


def test_the_quick_experiment_writes_its_table_plot_and_metadata(tmp_path: Path) -> None:
    assert tf.main(["--quick", "--out", str(tmp_path)]) == 0
    [run] = (tmp_path / "twin-autoscale").glob("2*")
    doc = json.loads((run / "result.json").read_text())
    assert {r["policy"] for r in doc["rows"]} == set(tf.POLICIES)
    assert all(r["requests"] > 0 and r["answered"] == r["requests"] for r in doc["rows"])
    assert doc["meta"]["simulated"] is True and "SIMULATED" in (run / "result.md").read_text()
    assert (run / "result.png").stat().st_size > 0
