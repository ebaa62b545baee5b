"""The engine HTTP client (llmlab_worker.http1) against raw asyncio servers that misbehave on cue."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest
from llmlab_worker.http1 import EngineHTTP, EngineStreamBroken, EngineUnreachable

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


async def _read_request(reader: asyncio.StreamReader) -> bytes | None:
    """One request's body, or None when the client closed the connection."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    length = next(
        int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
    )
    return await reader.readexactly(length)


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


STREAM_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


@asynccontextmanager
async def _server(handler: Handler) -> AsyncIterator[tuple[str, list[int]]]:
    """A server calling ``handler(reader, writer, connection_number)``; yields its URL and the
    list of connection numbers it saw end."""
    count = [0]
    ended: list[int] = []

    async def on_conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        count[0] += 1
        n = count[0]
        try:
            await handler(reader, writer, n)
        finally:
            ended.append(n)
            writer.close()

    server = await asyncio.start_server(on_conn, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", ended
    finally:
        server.close()


async def _echo_keepalive(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
    while (body := await _read_request(reader)) is not None:
        writer.write(STREAM_HEAD + _chunk(b"conn %d: " % n) + _chunk(body) + b"0\r\n\r\n")
        await writer.drain()


def _endless(gone: asyncio.Event) -> Handler:
    """A server whose first connection streams a token every 10 ms until its client leaves (then
    ``gone`` is set); later connections echo, keep-alive."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        if n > 1:
            return await _echo_keepalive(reader, writer, n)
        await _read_request(reader)
        writer.write(STREAM_HEAD)
        try:
            for i in range(1000):
                writer.write(_chunk(b"tok %d " % i))
                await writer.drain()
                await asyncio.sleep(0.01)
        except ConnectionError:
            gone.set()

    return handler


async def test_a_finished_exchange_leaves_its_connection_for_the_next_request() -> None:
    async with _server(_echo_keepalive) as (url, _):
        client = EngineHTTP(url)
        try:
            bodies = []
            for i in range(3):
                async with await client.post("/v1/completions", b"req %d" % i) as resp:
                    assert resp.status == 200
                    bodies.append(await resp.read())
        finally:
            await client.close()
    assert bodies == [b"conn 1: req 0", b"conn 1: req 1", b"conn 1: req 2"]
    assert client.connects == 1


async def test_a_pooled_connection_the_server_dropped_unanswered_is_retried_on_a_fresh_one() -> None:
    """The keep-alive race: the server closes an idle connection as the request goes out. Nothing
    reached the engine, so the client sends it again on a new connection instead of failing."""

    async def one_per_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        body = await _read_request(reader)
        writer.write(STREAM_HEAD + _chunk(b"conn %d: " % n) + _chunk(body or b"") + b"0\r\n\r\n")
        await writer.drain()
        await _read_request(reader)  # the next request on this connection: dropped unanswered

    async with _server(one_per_connection) as (url, _):
        client = EngineHTTP(url)
        try:
            async with await client.post("/x", b"a") as resp:
                assert await resp.read() == b"conn 1: a"
            try:
                resp = await client.post("/x", b"b")
            except EngineUnreachable as exc:
                pytest.fail(f"the dropped pooled connection failed the request: {exc}")
            async with resp:
                assert await resp.read() == b"conn 2: b"
        finally:
            await client.close()
    assert client.connects == 2


async def test_leaving_a_response_before_its_end_closes_the_connection() -> None:
    """The engine aborts a request when its client goes: a left stream is never pooled (its
    next bytes would be read as the next request's answer), and the engine sees the close."""
    gone = asyncio.Event()
    async with _server(_endless(gone)) as (url, _):
        client = EngineHTTP(url)
        try:
            async with await client.post("/x", b"{}") as resp:
                async for part in resp.iter_chunks():
                    assert part.startswith(b"tok 0")
                    break
            try:
                async with await client.post("/x", b"next") as resp:
                    assert await resp.read() == b"conn 2: next"
            except EngineStreamBroken as exc:
                pytest.fail(f"the next request got the left stream's bytes: {exc}")
            try:
                await asyncio.wait_for(gone.wait(), 5)
            except TimeoutError:
                pytest.fail("the engine still streams to a client that left")
        finally:
            await client.close()


async def test_a_connection_lost_mid_body_is_a_broken_stream() -> None:
    async def half(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await _read_request(reader)
        writer.write(STREAM_HEAD + _chunk(b"first"))
        await writer.drain()

    async with _server(half) as (url, _):
        client = EngineHTTP(url)
        try:
            async with await client.post("/x", b"{}") as resp:
                got = []
                with pytest.raises(EngineStreamBroken):
                    async for part in resp.iter_chunks():
                        got.append(part)
                assert got == [b"first"]
        finally:
            await client.close()


async def test_a_refused_connection_is_unreachable() -> None:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    client = EngineHTTP(f"http://127.0.0.1:{port}")
    with pytest.raises(EngineUnreachable):
        await client.post("/x", b"{}")
    await client.close()


async def test_cancelled_while_waiting_for_the_answer_closes_the_connection() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await _read_request(reader)
        await reader.read(1)  # returns when the client closes

    async with _server(silent) as (url, ended):
        client = EngineHTTP(url)
        task = asyncio.create_task(client.post("/x", b"{}"))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(100):
            if ended:
                break
            await asyncio.sleep(0.02)
        assert ended == [1]
        await client.close()


async def test_a_large_unread_body_pauses_reading_and_arrives_whole() -> None:
    blob = bytes(range(256)) * (3 * 4096)  # 3 MiB, over the client's 1 MiB read pause

    async def big(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(blob))
        for i in range(0, len(blob), 65536):
            writer.write(blob[i : i + 65536])
            await writer.drain()

    async with _server(big) as (url, _):
        client = EngineHTTP(url)
        try:
            async with await client.post("/x", b"{}") as resp:
                await asyncio.sleep(0.3)  # let the server fill what the client will buffer
                assert resp._conn.paused  # type: ignore[attr-defined]
                assert await resp.read() == blob
        finally:
            await client.close()


async def test_an_error_status_and_its_body_come_through() -> None:
    lines: list[bytes] = []

    async def bad(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        lines.extend(head.split(b"\r\n"))
        await reader.readexactly(2)
        payload = b'{"error": {"message": "too long", "code": 400}}'
        writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: %d\r\n\r\n%s" % (len(payload), payload))
        await writer.drain()
        await reader.read(1)

    async with _server(bad) as (url, _):
        client = EngineHTTP(url + "/prefix/")
        try:
            async with await client.post("/v1/chat/completions", b"{}") as resp:
                assert resp.status == 400
                assert b"too long" in await resp.read()
        finally:
            await client.close()
    assert lines[0] == b"POST /prefix/v1/chat/completions HTTP/1.1"
    assert f"Host: 127.0.0.1:{url.rsplit(':', 1)[1]}".encode() in lines and b"Content-Length: 2" in lines


def test_the_client_runs_on_uvloop_as_the_worker_does() -> None:
    """The worker's event loop is uvloop (uvicorn's choice), whose transports are not asyncio's."""
    import uvloop

    uvloop.run(test_a_finished_exchange_leaves_its_connection_for_the_next_request())
    uvloop.run(test_leaving_a_response_before_its_end_closes_the_connection())
    uvloop.run(test_a_large_unread_body_pauses_reading_and_arrives_whole())


def test_only_http_urls_are_taken() -> None:
    with pytest.raises(ValueError):
        EngineHTTP("unix:///tmp/engine.sock")


# -- push mode (EngineResponse.push_chunks): the body handed over from the read callback --------


def _keep(got: list[bytes]) -> Callable[[bytes], bool]:
    """A feed that keeps every part and never sees an end."""

    def feed(part: bytes) -> bool:
        got.append(part)
        return False

    return feed


async def test_pushed_bytes_arrive_whole_in_order_and_the_connection_is_reused() -> None:
    parts = [b"tok %d " % i for i in range(50)]

    async def paced(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while await _read_request(reader) is not None:
            writer.write(STREAM_HEAD + _chunk(parts[0]))  # the first part with the head
            for p in parts[1:]:
                await asyncio.sleep(0.002)
                writer.write(_chunk(p))
                await writer.drain()
            writer.write(b"0\r\n\r\n")

    async with _server(paced) as (url, _):
        client = EngineHTTP(url)
        try:
            for _ in range(2):
                got: list[bytes] = []
                async with await client.post("/x", b"{}") as resp:
                    await resp.push_chunks(_keep(got))
                assert b"".join(got) == b"".join(parts)
                assert len(got) > 1  # pushed as they came, not gathered at the end
        finally:
            await client.close()
    assert client.connects == 1


async def test_a_feed_that_saw_the_end_returns_and_leaving_closes_the_connection() -> None:
    gone = asyncio.Event()
    async with _server(_endless(gone)) as (url, _):
        client = EngineHTTP(url)
        try:
            got: list[bytes] = []
            async with await client.post("/x", b"{}") as resp:
                await asyncio.wait_for(resp.push_chunks(lambda b: got.append(b) is None and len(got) == 3), 5)
            assert len(got) == 3 and got[0].startswith(b"tok 0")
            await asyncio.wait_for(gone.wait(), 5)  # the engine saw its client go
        finally:
            await client.close()


async def test_what_the_feed_raises_comes_out_of_push_and_the_connection_is_not_pooled() -> None:
    async with _server(_echo_keepalive) as (url, _):
        client = EngineHTTP(url)

        def feed(b: bytes) -> bool:
            raise ValueError("bad chunk")

        try:
            async with await client.post("/x", b"{}") as resp:
                with pytest.raises(ValueError, match="bad chunk"):
                    await resp.push_chunks(feed)
            async with await client.post("/x", b"next") as resp:
                assert (await resp.read()).endswith(b"next")
        finally:
            await client.close()


async def test_a_connection_lost_mid_push_is_a_broken_stream_after_what_came() -> None:
    async def half(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await _read_request(reader)
        writer.write(STREAM_HEAD + _chunk(b"first"))
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(_chunk(b"second"))
        await writer.drain()

    async with _server(half) as (url, _):
        client = EngineHTTP(url)
        try:
            got: list[bytes] = []
            async with await client.post("/x", b"{}") as resp:
                with pytest.raises(EngineStreamBroken):
                    await resp.push_chunks(_keep(got))
            assert b"".join(got) == b"firstsecond"
        finally:
            await client.close()


async def test_cancelled_while_pushing_closes_the_connection_and_stops_the_feed() -> None:
    got: list[bytes] = []
    async with _server(_endless(asyncio.Event())) as (url, ended):
        client = EngineHTTP(url)

        async def run() -> None:
            async with await client.post("/x", b"{}") as resp:
                await resp.push_chunks(_keep(got))

        task = asyncio.create_task(run())
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        seen = len(got)
        for _ in range(100):
            if ended:
                break
            await asyncio.sleep(0.02)
        assert ended == [1]
        await asyncio.sleep(0.05)
        assert seen > 0 and len(got) == seen  # nothing fed after the cancel
        await client.close()
