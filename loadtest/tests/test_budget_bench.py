"""The budget benchmark's ``--quick`` run end to end against the real Redis and NATS: both
layers, both repeats, plausible numbers and the metadata block (integration: starts one budget
service process and two load processes per run)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import budget_bench as bb
import pytest
from bench_meta import METADATA_FIELDS

BENCH = Path(bb.__file__).resolve()

REQUIRED_METADATA = METADATA_FIELDS


@pytest.mark.unit
def test_percentiles_and_spread() -> None:
    p = bb.pct([1.0, 2.0, 3.0, 4.0])
    assert p["n"] == 4 and p["p50"] == pytest.approx(2.5) and p["max"] == 4.0
    assert bb.pct([])["p99"] is None
    ms = bb._mean_spread([1.0, 3.0])
    assert ms["mean"] == pytest.approx(2.0) and ms["spread"] == pytest.approx(2.0)
    assert bb._mean_spread([5.0])["spread"] is None


@pytest.mark.integration
def test_quick_bench_end_to_end(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    stamped = sorted(tmp_path.glob("budget-2*.json"))
    assert len(stamped) == 1
    assert stamped[0].with_suffix(".md").exists() and stamped[0].with_suffix(".png").exists()
    doc = json.loads(stamped[0].read_text())

    meta = doc["metadata"]
    for key in REQUIRED_METADATA:
        assert key in meta and meta[key] not in (None, ""), key
    assert meta["simulated"] is False and "not simulated" in meta["label"]
    assert "--quick" in meta["command_line"]

    runs = doc["runs"]
    expected = {(layer, rep) for layer in ("redis", "service") for rep in (1, 2)}
    assert {(r["layer"], r["repeat"]) for r in runs} == expected
    for r in runs:
        calls = ("reserve_ms", "settle_ms") if r["layer"] == "redis" else ("request_reply_ms",)
        assert r["ops_ok"] > 0 and r["achieved_ops_per_s"] > 0, r
        for c in calls:
            assert r[c]["n"] > 0 and r[c]["p99"] > 0 and r[c]["p99"] >= r[c]["p50"] > 0, (c, r[c])
        assert len(r["client_processes"]) == 2
        assert all(p["cpu_cores"] > 0 for p in r["client_processes"])
        assert r["warmup"]["ops_ok"] > 0  # warm-up ran and is kept apart
    service_runs = [r for r in runs if r["layer"] == "service"]
    assert all(r["service_cpu_cores"] > 0 for r in service_runs)
    assert {g["layer"] for g in doc["summary"]["groups"]} == {"redis", "service"}
    assert doc["summary"]["targets"]  # the p99 <= 2 ms figure is evaluated (not asserted)
    assert "Target:" in proc.stdout
    md = stamped[0].with_suffix(".md").read_text()
    assert "not simulated" in md and "## Metadata" in md and meta["command_line"] in md
