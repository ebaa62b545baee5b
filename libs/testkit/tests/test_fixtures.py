"""The harness itself: a stack process that crashes fails the test that was running."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration

INNER = """
import sys

from llmlab_testkit.procs import ManagedProcess


def test_crash(stack):
    p = ManagedProcess("crasher", [sys.executable, "-c", "import sys; sys.exit(3)"], {})
    stack.procs.append(p.start())
    assert p.proc is not None and p.proc.wait(10) == 3


def test_killed_on_purpose(stack):
    p = ManagedProcess("victim", [sys.executable, "-c", "import time; time.sleep(60)"], {})
    stack.procs.append(p.start())
    p.kill()


def test_still_running_at_the_end(stack):
    p = ManagedProcess("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"], {})
    stack.procs.append(p.start())
"""


def test_a_process_that_exits_unasked_fails_the_running_test(pytester: pytest.Pytester) -> None:
    """Catches: a service that crashes mid-test only logging a warning, which pytest hides on a
    passing test; and the opposite mistake, a deliberate kill or a normal stop counted as a crash."""
    pytester.makeconftest('pytest_plugins = ["llmlab_testkit.fixtures"]')
    pytester.makepyfile(test_inner=INNER)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3, errors=1)
    result.stdout.fnmatch_lines(["*ERROR at teardown of test_crash*", "*crasher exited 3*"])
