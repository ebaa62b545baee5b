"""A plain ASGI app that streams OpenAI chat chunks the way the gateway's completion route does
(one ``http.response.body`` send per token, paced by a timer): the server under test in
``asgi_servers.py``, so that the ASGI server's own CPU per send is what differs between runs.

Environment: ``ITL_MS`` (default 20), ``TTFT_MS`` (default 50)."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

ITL_S = float(os.environ.get("ITL_MS", "20")) / 1000
TTFT_S = float(os.environ.get("TTFT_MS", "50")) / 1000
HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
_PREFIX = b'data: {"id":"chatcmpl-x","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
TOKEN = _PREFIX + b'"delta":{"content":"tok "},"finish_reason":null}]}\n\n'
FINISH = _PREFIX + b'"delta":{},"finish_reason":"length"}]}\n\n'


def _usage(n: int) -> bytes:
    usage = {"prompt_tokens": 8, "completion_tokens": n, "total_tokens": 8 + n}
    body = {"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": []}
    return b"data: " + json.dumps({**body, "usage": usage}).encode() + b"\n\ndata: [DONE]\n\n"


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    body = b""
    while True:
        msg = await receive()
        body += msg.get("body", b"")
        if not msg.get("more_body"):
            break
    if scope["path"] == "/health":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})
        return
    n = int(json.loads(body or b"{}").get("max_tokens", 16))
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await asyncio.sleep(TTFT_S)
    for i in range(n):
        if i:
            await asyncio.sleep(ITL_S)
        await send({"type": "http.response.body", "body": TOKEN, "more_body": True})
    await send({"type": "http.response.body", "body": FINISH + _usage(n), "more_body": False})
