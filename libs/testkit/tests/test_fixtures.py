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


async def _leftovers(namespace: str) -> tuple[list[str], list[bytes]]:
    from llmlab_common.natsio import connect
    from redis.asyncio import Redis

    nc = await connect("nats://127.0.0.1:4222", "leftovers")
    try:
        streams = [s.config.name or "" for s in await nc.jetstream().streams_info()]
    finally:
        await nc.close()
    redis = Redis.from_url("redis://127.0.0.1:6379/0")
    try:
        keys = [k async for k in redis.scan_iter(match=f"{namespace}:*")]
    finally:
        await redis.aclose()
    return [s for s in streams if s.startswith(namespace.upper() + "_")], keys


async def test_closing_a_stack_deletes_its_streams_and_keys_even_inside_an_event_loop() -> None:
    """Catches: a Stack used outside the ``stack`` fixture (benchmarks, demos, the autoscale lab)
    leaving its namespace's JetStream streams on the shared server, which refuses new streams once
    enough have leaked (a CI stop failed so); and a cleanup that cannot run from async code."""
    from llmlab_common.natsio import connect, ensure_streams
    from llmlab_common.subjects import Topology
    from llmlab_testkit.procs import Stack, unique_namespace
    from redis.asyncio import Redis

    ns = unique_namespace()
    nc = await connect("nats://127.0.0.1:4222", "leak-test")
    await ensure_streams(nc.jetstream(), Topology(ns))
    await nc.close()
    redis = Redis.from_url("redis://127.0.0.1:6379/0")
    await redis.set(f"{ns}:bud:probe", b"1")
    await redis.set(f"other{ns}:probe", b"1")  # another namespace's key stays
    try:
        streams, keys = await _leftovers(ns)
        assert len(streams) >= 2 and keys, (streams, keys)
        Stack(namespace=ns).close()  # called from inside this test's running loop
        assert await _leftovers(ns) == ([], [])
        assert await redis.get(f"other{ns}:probe") == b"1"
    finally:
        Stack(namespace=ns).delete_namespace()
        await redis.delete(f"other{ns}:probe")
        await redis.aclose()
