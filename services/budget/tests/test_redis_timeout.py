"""A hung Redis fails the budget's call within the socket timeout instead of holding it forever."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest
import redis.exceptions
from llmlab_budget.app import open_redis

pytestmark = pytest.mark.unit


async def test_a_redis_that_accepts_and_never_answers_times_out() -> None:
    """Catches: the budget's Redis pool without a socket timeout (dd4f538): a server that stops
    answering held every reserve and settle on its connection with no end."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # the kernel accepts; nobody ever reads or writes
    port = silent.getsockname()[1]
    r = open_redis(f"redis://127.0.0.1:{port}/0", 2, socket_timeout_s=0.3)
    t0 = time.monotonic()
    try:
        try:
            await asyncio.wait_for(r.get("x"), timeout=5)
        except redis.exceptions.TimeoutError:
            pass
        except TimeoutError:
            pytest.fail("no socket timeout: the call hung until the test gave up")
        else:
            pytest.fail("a server that never answers returned a value")
        assert time.monotonic() - t0 < 3
    finally:
        await r.aclose()
        silent.close()
