"""The accounting ingest benchmark: its verdict rule (unit) and its ``--quick`` run end to end
against the real NATS JetStream, one accounting service process and its chdb (integration)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from llmlab_loadtest import accounting_bench as ab

BENCH = "accounting_bench"


def _run(phase: str, steady: float, vis_max: float, n: int = 10) -> dict[str, Any]:
    r: dict[str, Any] = dict.fromkeys(ab.SUMMARY_KEYS, 1.0)
    r.update(phase=phase, steady_events_per_s_20_80=steady, visibility_s_max=vis_max, events=n)
    r["raw_and_final_rows"] = [n, n]
    return r


@pytest.mark.unit
def test_verdict_takes_the_worst_repeat_of_each_phase() -> None:
    ok = [_run("target", 20_100, 1.0), _run("capacity", 26_000, 9.0), _run("capacity", 24_000, 9.0)]
    s = ab.summarise(ok)
    # Visibility is judged at the target rate only; the capacity phase is overloaded on purpose.
    assert s["result"] == "MET" and s["worst_steady_events_per_s"] == 24_000 and s["exactly_once"]
    assert ab.summarise([*ok, _run("capacity", 19_999, 1.0)])["result"] == "MISS"
    assert ab.summarise([*ok, _run("target", 30_000, 5.01)])["result"] == "MISS"
    dup = _run("target", 20_100, 1.0)
    dup["raw_and_final_rows"] = [11, 10]  # a duplicate in the raw table, hidden by FINAL
    assert not ab.summarise([*ok, dup])["exactly_once"]
    lost = _run("target", 20_100, 1.0)
    lost["raw_and_final_rows"] = [9, 9]
    assert not ab.summarise([*ok, lost])["exactly_once"]


@pytest.mark.integration
def test_quick_bench_end_to_end(quick_bench: Callable[..., Any]) -> None:
    """Catches: ingest losing events, or inserting one more than once (each of the 6000 events is
    published once with its own request id, so the raw table must reach exactly 6000 rows, never
    pass it, and never shrink: a duplicate would overshoot, or vanish in a merge)."""
    _, doc, _ = quick_bench(BENCH, "accounting")
    meta = doc["metadata"]
    assert meta["simulated"] is False
    speed = meta["core_speed_check_decode_us_per_event"]
    assert 0 < speed["before"] < 1000 and 0 < speed["after"] < 1000
    (run,) = doc["runs"]
    # Every published event became visible exactly once, with a visibility and the service's CPU.
    # The samples are count() of attempts_raw without FINAL: every event is unique, so nothing may
    # collapse there and the count only grows, to exactly the events published.
    assert run["visible_events"] == run["events"] == 6000
    seen = [c for _, c in run["samples"]]
    assert seen == sorted(seen) and max(seen) == 6000, seen
    assert run["raw_and_final_rows"] == [6000, 6000] and doc["summary"]["exactly_once"]
    assert run["visibility_s_max"] is not None and run["visibility_s_max"] > 0
    assert run["service_cpu_cores"] > 0 and run["service_cpu_us_per_event"] > 0
