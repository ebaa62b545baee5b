"""Talk to workers over NATS directly, as the gateway would (for worker contract tests)."""

from __future__ import annotations

import asyncio
import time
from types import TracebackType
from typing import Any, TypeAlias

from llmlab_common.messages import (
    STREAM_MESSAGE,
    CancelRequest,
    Heartbeat,
    InferenceRequest,
    SamplingParams,
    StreamEnd,
    StreamError,
    StreamStarted,
    TokenChunk,
    split_batch,
)
from llmlab_common.natsio import connect, ensure_streams
from llmlab_common.subjects import Topology, attempt_msg_id
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

ReplyMsg: TypeAlias = StreamStarted | TokenChunk | StreamEnd | StreamError


class WorkerClient:
    def __init__(self, namespace: str, nats_url: str = "nats://127.0.0.1:4222", gateway_id: str = "testgw") -> None:
        self.topo = Topology(namespace)
        self.nats_url = nats_url
        self.gateway_id = gateway_id
        self.nc: NATS | None = None
        self.replies: dict[str, asyncio.Queue[ReplyMsg]] = {}
        self.heartbeats: list[Heartbeat] = []

    async def __aenter__(self) -> WorkerClient:
        self.nc = await connect(self.nats_url, "test-client")
        await ensure_streams(self.nc.jetstream(), self.topo)

        batch_subject = self.topo.token_batch_subject(self.gateway_id)

        async def on_tok(msg: Msg) -> None:
            if msg.subject == batch_subject:
                for line in split_batch(msg.data):
                    m = STREAM_MESSAGE.validate_json(line)
                    self.replies.setdefault(m.request_id, asyncio.Queue()).put_nowait(m)
                return
            rid = msg.subject.rsplit(".", 1)[-1]
            self.replies.setdefault(rid, asyncio.Queue()).put_nowait(STREAM_MESSAGE.validate_json(msg.data))

        async def on_hb(msg: Msg) -> None:
            self.heartbeats.append(Heartbeat.model_validate_json(msg.data))

        await self.nc.subscribe(self.topo.token_wildcard(self.gateway_id), cb=on_tok)
        await self.nc.subscribe(self.topo.heartbeat_wildcard, cb=on_hb)
        return self

    async def __aexit__(self, *exc: tuple[type[BaseException], BaseException, TracebackType]) -> None:
        assert self.nc is not None
        await self.nc.close()

    def request(
        self,
        request_id: str,
        pool: str,
        model: str,
        *,
        prompt: str | None = None,
        messages: list[dict[str, object]] | None = None,
        max_tokens: int = 16,
        attempt: int = 1,
        start_deadline_s: float = 30,
        **params: Any,
    ) -> InferenceRequest:
        now = time.time()
        return InferenceRequest(
            request_id=request_id,
            attempt=attempt,
            gateway_id=self.gateway_id,
            reply_subject=self.topo.token_subject(self.gateway_id, request_id),
            endpoint="chat" if messages is not None else "completions",
            model=model,
            deployment="test",
            pool=pool,
            messages=messages,
            prompt=prompt,
            params=SamplingParams(max_tokens=max_tokens, **params),
            created_at=now,
            dispatched_at=now,
            start_deadline=now + start_deadline_s,
            deadline=now + 300,
        )

    async def publish(self, req: InferenceRequest, worker_id: str | None = None) -> None:
        assert self.nc is not None
        self.replies.setdefault(req.request_id, asyncio.Queue())
        subject = self.topo.worker_subject(req.pool, worker_id) if worker_id else self.topo.pool_subject(req.pool)
        await self.nc.jetstream().publish(
            subject,
            req.model_dump_json().encode(),
            headers={"Nats-Msg-Id": attempt_msg_id(req.request_id, req.attempt)},
        )

    async def cancel(self, request_id: str, attempt: int | None = None) -> None:
        assert self.nc is not None
        await self.nc.publish(
            self.topo.cancel_subject, CancelRequest(request_id=request_id, attempt=attempt).model_dump_json().encode()
        )

    async def next(self, request_id: str, timeout: float = 30) -> ReplyMsg:
        return await asyncio.wait_for(self.replies.setdefault(request_id, asyncio.Queue()).get(), timeout)

    async def collect(self, request_id: str, timeout: float = 60) -> list[ReplyMsg]:
        out: list[ReplyMsg] = []
        while True:
            m = await self.next(request_id, timeout)
            out.append(m)
            if isinstance(m, StreamEnd | StreamError):
                return out

    async def events(self, subject: str, timeout: float = 2.0) -> list[bytes]:
        """Everything on an events subject so far (ephemeral ordered read of the stream)."""
        assert self.nc is not None
        js = self.nc.jetstream()
        sub = await js.subscribe(subject, ordered_consumer=True)
        out: list[bytes] = []
        try:
            while True:
                msg = await sub.next_msg(timeout=timeout)
                out.append(msg.data)
        except TimeoutError:
            pass
        finally:
            await sub.unsubscribe()
        return out
