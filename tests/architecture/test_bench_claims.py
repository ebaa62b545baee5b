"""The docs' met / MISS words about benchmark runs agree with the committed results they cite.

Each claim unit is a table row or a sentence of a doc that cites one or more runs
(``results/<bench>-<UTC timestamp>``) and says MET/met/meets or MISS about them. The verdict of a
run is read from its JSON in ``results/`` (accounting's ingest figures are recomputed from the
summary against the target): MET when every target of the run passed, MISS when any missed."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit
REPO = Path(__file__).resolve().parents[2]
DOCS = sorted(
    {
        REPO / "README.md",
        *REPO.glob("docs/*.md"),
        *REPO.glob("libs/*/*.md"),
        *REPO.glob("services/*/*.md"),
        *REPO.glob("lab/*.md"),
        *REPO.glob("loadtest/*.md"),
    }
)
RUN = re.compile(r"results/((?:relay(?:-gpu|-capacity)?|budget|router|accounting)-\d{8}T\d{6}Z)\b")
MET = re.compile(r"\b(?:MET|met|meets?|PASS)\b")
MISS = re.compile(r"\bMISS\b")
ACCOUNTING_RATE, ACCOUNTING_VISIBILITY_S = 20_000, 5.0  # the ingest target (docs/accounting.md)


def verdict(run: str) -> str:
    """MET or MISS for one committed run, from its JSON."""
    data = json.loads((REPO / "results" / f"{run}.json").read_text())
    kind = run.split("-", 1)[0]
    if kind == "router":
        ok = bool(data["inprocess"]["meets_target_all"])
    elif kind == "accounting":
        s = data["summary"]
        ok = (
            s["worst_steady_events_per_s"] >= ACCOUNTING_RATE and s["worst_visibility_s_max"] <= ACCOUNTING_VISIBILITY_S
        )
        assert s["result"] == ("MET" if ok else "MISS"), f"{run}: its own result disagrees with its figures"
    else:  # relay, budget: a list of targets, each PASS / MISS
        ok = all(t["result"] == "PASS" for t in data["summary"]["targets"])
    return "MET" if ok else "MISS"


def claims() -> list[tuple[str, list[str], str]]:
    """(where, cited runs, the word used) for every unit that cites runs and uses one verdict word."""
    out = []
    for doc in DOCS:
        text = doc.read_text()
        units = [line for line in text.splitlines() if line.startswith("|")]
        for para in re.split(r"\n\s*\n", text):
            if not para.lstrip().startswith("|"):
                units += re.split(r"(?<=[.!?])\s+", para)  # sentences ("0.9 ms" stays whole)
        for unit in units:
            runs = sorted(set(RUN.findall(unit)))
            said = {"MET" for _ in MET.finditer(unit)} | {"MISS" for _ in MISS.finditer(unit)}
            if runs and len(said) == 1:
                out.append((f"{doc.relative_to(REPO)}: {unit.strip()[:120]}", runs, said.pop()))
    return out


def test_enough_claims_are_checked() -> None:
    """Catches: a claim format this test no longer recognises (it would pass on nothing)."""
    assert len(claims()) >= 10


@pytest.mark.parametrize("where,runs,said", claims(), ids=lambda v: v if isinstance(v, str) else None)
def test_the_docs_verdict_matches_the_results(where: str, runs: list[str], said: str) -> None:
    """Catches: a README or doc that says MET for a run whose results missed a target, or MISS for
    one that met them all (for a unit citing several runs, every run must agree with the word)."""
    got = {run: verdict(run) for run in runs}
    assert all(v == said for v in got.values()), f"{where}\n  says {said}, results: {got}"
