"""The mutation runner: a caught bug is "killed", an uncaught one "SURVIVED", and the checkout is
never modified."""

from __future__ import annotations

from pathlib import Path

import pytest
from llmlab_testkit import mutants

pytestmark = pytest.mark.integration  # runs pytest in a subprocess


def _repo(tmp_path: Path) -> Path:
    pkg = tmp_path / "libs" / "demo" / "demo_pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("def price():\n    # the list price\n    return 3\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_demo.py").write_text(
        "from demo_pkg import price\n\ndef test_price():\n    assert price() == 3\n"
    )
    return tmp_path


def _mutation(find: str, replace: str) -> mutants.Mutation:
    return mutants.Mutation("m", "libs/demo/demo_pkg/__init__.py", find, replace, ["tests/test_demo.py"], "why")


def test_caught_survived_and_untouched_checkout(tmp_path: Path) -> None:
    """Catches: a runner that reports every mutation as caught (or breaks the real files)."""
    repo = _repo(tmp_path)
    original = (repo / "libs/demo/demo_pkg/__init__.py").read_text()
    assert mutants.run_one(_mutation("return 3", "return 4"), repo, 60)[0] == "killed"
    assert mutants.run_one(_mutation("# the list price", "# a comment"), repo, 60)[0] == "SURVIVED"
    assert (repo / "libs/demo/demo_pkg/__init__.py").read_text() == original


def test_the_text_to_replace_must_occur_once(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    with pytest.raises(ValueError, match="occurs 0 times"):
        mutants.apply(_mutation("return 5", "return 4"), repo, tmp_path / "out")


def test_the_checked_in_mutations_apply() -> None:
    """Every entry of tests/mutations.toml still finds its text (code moves; the list must follow)."""
    repo = Path(__file__).resolve().parents[3]
    for m in mutants.load(repo / mutants.DEFAULT_CONFIG):
        assert (repo / m.file).read_text().count(m.find) == 1, m.name
        assert all((repo / t.split("::")[0]).exists() for t in m.tests), m.name
