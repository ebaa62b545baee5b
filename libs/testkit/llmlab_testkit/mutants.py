"""Mutation check: break the code on purpose, one known bug at a time, and require that the tests
guarding it fail.

Each mutation in ``tests/mutations.toml`` names a file, an exact text that occurs once in it, the
broken text, and the tests that must catch it. The runner copies the file's package root (e.g.
``services/budget``) to a temporary directory, applies the change there, and runs the tests with
that copy first on ``PYTHONPATH``: the checkout is never modified, and service processes the tests
start inherit the same path.

The named tests first run once on the unmutated tree (the baseline): a mutation whose tests do not
pass there proves nothing and is reported ``BASELINE-FAILS``. A mutation counts as caught
(``killed``) only when a named test fails on an assertion (``assert``, ``pytest.fail``); a run
that ends in errors only (an exception other than an assertion, a fixture or collection error, a
timeout) is ``ERROR``, and one where every test passes ``SURVIVED``. Anything but ``killed`` fails
the run.

    python -m llmlab_testkit.mutants              # every mutation (make mutants)
    python -m llmlab_testkit.mutants --ci         # those marked for CI (about 5 min with the baseline)
    python -m llmlab_testkit.mutants --ci --no-baseline --jobs 2  # what .ci/run does right after make test
    python -m llmlab_testkit.mutants --list
    python -m llmlab_testkit.mutants reaper-off   # some, by name
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("llmlab_testkit.mutants")
DEFAULT_CONFIG = Path("tests") / "mutations.toml"
PLUGIN = "llmlab_testkit.mutant_plugin"


@dataclass(frozen=True)
class Mutation:
    name: str
    file: str
    find: str
    replace: str
    tests: list[str]
    why: str
    ci: bool = True  # False: only in a full run (make mutants), not in CI's --ci subset

    @property
    def package_root(self) -> Path:
        """The directory on ``sys.path`` that holds the file's package: ``libs/<x>`` or
        ``services/<x>``, else the top folder (``lab``, ``loadtest``, ``experiments``)."""
        parts = Path(self.file).parts
        return Path(*parts[:2]) if parts[0] in ("libs", "services") else Path(parts[0])


def load(path: Path) -> list[Mutation]:
    data = tomllib.loads(path.read_text())
    muts = [Mutation(**m) for m in data.get("mutation", [])]
    names = [m.name for m in muts]
    if len(set(names)) != len(names):
        raise ValueError(f"{path}: duplicate mutation names")
    return muts


def apply(m: Mutation, repo: Path, into: Path) -> Path:
    """Copy the package root under ``into`` and break the file there; returns the copy's root."""
    src = (repo / m.file).read_text()
    if src.count(m.find) != 1:
        raise ValueError(f"{m.name}: the text to replace occurs {src.count(m.find)} times in {m.file}, not once")
    root = into / m.package_root
    shutil.copytree(repo / m.package_root, root, ignore=shutil.ignore_patterns("__pycache__", "tests", "*.egg-info"))
    (into / m.file).write_text(src.replace(m.find, m.replace))
    return root


def run_tests(
    tests: list[str], repo: Path, timeout_s: float, pythonpath: list[Path], mutant: bool
) -> tuple[list[dict[str, str]], int | None, str]:
    """Run ``tests`` under the outcome plugin, ``pythonpath`` first on the path: (one record per
    test or collection failure, pytest's exit code or None on a timeout, output tail). A mutant's
    run stops at the first assertion failure; the baseline runs every test."""
    with tempfile.TemporaryDirectory(prefix="mutant-report-") as tmp:
        report = Path(tmp) / "outcomes.jsonl"
        paths = [*map(str, pythonpath), os.environ.get("PYTHONPATH")]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, paths)), "LLMLAB_MUTANT_REPORT": str(report)}
        if mutant:
            env["LLMLAB_MUTANT_STOP_AT_ASSERTION"] = "1"
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", PLUGIN, *tests]
        try:
            p = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=timeout_s)
            code: int | None = p.returncode
            tail = "\n".join((p.stdout + p.stderr).splitlines()[-15:])
        except subprocess.TimeoutExpired:
            code, tail = None, f"timed out after {timeout_s:.0f}s"
        records = [json.loads(line) for line in report.read_text().splitlines()] if report.exists() else []
    return records, code, tail


def verdict(records: list[dict[str, str]], code: int | None) -> str:
    """killed: a test failed on an assertion; SURVIVED: tests ran and all passed; else ERROR."""
    if any(r["outcome"] == "assertion" for r in records):
        return "killed"
    if code == 0 and records and all(r["outcome"] == "passed" for r in records):
        return "SURVIVED"
    return "ERROR"


