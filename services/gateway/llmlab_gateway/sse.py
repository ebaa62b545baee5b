"""Server-sent events with the per-chunk cost of raw ASGI.

Starlette's ``StreamingResponse`` sends every chunk through the ``send`` wrappers of each
middleware (server errors, exceptions) and runs a task group per response: on the relay's hot
path that was about a fifth of the gateway's CPU. Here the response start goes through the
wrapped ``send`` (so the middleware know the response started, and an error before it is still
a 500), and the body chunks go straight to the server's own ``send``, which :class:`RawSendApp`
keeps in the scope. A client disconnect cancels the stream, as with ``StreamingResponse``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from fastapi import FastAPI, Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

RAW_SEND = "llmlab.raw_send"


FastHandler = Callable[[Request], Awaitable[Response]]


class RawSendApp(FastAPI):
    """FastAPI that keeps the server's own ``send`` in each HTTP scope (for :class:`SseResponse`),
    and serves the POST routes in ``fast_routes`` as plain ASGI: without routing, dependency
    solving and the Starlette/FastAPI middleware, which were about a fifth of the gateway's CPU
    per request (``results/relay-cost-split/20261203``). A fast handler answers every error itself
    (in OpenAI's shape); ``unexpected`` turns anything else into a 500 of that shape. The same
    routes stay registered on the app (OpenAPI, other methods, a fallback)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fast_routes: dict[str, FastHandler] = {}
        self.unexpected: Callable[[Exception], Response] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope[RAW_SEND] = send
            handler = self.fast_routes.get(scope["path"]) if scope["method"] == "POST" else None
            if handler is not None:
                scope["app"] = self
                try:
                    response = await handler(Request(scope, receive))
                except Exception as exc:
                    if self.unexpected is None:
                        raise
                    response = self.unexpected(exc)
                await response(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


class SseResponse(Response):
    media_type = "text/event-stream"

    def __init__(self, frames: AsyncIterator[bytes], headers: Mapping[str, str] | None = None) -> None:
        # Like StreamingResponse: no body attribute, so no Content-Length header.
        self.status_code = 200
        self.background = None
        self.init_headers(headers)
        self.frames = frames

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw: Send = scope.get(RAW_SEND, send)
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        task = asyncio.current_task()
        assert task is not None
        gone = False

        async def watch() -> None:
            nonlocal gone
            while True:
                message: Any = await receive()
                if message["type"] == "http.disconnect":
                    gone = True
                    task.cancel()
                    return

        watcher = asyncio.create_task(watch())
        try:
            async for chunk in self.frames:
                await raw({"type": "http.response.body", "body": chunk, "more_body": True})
            await raw({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not gone:
                raise
            task.uncancel()  # our own cancel: the client left, the response is over
        finally:
            watcher.cancel()
            aclose = getattr(self.frames, "aclose", None)
            if aclose is not None:
                await aclose()
