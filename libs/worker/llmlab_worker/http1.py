"""A small HTTP/1.1 client for the engine's streamed completions: one POST, the body as it arrives.

Why not aiohttp here: a streamed engine request through aiohttp cost the worker about 240 µs of
CPU for a 2-token answer and 12 µs per further chunk; this client, on asyncio's protocol API and
httptools' parser (uvicorn's), about 65 µs and 8 µs (see docs/benchmarks.md). The worker starts
one such request per attempt, so a burst of a thousand is admitted that much sooner.

What it keeps of aiohttp's behaviour that the worker relies on: keep-alive connections reused
(one request at a time each), a connect timeout, a reused connection that the server closed
while idle retried once on a fresh one (nothing reached the engine), leaving a response before
its end closes the connection (the engine aborts the request), the read paused while more than
1 MiB waits unread. Health and metrics polls stay on aiohttp: they are not per request.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import AsyncIterator, Callable
from types import TracebackType
from typing import cast
from urllib.parse import urlsplit

import httptools

_HIGH_WATER = 1 << 20  # unread body bytes at which the socket's reads pause


class EngineHTTPError(Exception):
    """A transport failure talking to the engine (no HTTP status to report)."""


class EngineUnreachable(EngineHTTPError):
    """No answer started: the connection failed, timed out, or closed before a status line."""


class EngineStreamBroken(EngineHTTPError):
    """The connection ended, or the response was malformed, before the body was complete."""


class _Conn(asyncio.Protocol):
    """One connection; it carries at most one exchange at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser: httptools.HttpResponseParser | None = None
        self.status = 0
        self.keep_alive = False
        self.head_done = False
        self.complete = False
        self.lost = False
        self.failure: Exception | None = None
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.paused = False
        self._waiter: asyncio.Future[None] | None = None
        # Push mode (EngineResponse.push_chunks): body bytes go to this callback as they are
        # parsed, in the read's own callback, instead of waiting here for a task to take them.
        self.sink: Callable[[bytes], None] | None = None

    # -- exchange state --------------------------------------------------------------------
    def begin(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.status, self.keep_alive, self.head_done, self.complete = 0, False, False, False
        self.chunks.clear()
        self.buffered = 0

    @property
    def usable(self) -> bool:
        return not self.lost and self.transport is not None and not self.transport.is_closing()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    async def wait(self) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def take(self) -> bytes:
        data = self.chunks.popleft() if len(self.chunks) == 1 else b"".join(self.chunks)
        self.chunks.clear()
        self.buffered = 0
        if self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        return data

    # -- asyncio.Protocol ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.parser is None or self.complete:
            # Bytes nobody asked for (on an idle connection): it cannot be reused.
            self.failure = EngineStreamBroken("unexpected data from the engine")
            self.close()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.failure = EngineStreamBroken(f"malformed response from the engine: {exc}")
            self.close()
            self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._wake()

    # -- httptools callbacks -----------------------------------------------------------------
    def on_headers_complete(self) -> None:
        assert self.parser is not None
        self.status = self.parser.get_status_code()
        self.keep_alive = self.parser.should_keep_alive()
        self.head_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        if self.sink is not None:
            self.sink(body)
            return
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > _HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self._wake()


class EngineResponse:
    """A response whose head has arrived; leave it (``async with``) to give its connection back."""

    def __init__(self, client: EngineHTTP, conn: _Conn) -> None:
        self._client = client
        self._conn = conn
        self.status = conn.status

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives: everything received since the last read, de-chunked."""
        conn = self._conn
        while True:
            if conn.chunks:
                yield conn.take()
            elif conn.complete:
                return
            elif conn.lost or conn.failure is not None:
                raise conn.failure or EngineStreamBroken("the engine closed the connection mid-response")
            else:
                await conn.wait()

    async def read(self) -> bytes:
        return b"".join([part async for part in self.iter_chunks()])

    async def push_chunks(self, feed: Callable[[bytes], bool]) -> None:
        """The body to ``feed`` as it arrives, called from the connection's read callback: no
        task wake-up and no await per read (what :meth:`iter_chunks` costs each time; at one
        engine chunk per read, 4-5 µs of the worker's CPU per token on a Zen 3 host:
        ``results/chunk-wakeup/20261208``). ``feed``
        returns True when it has seen the stream's end (the rest is ignored). Returns at the end
        (``feed``'s or the body's); raises what ``feed`` raised or the transport's failure."""
        conn = self._conn
        if conn.chunks and feed(conn.take()):  # what arrived with the head
            return
        ended = False
        raised: Exception | None = None

        def on_body(body: bytes) -> None:
            nonlocal ended, raised
            if ended:
                return
            try:
                ended = feed(body)
            except Exception as exc:  # raised where the attempt waits, not inside the parser
                ended, raised = True, exc
            if ended:
                conn._wake()

        conn.sink = on_body
        try:
            while not ended and not conn.complete:
                if conn.lost or conn.failure is not None:
                    raise conn.failure or EngineStreamBroken("the engine closed the connection mid-response")
                await conn.wait()
        finally:
            conn.sink = None
        if raised is not None:
            raise raised

    def release(self) -> None:
        self._client.give_back(self._conn)

    async def __aenter__(self) -> EngineResponse:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


class EngineHTTP:
    """Keep-alive connections to one engine base URL (``http://`` or ``https://``, with a path
    prefix if any)."""

    def __init__(self, base_url: str, connect_timeout_s: float = 5.0, max_idle: int = 1024) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"engine URL must be http(s)://host[:port][/prefix], not {base_url!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.prefix = parts.path.rstrip("/")
        self.connect_timeout_s = connect_timeout_s
        self.max_idle = max_idle
        self._ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self._host_header = parts.netloc.rsplit("@", 1)[-1].encode("ascii")
        self._idle: deque[_Conn] = deque()
        self._open: set[_Conn] = set()
        self.connects = 0  # connections opened (for tests and diagnostics)

    async def _connect(self) -> _Conn:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, conn = await loop.create_connection(_Conn, self.host, self.port, ssl=self._ssl)
        except TimeoutError as exc:
            raise EngineUnreachable(f"connect to {self.host}:{self.port} timed out") from exc
        except OSError as exc:
            raise EngineUnreachable(f"cannot connect to {self.host}:{self.port}: {exc}") from exc
        self.connects += 1
        self._open.add(conn)
        return conn

    def _take_idle(self) -> _Conn | None:
        while self._idle:
            conn = self._idle.pop()  # the most recent: the least likely to have timed out
            if conn.usable:
                return conn
            self._open.discard(conn)
        return None

    def give_back(self, conn: _Conn) -> None:
        """Pool a connection whose exchange ended cleanly; close any other."""
        conn.parser = None
        if conn.complete and conn.keep_alive and conn.usable and len(self._idle) < self.max_idle:
            self._idle.append(conn)
        else:
            conn.close()
            self._open.discard(conn)

    async def post(self, path: str, body: bytes, content_type: bytes = b"application/json") -> EngineResponse:
        """Send a POST and return once the response's head is in (status and headers)."""
        head = b"".join(
            (
                b"POST ",
                (self.prefix + path).encode("ascii"),
                b" HTTP/1.1\r\nHost: ",
                self._host_header,
                b"\r\nContent-Type: ",
                content_type,
                b"\r\nAccept: text/event-stream\r\nContent-Length: %d\r\n\r\n" % len(body),
            )
        )
        while True:
            conn = self._take_idle()
            reused = conn is not None
            if conn is None:
                conn = await self._connect()
            conn.begin()
            assert conn.transport is not None
            conn.transport.write(head + body)
            try:
                while not conn.head_done:
                    if conn.lost or conn.failure is not None:
                        break
                    await conn.wait()
            except BaseException:
                conn.close()  # cancelled while waiting: the engine must not go on
                self._open.discard(conn)
                raise
            if conn.head_done:
                return EngineResponse(self, conn)
            conn.close()
            self._open.discard(conn)
            if reused and conn.failure is None:
                continue  # the server closed an idle connection as we wrote: nothing reached it
            raise conn.failure or EngineUnreachable("the engine closed the connection before answering")

    async def close(self) -> None:
        for conn in self._open:
            conn.close()
        self._open.clear()
        self._idle.clear()
        await asyncio.sleep(0)  # let the transports finish closing