def run_one(m: Mutation, repo: Path, timeout_s: float) -> tuple[str, float, str]:
    """(killed | SURVIVED | ERROR, seconds, output tail) for the mutated tree."""
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"mutant-{m.name}-") as tmp:
        root = apply(m, repo, Path(tmp))
        records, code, tail = run_tests(m.tests, repo, timeout_s, [root], mutant=True)
    v = verdict(records, code)
    if v == "ERROR":
        tail = "\n".join([*(f"{r['nodeid']}: {r['outcome']}" for r in records if r["outcome"] != "passed"), tail])
    return v, time.monotonic() - t0, tail


def _covers(spec: str, nodeid: str) -> bool:
    """A test spec of mutations.toml (a file or a node id) covers this node id."""
    return nodeid == spec or nodeid.startswith(spec + "::") or nodeid.startswith(spec + "[")


def baseline(muts: list[Mutation], repo: Path, timeout_s: float) -> tuple[dict[str, str], float, str]:
    """Run every named test once on the unmutated tree; the mutations whose tests did not all pass
    there, each with why."""
    t0 = time.monotonic()
    specs = sorted({t for m in muts for t in m.tests})
    # The unmutated package roots, as the mutants put their broken copies: the same import path.
    roots = sorted({repo / m.package_root for m in muts})
    records, code, tail = run_tests(specs, repo, timeout_s * max(1, len(muts)), roots, mutant=False)
    bad_records = [r for r in records if r["outcome"] != "passed"]
    unsound: dict[str, str] = {}
    for m in muts:
        ran = [r for r in records if any(_covers(t, r["nodeid"]) for t in m.tests)]
        failing = [f"{r['nodeid']}: {r['outcome']}" for r in ran if r["outcome"] != "passed"]
        if failing:
            unsound[m.name] = "; ".join(failing)
        elif not ran:
            unsound[m.name] = "none of its tests ran" + ("" if code is not None else " (timed out)")
    if code is None and not bad_records:
        for m in muts:
            unsound.setdefault(m.name, "the baseline timed out")
    return unsound, time.monotonic() - t0, tail


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m llmlab_testkit.mutants", description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help="only these mutations (default: all)")
    ap.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    ap.add_argument("--list", action="store_true", help="list the mutations and exit")
    ap.add_argument("--ci", action="store_true", help="only the mutations marked for CI (ci = true, the default)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per mutation")
    ap.add_argument("--jobs", type=int, default=1, help="mutants run side by side (CI: 2)")
    ap.add_argument(
        "--no-baseline",
        action="store_true",
        help="skip the baseline: for CI, where make test has just passed on the same tree (every named test in it)",
    )
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    repo = Path.cwd()
    muts = load(a.config)
    if a.names:
        unknown = set(a.names) - {m.name for m in muts}
        if unknown:
            ap.error(f"unknown mutations: {sorted(unknown)}")
        muts = [m for m in muts if m.name in a.names]
    if a.ci:
        muts = [m for m in muts if m.ci]
    if a.list:
        for m in muts:
            log.info("%-28s %s\n%28s %s", m.name, m.why, "", " ".join(m.tests))
        return 0
    t_all = time.monotonic()
    unsound: dict[str, str] = {}
    tail = ""
    if a.no_baseline:
        log.info("no baseline (--no-baseline): the named tests passed in the run before this one")
    else:
        log.info("baseline: the named tests of %d mutations on the unmutated tree", len(muts))
        unsound, secs, tail = baseline(muts, repo, a.timeout)
        log.info("      %d of %d mutations have passing tests, in %.0fs", len(muts) - len(unsound), len(muts), secs)
    if unsound:
        log.info("%s", tail)
    counts: dict[str, int] = {}

    def one(m: Mutation) -> tuple[str, float, str]:
        if m.name in unsound:
            return "BASELINE-FAILS", 0.0, unsound[m.name]
        return run_one(m, repo, a.timeout)

    # Each mutant breaks its own copy and its tests run in their own namespaces, so mutants can
    # run side by side; most slow ones wait on timers (heartbeats, grace periods), not the CPU.
    with ThreadPoolExecutor(max_workers=a.jobs) as pool:
        futures = {pool.submit(one, m): m for m in muts}
        for i, fut in enumerate(as_completed(futures), 1):
            m = futures[fut]
            v, secs, tail = fut.result()
            counts[v] = counts.get(v, 0) + 1
            log.info("[%d/%d] %s: %s\n      %s in %.0fs", i, len(muts), m.name, m.why, v, secs)
            if v != "killed":
                log.info("%s", tail)
    summary = ", ".join(f"{n} {v}" for v, n in sorted(counts.items()))
    log.info("%d mutations in %.0fs: %s", len(muts), time.monotonic() - t_all, summary)
    return 0 if counts.get("killed", 0) == len(muts) else 1


if __name__ == "__main__":
    sys.exit(main())
