"""The engine-mode benchmark's arithmetic and report (pure; the runs themselves need real vLLM)."""

from __future__ import annotations

from pathlib import Path

import pytest
from llmlab_loadtest.engine_mode_bench import Run, render_markdown, render_plot, summarise

pytestmark = pytest.mark.unit


def _runs() -> list[Run]:
    return [
        Run("http", 0, 8, 0, 512, 5.0, {"worker": 9.0, "api-server": 9.0, "engine-core": 7.0}, 300.0),  # warm-up
        Run("http", 1, 32, 0, 2000, 20.0, {"worker": 0.2, "api-server": 0.4, "engine-core": 30.0}, 250.0),
        Run("inproc", 1, 32, 0, 2000, 19.0, {"worker": 0.3, "engine-core": 29.0}, 240.0),
        Run("http", 2, 32, 1, 1000, 10.0, {"worker": 0.1, "api-server": 0.2, "engine-core": 15.0}, 260.0),
        Run("inproc", 2, 32, 0, 1000, 9.0, {"worker": 0.1, "engine-core": 14.0}, None),
    ]


def test_front_cpu_per_token_counts_worker_and_api_server_not_the_engine_core_or_the_warm_up() -> None:
    s = summarise(_runs())
    # http: (0.2 + 0.4) s / 2000 tokens = 300 µs; (0.1 + 0.2) / 1000 = 300 µs. inproc: 150 and 100.
    assert s["http"]["front_us_per_token"] == [300.0, 300.0]
    assert s["inproc"]["front_us_per_token"] == [150.0, 100.0]
    assert s["front_ratio_inproc_to_http"] == pytest.approx(125 / 300, abs=1e-3)
    assert s["http"]["us_per_token_by_process"] == {"api-server": 200.0, "engine-core": 15000.0, "worker": 100.0}
    assert s["http"]["failed"] == 1 and s["http"]["tokens"] == 3000
    assert s["inproc"]["ttft_p50_ms"] == [240.0, None]


def test_report_and_plot_are_written(tmp_path: Path) -> None:
    doc = {
        "config": {"streams": 8, "requests": 32, "tokens": 64, "repeats": 2},
        "runs": [r.__dict__ for r in _runs()],
        "summary": summarise(_runs()),
        "metadata": {"date": "2026-12-03", "command_line": "python -m llmlab_loadtest.engine_mode_bench"},
    }
    md = render_markdown(doc)
    assert "| http | [300.0, 300.0] |" in md and "**0.417**" in md and "| http | warm-up |" in md
    render_plot(doc, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 1000
