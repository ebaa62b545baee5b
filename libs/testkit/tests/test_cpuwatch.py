"""The per-test CPU plugin behind scripts/test-tiers.sh."""

from __future__ import annotations

import json
import os

import pytest
from llmlab_testkit import cpuwatch

# user nice system idle iowait irq softirq steal (guest columns follow and are not added)
BEFORE = "cpu  100 0 50 800 50 0 0 0 7 7\ncpu0 1 2 3\n"
AFTER = "cpu  400 0 150 1000 50 0 0 0 9 9\n"


@pytest.mark.unit
def test_busy_cores_are_the_share_of_jiffies_not_idle_times_the_cores() -> None:
    """Catches: iowait counted as busy, guest jiffies counted twice, the per-CPU lines read."""
    assert cpuwatch.read_stat(BEFORE) == (1000, 850)
    assert cpuwatch.read_stat(AFTER) == (1600, 1050)
    # 600 jiffies passed, 200 of them idle: 400 / 600 of the machine, on 2 cores 1.333 busy
    assert cpuwatch.busy_cores((1000, 850), (1600, 1050), 2) == pytest.approx(4 / 3)
    assert cpuwatch.busy_cores((1000, 850), (1000, 850), 2) == 0.0


@pytest.mark.unit
def test_summary_weights_busy_cores_by_wall_time() -> None:
    rows = [
        {"id": "a/test_x.py::t1", "wall": 10.0, "busy": 2.0},
        {"id": "a/test_x.py::t2", "wall": 30.0, "busy": 0.0},
        {"id": "b/test_y.py::t", "wall": 5.0, "busy": 1.0},
    ]
    groups = cpuwatch.summarize(rows, lambda r: r["id"].split("::")[0])
    assert [(g["group"], g["tests"], g["wall_s"], g["core_s"]) for g in groups] == [
        ("a/test_x.py", 2, 40.0, 20.0),
        ("b/test_y.py", 1, 5.0, 5.0),
    ]
    assert groups[0]["busy_cores"] == 0.5  # not the mean of 2.0 and 0.0 per test


@pytest.mark.integration
def test_the_plugin_writes_one_line_per_test(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Catches: a test's line missing or written per phase, its wall time not covering the test."""
    out = pytester.path / "cpu.jsonl"
    monkeypatch.setenv(cpuwatch.OUT_ENV, str(out))
    pytester.makepyfile("import time\n\ndef test_a():\n    time.sleep(0.2)\n\ndef test_b():\n    pass\n")
    pytester.runpytest_subprocess("-p", "llmlab_testkit.cpuwatch").assert_outcomes(passed=2)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"].rsplit("::", 1)[1] for r in rows] == ["test_a", "test_b"]
    assert rows[0]["wall"] >= 0.2 and 0 <= rows[0]["busy"] <= (os.cpu_count() or 1)
    capsys.readouterr()
    assert cpuwatch.main([str(out)]) == 0
    assert capsys.readouterr().out.startswith("2 tests, ")
