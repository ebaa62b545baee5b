"""Mid-stream failover through the whole stack: stream a completion, SIGKILL the worker that
serves it after some tokens, and read what the client got (the same checks run on the simulator's
two flavours and on real vLLM)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import httpx
from llmlab_common.messages import split_batch
from llmlab_common.natsio import connect
from llmlab_common.subjects import Topology
from nats.aio.msg import Msg

from llmlab_testkit.fixtures import DEV_KEY
from llmlab_testkit.procs import ManagedProcess


@dataclass
class Relayed:
    """One streamed answer as the client saw it."""

    status: int
    request_id: str
    ids: list[str] = field(default_factory=list)  # every chunk's id, in order
    pieces: list[str] = field(default_factory=list)  # the content (or text) of each chunk, in order
    finishes: list[str] = field(default_factory=list)  # every finish_reason sent
    usage: dict[str, int] = field(default_factory=dict)
    errors: list[dict[str, Any]] = field(default_factory=list)  # in-band error events
    done: int = 0  # "data: [DONE]" lines

    @property
    def text(self) -> str:
        return "".join(self.pieces)


async def relay(
    base: str,
    body: dict[str, Any],
    *,
    endpoint: str = "chat",
    api_key: str = DEV_KEY,
    pieces_seen: asyncio.Queue[int] | None = None,
    timeout: float = 120,
) -> Relayed:
    """Stream ``body`` (``stream`` and ``include_usage`` are set here); after each content chunk
    the number received so far goes into ``pieces_seen``."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
    async with (
        httpx.AsyncClient(timeout=timeout) as h,
        h.stream("POST", base + path, headers={"Authorization": f"Bearer {api_key}"}, json=body) as resp,
    ):
        out = Relayed(resp.status_code, resp.headers.get("x-request-id", ""))
        async for line in resp.aiter_lines():
            if line == "data: [DONE]":
                out.done += 1
                continue
            if not line.startswith("data: "):
                continue
            obj = json.loads(line[6:])
            if "error" in obj:
                out.errors.append(obj["error"])
                continue
            out.ids.append(obj["id"])
            if obj.get("usage"):
                out.usage = obj["usage"]
            for choice in obj["choices"]:
                piece = choice["delta"].get("content") if endpoint == "chat" else choice.get("text")
                if piece:
                    out.pieces.append(piece)
                    if pieces_seen is not None:
                        pieces_seen.put_nowait(len(out.pieces))
                if choice.get("finish_reason"):
                    out.finishes.append(choice["finish_reason"])
        return out


async def kill_mid_stream(
    base: str,
    body: dict[str, Any],
    workers: list[ManagedProcess],
    after: int,
    *,
    endpoint: str = "chat",
    api_key: str = DEV_KEY,
    timeout: float = 120,
) -> tuple[Relayed, int, ManagedProcess]:
    """Stream ``body`` and SIGKILL whichever of ``workers`` (each started with a worker id) holds it
    once ``after`` content chunks reached the client. Returns the stream, the chunks received before
    the kill, and the worker killed."""
    by_id = {w.env["LLMLAB_WORKER_WORKER_ID"]: w for w in workers}
    env = workers[0].env
    # The holder is the worker id in the stream's "started" message, read on NATS as the gateway
    # reads it: scraping the workers' in-flight gauge over HTTP took over 5 s in CI while real vLLM
    # held both cores, and the answer was complete by then.
    nc = await connect(env["LLMLAB_NATS_URL"], "test-failover-observer")
    started: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def on_message(msg: Msg) -> None:
        for raw in split_batch(msg.data):  # one message or a gateway's batch of them
            obj = json.loads(raw)
            if obj.get("kind") == "started" and not started.done():
                started.set_result(obj["worker_id"])

    seen: asyncio.Queue[int] = asyncio.Queue()
    try:
        await nc.subscribe(Topology(env["LLMLAB_NAMESPACE"]).every_token_wildcard, cb=on_message)
        await nc.flush()
        call = asyncio.create_task(
            relay(base, body, endpoint=endpoint, api_key=api_key, pieces_seen=seen, timeout=timeout)
        )
        try:
            holder = by_id[await asyncio.wait_for(started, timeout)]
            n = 0
            while n < after:
                n = await asyncio.wait_for(seen.get(), timeout)
        except BaseException:
            call.cancel()
            raise
    finally:
        await nc.close()
    if call.done():
        # Not a failover failure: the engine answered in full before the kill, so nothing could be
        # continued. A fast engine under a loaded host packs many tokens per chunk; kill sooner.
        raise AssertionError(f"the stream ended before the kill ({n} chunks by then): lower `after`")
    holder.kill()  # SIGKILL: no drain, no terminal message, heartbeats stop
    # What reached the client before the kill: the pieces counted by now (more may be in flight).
    while not seen.empty():
        n = seen.get_nowait()
    return await call, n, holder
