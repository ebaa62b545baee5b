"""The experiment note writer: the tutorial's template, every output file, the simulated label."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
from llmlab_experiments.note import Note, metadata, write_experiment

pytestmark = pytest.mark.unit


def test_write_experiment_writes_every_output(tmp_path: Path) -> None:
    note = Note("T", "h", ["a"], "v", "e", "act", "i", ["u: why"], "n")
    meta = metadata(
        started=dt.datetime.now(dt.UTC),
        duration_s=1,
        engine="twin",
        model_id="m",
        concurrency=1,
        warmup="none",
        prompt_dataset="d",
        input_length_distribution="i",
        output_length_distribution="o",
        sampling_parameters="s",
        command="cmd",
    )
    d = write_experiment(
        tmp_path,
        name="x",
        simulated=True,
        rows=[{"a": 1}],
        table_md="| a |\n|---|\n| 1 |",
        note=note,
        command="cmd",
        meta=meta,
        plot=lambda p: p.write_bytes(b"png"),
    )
    assert {p.name for p in d.iterdir()} == {"results.json", "table.md", "command.txt", "NOTE.md", "plot.png"}
    text = (d / "NOTE.md").read_text()
    for heading in (
        "Hypothesis",
        "Fixed conditions",
        "Changed variable",
        "Command",
        "Expected",
        "Actual",
        "Interpretation",
        "Unverified",
        "Next experiment",
    ):
        assert f"## {heading}" in text
    assert "SIMULATED" in (d / "table.md").read_text()
    assert json.loads((d / "results.json").read_text())["meta"]["simulated"] is True
