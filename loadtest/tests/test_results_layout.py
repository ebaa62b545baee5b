"""The committed results/ follow the layout the benchmarks write (``bench_meta.write_outputs``):
``results/<bench>/<run>/``, a ``latest`` pointer per benchmark and a current index."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from llmlab_loadtest.bench_meta import index_markdown

pytestmark = pytest.mark.unit
RESULTS = Path(__file__).resolve().parents[2] / "results"
STAMPED = re.compile(r"\d{8}T\d{6}Z")


def test_no_run_lies_loose_at_the_top_and_no_script_in_results() -> None:
    """Catches: a benchmark writing ``results/<bench>-<ts>.*`` again, or an analysis script left
    among the results (scripts live in loadtest/studies/ or lab/)."""
    loose = [p.name for p in RESULTS.iterdir() if p.is_file() and STAMPED.search(p.name)]
    scripts = [str(p.relative_to(RESULTS)) for p in RESULTS.rglob("*.py")]
    assert loose == [] and scripts == []


def test_every_benchmark_points_at_its_newest_run() -> None:
    """Catches: a latest pointer to a missing run, or left behind on an older one."""
    for bench in sorted(p for p in RESULTS.iterdir() if p.is_dir()):
        runs = sorted(r.name for r in bench.iterdir() if r.is_dir() and not r.is_symlink() and r.name[:8].isdigit())
        if not runs:
            continue
        link = bench / "latest"
        assert link.is_symlink() and (bench / os.readlink(link)).is_dir(), bench.name
        assert os.readlink(link) == runs[-1], f"{bench.name}: latest -> {os.readlink(link)}, newest run {runs[-1]}"


def test_the_index_is_current() -> None:
    """Catches: a run added or removed by hand without the index (python -c 'from pathlib import
    Path; from llmlab_loadtest.bench_meta import write_index; write_index(Path("results"))')."""
    assert (RESULTS / "README.md").read_text() == index_markdown(RESULTS)
