"""The mutation runner: a caught bug is "killed" only when a named test fails on an assertion, an
uncaught one "SURVIVED", a test that breaks another way "ERROR", a mutation whose tests fail on the
unmutated tree "BASELINE-FAILS"; the checkout is never modified."""

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
    # A test that passes on the tree as it is only by luck of the environment: it fails everywhere.
    (tmp_path / "tests" / "test_flaky.py").write_text("def test_flaky():\n    assert False, 'broken test'\n")
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


def test_an_error_that_is_no_assertion_is_not_a_catch(tmp_path: Path) -> None:
    """Catches: a runner that counts any failing pytest run as a caught bug (an import error, a
    NameError in the mutated code, a collection error)."""
    repo = _repo(tmp_path)
    assert mutants.run_one(_mutation("return 3", "return undefined_name"), repo, 60)[0] == "ERROR"
    assert mutants.run_one(_mutation("def price():", "def price(:"), repo, 60)[0] == "ERROR"  # syntax


def test_a_mutation_whose_tests_fail_unmutated_is_not_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Catches: a broken or flaky named test that 'catches' every mutation."""
    repo = _repo(tmp_path)
    (repo / "tests" / "mutations.toml").write_text(
        """
[[mutation]]
name = "guarded"
file = "libs/demo/demo_pkg/__init__.py"
find = "return 3"
replace = "return 4"
tests = ["tests/test_demo.py"]
why = "price changes"

[[mutation]]
name = "guarded-by-a-broken-test"
file = "libs/demo/demo_pkg/__init__.py"
find = "return 3"
replace = "return 4"
tests = ["tests/test_flaky.py::test_flaky"]
why = "price changes"
"""
    )
    unsound, _secs, _tail = mutants.baseline(mutants.load(repo / "tests" / "mutations.toml"), repo, 60)
    assert set(unsound) == {"guarded-by-a-broken-test"} and "assertion" in unsound["guarded-by-a-broken-test"]
    monkeypatch.chdir(repo)
    caplog.set_level("INFO", logger="llmlab_testkit.mutants")
    assert mutants.main([]) == 1
    assert "1 BASELINE-FAILS, 1 killed" in caplog.text


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
