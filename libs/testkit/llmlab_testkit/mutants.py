"""Mutation check: break the code on purpose, one known bug at a time, and require that the tests
guarding it fail.

Each mutation in ``tests/mutations.toml`` names a file, an exact text that occurs once in it, the
broken text, and the tests that must catch it. The runner copies the file's package root (e.g.
``services/budget``) to a temporary directory, applies the change there, and runs the tests with
that copy first on ``PYTHONPATH``: the checkout is never modified, and service processes the tests
start inherit the same path. A mutation the tests do not catch ("survived") fails the run.

    python -m llmlab_testkit.mutants              # every mutation (make mutants)
    python -m llmlab_testkit.mutants --ci         # those marked for CI (about 1.5 min)
    python -m llmlab_testkit.mutants --list
    python -m llmlab_testkit.mutants reaper-off   # some, by name
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("llmlab_testkit.mutants")
DEFAULT_CONFIG = Path("tests") / "mutations.toml"


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


def run_one(m: Mutation, repo: Path, timeout_s: float) -> tuple[str, float, str]:
    """(killed | SURVIVED | ERROR, seconds, output tail)."""
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"mutant-{m.name}-") as tmp:
        root = apply(m, repo, Path(tmp))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
        cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *m.tests]
        try:
            p = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return "ERROR", time.monotonic() - t0, f"timed out after {timeout_s:.0f}s"
    tail = "\n".join((p.stdout + p.stderr).splitlines()[-15:])
    # pytest: 0 all passed (the bug went unnoticed), 1 some test failed (caught), else unusable
    verdict = {0: "SURVIVED", 1: "killed"}.get(p.returncode, "ERROR")
    return verdict, time.monotonic() - t0, tail


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m llmlab_testkit.mutants", description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help="only these mutations (default: all)")
    ap.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    ap.add_argument("--list", action="store_true", help="list the mutations and exit")
    ap.add_argument("--ci", action="store_true", help="only the mutations marked for CI (ci = true, the default)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per mutation")
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
    bad = 0
    for i, m in enumerate(muts, 1):
        log.info("[%d/%d] %s: %s", i, len(muts), m.name, m.why)
        verdict, secs, tail = run_one(m, repo, a.timeout)
        log.info("      %s in %.0fs", verdict, secs)
        if verdict != "killed":
            bad += 1
            log.info("%s", tail)
    log.info("%d mutations, %d caught, %d not", len(muts), len(muts) - bad, bad)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
