"""``python -m llmlab_experiments``: the runner keeps ``results/README.md`` current, as the benchmarks do."""

from __future__ import annotations

from pathlib import Path

import pytest
from llmlab_experiments.__main__ import main

pytestmark = pytest.mark.unit


def test_a_run_rewrites_the_results_index(tmp_path: Path) -> None:
    (tmp_path / "kv_blocks").mkdir()
    (tmp_path / "kv_blocks" / "NOTE.md").write_text("x")
    (tmp_path / "README.md").write_text("stale\n")
    assert main(["--only", "no_such_experiment", "--out", str(tmp_path)]) == 0
    index = (tmp_path / "README.md").read_text()
    assert "| `kv_blocks/` | one, in place |" in index
