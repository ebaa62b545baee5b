"""The docs' met / MISS words about benchmark runs agree with the committed results they cite.

Each claim unit is a table row or a sentence of a doc that cites one or more runs
(``results/<bench>/<UTC timestamp>``) and says MET/met/meets or MISS about them. The verdict of a
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
RUN = re.compile(
    r"results/((?:relay(?:-gpu|-capacity|-thousand|-cost)?|engine-modes|budget|router|accounting|priority)/\d{8}T\d{6}Z)\b"
)
MET = re.compile(r"\b(?:MET|met|meets?|PASS)\b")
MISS = re.compile(r"\bMISS\b")
ACCOUNTING_RATE, ACCOUNTING_VISIBILITY_S = 20_000, 5.0  # the ingest target (docs/accounting.md)


LIMIT = re.compile(r"(?:<=|>=)\s*([\d.]+)")


def _numbers(text: str) -> set[str]:
    """The numbers a text states, thousands separators dropped ("16,000" -> "16000")."""
    return set(re.findall(r"(?<![\d.])\d+(?:\.\d+)?(?![\d.])", re.sub(r"(?<=\d),(?=\d{3})", "", text)))


def _cost_variant(by_variant: dict[str, list[dict]], unit: str) -> list[dict]:
    """A cost_bench run's targets of the variant a unit speaks of: ``this``, or in an A/B of
    variants on one tree (``--router-ab``: ``service``, ``shared``) the one it names first."""
    if "this" in by_variant:
        return by_variant["this"]
    named = sorted((m.start(), n) for n in by_variant if (m := re.search(rf"\b{n}\b", unit)))
    if not named:
        raise AssertionError(f"a claim about a run of variants {sorted(by_variant)} names none: {unit[:120]}")
    return by_variant[named[0][1]]


def verdict(run: str, unit: str = "") -> str:
    """MET or MISS for one committed run, from its JSON. Where the run lists targets, a unit that
    states some of their limits ("<= 60 us", "16,000 tokens/s") is judged by those targets alone
    (a table row about one target of a run that missed another); otherwise by all of them."""
    data = json.loads((REPO / "results" / run / "result.json").read_text())
    kind = run.split("/", 1)[0]
    if kind in ("relay-cost", "relay-thousand", "relay-gpu"):
        targets = _cost_variant(data["targets"], unit) if kind == "relay-cost" else data["summary"]["targets"]
        said = _numbers(unit)
        named = [
            t
            for t in targets
            if (m := LIMIT.search(t["target"])) and str(float(m.group(1))).rstrip("0").rstrip(".") in said
        ]
        return "MET" if all(t["result"] == "PASS" for t in named or targets) else "MISS"
    if kind == "priority":  # verdicts by name, each with its limit where it has one
        checks = list(data["verdicts"].values())
        said = _numbers(unit)
        named = [t for t in checks if "limit_ms" in t and str(float(t["limit_ms"])).rstrip("0").rstrip(".") in said]
        return "MET" if all(t["met"] for t in named or checks) else "MISS"
    if kind == "engine-modes":  # the in-process worker's CPU per token against the API server it replaces
        s = data["summary"]
        worker = s["inproc"]["us_per_token_by_process"]["worker"]
        return "MET" if worker <= s["http"]["us_per_token_by_process"]["api-server"] else "MISS"
    kind = kind.split("-", 1)[0]
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


def units() -> list[tuple[Path, str]]:
    """Every table row and every sentence of the docs ("0.9 ms" stays whole)."""
    out = []
    for doc in DOCS:
        text = doc.read_text()
        rows = [line for line in text.splitlines() if line.startswith("|")]
        for para in re.split(r"\n\s*\n", text):
            if not para.lstrip().startswith("|"):
                rows += re.split(r"(?<=[.!?])\s+", para)
        out += [(doc, unit) for unit in rows]
    return out


# A figure (a number) next to a verdict about a run: "MET", "MISS", "met the target", "met it".
VERDICT_FIGURE = re.compile(r"\b(?:MET|MISS|met (?:the target|it))\b")
FIGURE = re.compile(r"\d")
# Sentences that define the verdict words rather than report a run's.
DEFINES = re.compile(r"MET/MISS|PASS/MISS|turns MISS|MISS does not change|recompute their")


def uncited() -> list[str]:
    """Units that state a verdict with figures but cite no committed run."""
    return [
        f"{doc.relative_to(REPO)}: {unit.strip()[:160]}"
        for doc, unit in units()
        if VERDICT_FIGURE.search(unit) and FIGURE.search(unit) and not RUN.search(unit) and not DEFINES.search(unit)
    ]


def test_every_verdict_with_figures_cites_a_run() -> None:
    """Catches: a doc that states a benchmark verdict with figures ("Four runs met the target:
    25.2k events/s") without citing the runs, so no test can check the words against them."""
    assert uncited() == []


def claims() -> list[tuple[str, list[str], str]]:
    """(where, cited runs, the word used) for every unit that cites runs and uses one verdict word."""
    out = []
    for doc, unit in units():
        runs = sorted(set(RUN.findall(unit)))
        said = {"MET" for _ in MET.finditer(unit)} | {"MISS" for _ in MISS.finditer(unit)}
        if runs and len(said) == 1:
            out.append((f"{doc.relative_to(REPO)}: {unit.strip()}", runs, said.pop()))
    return out


def test_enough_claims_are_checked() -> None:
    """Catches: a claim format this test no longer recognises (it would pass on nothing)."""
    assert len(claims()) >= 10


@pytest.mark.parametrize("where,runs,said", claims(), ids=lambda v: v[:120] if isinstance(v, str) else None)
def test_the_docs_verdict_matches_the_results(where: str, runs: list[str], said: str) -> None:
    """Catches: a README or doc that says MET for a run whose results missed a target, or MISS for
    one that met them all (for a unit citing several runs, every run must agree with the word)."""
    got = {run: verdict(run, where) for run in runs}
    assert all(v == said for v in got.values()), f"{where}\n  says {said}, results: {got}"
