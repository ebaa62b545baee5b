"""Every experiment writes the same things into ``results/<experiment>/``: the raw rows (JSON), the
table (Markdown), a PNG plot, the exact command, the environment (the benchmark metadata block) and
a note in the tutorial's template (실험 노트 양식): hypothesis, fixed conditions, changed variable,
command, expected, actual, interpretation, unverified items, next experiment.

Figures from the engine twin are labelled SIMULATED in the table title, the note and the JSON;
paths that could not run here are listed under "Unverified" with the reason."""

from __future__ import annotations

import json
import logging
import shlex
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmlab_loadtest.bench_meta import metadata_block

log = logging.getLogger(__name__)


@dataclass
class Note:
    title: str
    hypothesis: str
    fixed_conditions: list[str]
    changed_variable: str
    expected: str
    actual: str
    interpretation: str
    unverified: list[str] = field(default_factory=list)
    next_experiment: str = ""

    def markdown(self, command: str) -> str:
        def bullets(items: Sequence[str]) -> str:
            return "\n".join(f"- {x}" for x in items) if items else "- (none)"

        return "\n".join(
            [
                f"# {self.title}",
                "",
                "## Hypothesis",
                self.hypothesis,
                "",
                "## Fixed conditions",
                bullets(self.fixed_conditions),
                "",
                "## Changed variable",
                self.changed_variable,
                "",
                "## Command",
                f"`{command}`",
                "",
                "## Expected",
                self.expected,
                "",
                "## Actual",
                self.actual,
                "",
                "## Interpretation",
                self.interpretation,
                "",
                "## Unverified",
                bullets(self.unverified),
                "",
                "## Next experiment",
                self.next_experiment or "(none planned)",
                "",
            ]
        )


def command_line(argv: Sequence[str] | None = None) -> str:
    args = list(sys.argv[1:] if argv is None else argv)
    return "python -m llmlab_experiments " + " ".join(shlex.quote(a) for a in args)


def write_experiment(
    out_dir: Path,
    *,
    name: str,
    simulated: bool,
    rows: list[dict[str, Any]] | dict[str, Any],
    table_md: str,
    note: Note,
    command: str,
    meta: dict[str, Any],
    plot: Callable[[Path], None] | None = None,
) -> Path:
    """Write one experiment's outputs into ``out_dir/name`` and return that folder."""
    d = out_dir / name
    d.mkdir(parents=True, exist_ok=True)
    label = "SIMULATED (engine twin)" if simulated else "MEASURED on this machine"
    (d / "results.json").write_text(
        json.dumps({"experiment": name, "label": label, "meta": meta, "rows": rows}, indent=1, default=str)
    )
    (d / "table.md").write_text(f"# {note.title} — {label}\n\n{table_md.rstrip()}\n")
    (d / "command.txt").write_text(command + "\n")
    (d / "NOTE.md").write_text(note.markdown(command))
    if plot is not None:
        try:
            plot(d / "plot.png")
        except Exception:
            log.exception("%s: plot failed (table, JSON and note are written)", name)
    return d


def metadata(**fields: Any) -> dict[str, Any]:
    """The benchmark metadata block (:mod:`llmlab_loadtest.bench_meta`: §12 fields, git commit, CPU, RAM)."""
    return metadata_block(**fields)
