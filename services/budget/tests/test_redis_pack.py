"""Commands packed by hiredis in C are the bytes redis-py would send; what it cannot pack the same
goes redis-py's way. The expected bytes come from redis-py's own connection class, unchanged."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from llmlab_budget.app import open_redis
from llmlab_budget.redis_pack import PackInC, pack_in_c
from redis.asyncio import BlockingConnectionPool
from redis.asyncio.connection import AbstractConnection, Connection, SSLConnection, UnixDomainSocketConnection
from redis.exceptions import DataError

PLAIN = Connection()
FAST = pack_in_c(BlockingConnectionPool()).connection_class()


def _wire(conn: AbstractConnection, *args: Any) -> bytes:
    return b"".join(conn.pack_command(*args))


@pytest.mark.unit
@pytest.mark.parametrize(
    "args",
    [
        ("EVALSHA", "a" * 40, 3, "k:res:r-1", "k:exp", "k:key:1", "r-1", repr(1733500000.123), 600.0, -1, 0),
        ("SET", "ключ", "värde ✓", 1e20, 0.1, -7, 2**63),
        ("HSET", b"raw\x00bytes", b"", "", 3.0),
        ("PING",),
    ],
)
def test_the_c_path_sends_what_redis_py_sends(args: tuple[Any, ...]) -> None:
    assert _wire(FAST, *args) == _wire(PLAIN, *args)


class _NoPythonPacking:
    def encode(self, value: object) -> bytes:
        raise AssertionError("the argument was converted in Python")


@pytest.mark.unit
def test_the_c_path_converts_no_argument_in_python() -> None:
    conn = pack_in_c(BlockingConnectionPool()).connection_class()
    conn._command_packer = None  # redis-py's own path (hiredis or pure Python) would now fail
    conn.encoder = _NoPythonPacking()  # type: ignore[assignment]
    assert conn.pack_command("EVALSHA", "a" * 40, 1, "k", 2.5, -1)[0].startswith(b"*6\r\n$7\r\nEVALSHA")
    with pytest.raises(AssertionError, match="converted in Python"):
        conn.pack_command("CONFIG GET", "maxmemory")  # the way that does


@pytest.mark.unit
def test_what_hiredis_cannot_pack_the_same_goes_redis_pys_way() -> None:
    # a command name with a space is two arguments for redis-py, one for hiredis
    assert _wire(FAST, "CONFIG GET", "maxmemory") == _wire(PLAIN, "CONFIG GET", "maxmemory")
    assert _wire(FAST, "CONFIG GET", "maxmemory").startswith(b"*3\r\n")
    # redis-py converts these; hiredis refuses them
    assert _wire(FAST, "SET", "k", memoryview(b"mv")) == _wire(PLAIN, "SET", "k", memoryview(b"mv"))
    assert _wire(FAST, "SET", "k", bytearray(b"ba")) == _wire(PLAIN, "SET", "k", bytearray(b"ba"))
    # and refuses a bool, as redis-py does
    with pytest.raises(DataError):
        FAST.pack_command("SET", "k", True)


@pytest.mark.unit
def test_the_url_keeps_its_connection_class() -> None:
    for url, base in (
        ("redis://127.0.0.1:6379/0", Connection),
        ("rediss://127.0.0.1:6380/0", SSLConnection),
        ("unix:///tmp/redis.sock", UnixDomainSocketConnection),
    ):
        cls = pack_in_c(BlockingConnectionPool.from_url(url)).connection_class
        assert issubclass(cls, PackInC) and issubclass(cls, base), (url, cls.__mro__)
        assert pack_in_c(BlockingConnectionPool(connection_class=cls)).connection_class is cls  # not wrapped twice


@pytest.mark.unit
def test_a_pool_with_another_encoding_keeps_redis_pys_packing() -> None:
    assert not issubclass(pack_in_c(BlockingConnectionPool(encoding="latin-1")).connection_class, PackInC)
    assert not issubclass(pack_in_c(BlockingConnectionPool(encoding_errors="replace")).connection_class, PackInC)
    assert issubclass(pack_in_c(BlockingConnectionPool(encoding="UTF8")).connection_class, PackInC)
    # both refuse a lone surrogate the same way
    for conn in (PLAIN, FAST):
        with pytest.raises(UnicodeEncodeError):
            conn.pack_command("SET", "k", "\ud800")


@pytest.mark.integration
async def test_the_service_client_talks_to_redis() -> None:
    redis = open_redis("redis://127.0.0.1:6379/0", 2, socket_timeout_s=5.0)
    key = f"test_{uuid.uuid4().hex[:12]}:pack"
    try:
        conn = await redis.connection_pool.get_connection()
        assert isinstance(conn, PackInC)
        await redis.connection_pool.release(conn)  # type: ignore[arg-type]
        async with redis.pipeline(transaction=False) as pipe:
            pipe.hset(key, mapping={"used": 12, "rate": 0.25, "name": "été"})
            pipe.hmget(key, "used", "rate", "name")
            _, got = await pipe.execute()
        assert got == [b"12", b"0.25", "été".encode()]
        assert await redis.eval("return ARGV[1] + ARGV[2]", 0, 40, 2) == 42
    finally:
        await redis.delete(key)
        await redis.aclose()
