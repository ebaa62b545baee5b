"""Pytest fixtures (registered from the root conftest)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from llmlab_testkit.procs import Stack, unique_namespace

DEV_KEY = "sk-llmlab-dev"


@pytest.fixture
def stack() -> Iterator[Stack]:
    """A fresh namespace (streams, subjects, consumers) per test, deleted afterwards. A process of
    the stack that exited without being stopped or killed by the test fails it (a crash that the
    test's own assertions happened not to notice)."""
    s = Stack(namespace=unique_namespace())
    try:
        yield s
    finally:
        crashed = [p for p in s.procs if p.crashed()]
        report = [f"{p.name} exited {p.proc.returncode if p.proc else '?'}; log tail:\n{p.tail()}" for p in crashed]
        s.close()  # also deletes the namespace's streams and Redis keys
    if report:
        pytest.fail("a process of the stack crashed during the test:\n" + "\n".join(report), pytrace=False)
