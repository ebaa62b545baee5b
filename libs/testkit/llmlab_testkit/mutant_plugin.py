"""A pytest plugin for the mutation runner (``-p llmlab_testkit.mutant_plugin``): writes one JSON
line per test outcome to ``$LLMLAB_MUTANT_REPORT`` so the runner can tell a test that failed on an
assertion (the bug caught) from one that broke in another way (an import error, a refused
connection, a fixture that failed, a collection error). With ``$LLMLAB_MUTANT_STOP_AT_ASSERTION``
set it stops the session at the first assertion failure (``-x`` would stop at any failure, and
hide an assertion behind an error)."""

from __future__ import annotations

import json
import os
from collections.abc import Generator
from typing import Any

import pytest

# pytest.fail() raises this: a check that fails on purpose, like an assertion.
_FAILED = pytest.fail.Exception


def _write(record: dict[str, Any]) -> None:
    path = os.environ.get("LLMLAB_MUTANT_REPORT")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if report.when == "call" and report.passed:
        _write({"nodeid": item.nodeid, "outcome": "passed"})
    elif report.failed:
        exc = call.excinfo
        assertion = report.when == "call" and exc is not None and exc.errisinstance((AssertionError, _FAILED))
        kind = "assertion" if assertion else f"error in {report.when}: {exc.typename if exc else '?'}"
        _write({"nodeid": item.nodeid, "outcome": kind})
        if assertion and os.environ.get("LLMLAB_MUTANT_STOP_AT_ASSERTION"):
            item.session.shouldstop = "a named test caught the mutation"


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        _write({"nodeid": report.nodeid, "outcome": "collection error"})
