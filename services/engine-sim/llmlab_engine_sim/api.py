"""HTTP transport: the OpenAI endpoints, ``/metrics``, ``/sim/stats`` and the flavour's own
health/info endpoints, around a :class:`~llmlab_engine_sim.engine.SimEngine`.

The streaming hot path avoids per-token JSON/pydantic work: each request pre-serialises its chunk
frame once (``prefix`` + JSON string of the token + ``suffix``), vocabulary tokens are JSON-encoded
once per process, and whatever the scheduler emitted since the last wake-up goes out in one
``send`` (normally one token = one SSE event = one write).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from llmlab_common.messages import Endpoint, Usage
from llmlab_common.openai_wire import SSE_DONE, ContentChunkEncoder, chunk, completion, object_id, sse, usage_dict
from llmlab_common.runtime import ServiceState
from llmlab_twin.sched import chain_keys
from llmlab_twin.sched import prompt_block_keys as twin_keys
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.types import Receive, Scope, Send

from llmlab_engine_sim import protocol, textgen
from llmlab_engine_sim.engine import SimEngine
from llmlab_engine_sim.gpu import FixedGpuCollector, gpu_block_size
from llmlab_engine_sim.hf_tokens import HfPromptTokens
from llmlab_engine_sim.protocol import ApiError, ParsedRequest
from llmlab_engine_sim.scheduler import Clock, RequestState, SimRequest
from llmlab_engine_sim.settings import SimSettings
from llmlab_engine_sim.twin_rt import RealtimeTwinScheduler, TwinGpuCollector, twin_scheduler_from_settings

log = logging.getLogger(__name__)

_SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
_ENCODED: dict[str, bytes] = {tok: json.dumps(tok).encode() for tok in textgen.VOCAB}


def _encode(text: str) -> bytes:
    enc = _ENCODED.get(text)
    return enc if enc is not None else json.dumps(text).encode()


def _error(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


class _Frames:
    """A request's pre-serialised SSE frames."""

    __slots__ = ("created", "endpoint", "include_usage", "model", "oid", "prefix", "suffix", "usage_head")

    def __init__(self, endpoint: Endpoint, oid: str, created: int, model: str, include_usage: bool) -> None:
        self.endpoint = endpoint
        self.oid = oid
        self.created = created
        self.model = model
        self.include_usage = include_usage
        content = ContentChunkEncoder(endpoint, oid, created, model, include_usage)
        self.prefix, self.suffix = content.prefix, content.suffix
        # With include_usage the template ends in '"usage":null}\n\n': the running usage goes
        # in place of the null (continuous_usage_stats).
        self.usage_head = self.suffix.removesuffix(_NULL_USAGE_TAIL) if include_usage else b""

    def role(self) -> bytes:
        return sse(
            chunk(self.endpoint, self.oid, self.created, self.model, role="assistant", text="",
                  include_usage_field=self.include_usage)
        )  # fmt: skip

    def final(self, text: str, finish_reason: str) -> bytes:
        return sse(
            chunk(self.endpoint, self.oid, self.created, self.model, text=text, finish_reason=finish_reason,
                  include_usage_field=self.include_usage)
        )  # fmt: skip

    def usage(self, usage: Usage) -> bytes:
        return sse(chunk(self.endpoint, self.oid, self.created, self.model, usage=usage))

    # -- stream_options.continuous_usage_stats: the running usage on every chunk (as vLLM) --------
    def role_with_usage(self, prompt: int) -> bytes:
        obj = chunk(self.endpoint, self.oid, self.created, self.model, role="assistant", text="")
        obj["usage"] = usage_dict(Usage(prompt_tokens=prompt, total_tokens=prompt))
        return sse(obj)

    def content_with_usage(self, text: str, finish_reason: str | None, prompt: int, completion: int) -> bytes:
        if finish_reason is None:  # every chunk but the last: from the serialised template
            usage = b'{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}' % (
                prompt,
                completion,
                prompt + completion,
            )
            return self.prefix + _encode(text) + self.usage_head + usage + b"}\n\n"
        obj = chunk(self.endpoint, self.oid, self.created, self.model, text=text, finish_reason=finish_reason)
        obj["usage"] = usage_dict(
            Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)
        )
        return sse(obj)


_NULL_USAGE_TAIL = b"null}\n\n"


class _GenerationResponse(Response):
    """Streams (or, for ``stream: false``, waits for) one request's tokens. A task watches the
    connection meanwhile: when the client goes away the request is aborted in the scheduler."""

    def __init__(self, engine: SimEngine, req: SimRequest, parsed: ParsedRequest) -> None:
        # Deliberately not Response.__init__: headers are sent by __call__ (no content-length
        # for a stream).
        self.status_code = 200
        self.background = None
        self.raw_headers = []
        self._engine = engine
        self._req = req
        self._parsed = parsed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watcher = asyncio.get_running_loop().create_task(self._watch(receive))
        try:
            if self._parsed.stream:
                await self._stream(send)
            else:
                await self._complete(send)
        finally:
            watcher.cancel()
            self._engine.scheduler.abort(self._req.id)  # no-op unless it is still running
        if self.background is not None:
            await self.background()

    async def _watch(self, receive: Receive) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                if self._engine.scheduler.abort(self._req.id):
                    log.debug("client disconnected: request aborted", extra={"request_id": self._req.id})
                return

    def _usage(self) -> Usage:
        req = self._req
        return Usage(
            prompt_tokens=req.prompt_tokens,
            completion_tokens=req.generated,
            total_tokens=req.prompt_tokens + req.generated,
        )

    async def _stream(self, send: Send) -> None:
        req, parsed = self._req, self._parsed
        frames = _Frames(
            parsed.endpoint,
            object_id(parsed.endpoint, req.id),
            int(time.time()),
            parsed.model,
            parsed.include_usage,
        )
        prefix, suffix = frames.prefix, frames.suffix
        sink = req.sink
        await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
        per_chunk = self._engine.settings.chunk_tokens
        if per_chunk > 1 or (parsed.include_usage and parsed.continuous_usage):
            await self._stream_grouped(send, frames, per_chunk)
            return
        first = parsed.endpoint == "chat"  # vLLM opens a chat stream with the role, sent with the first token
        encoded = _ENCODED
        while True:
            await sink.wait()
            pieces = sink.take()
            if len(pieces) == 1 and not first and not sink.closed:
                # The common case: one token since the last wake-up, one event, one write.
                text = pieces[0]
                if text:
                    enc = encoded.get(text) or _encode(text)
                    await send({"type": "http.response.body", "body": prefix + enc + suffix, "more_body": True})
                continue
            done = sink.closed and req.state is RequestState.DONE
            parts: list[bytes] = []
            if pieces:
                if first:
                    parts.append(frames.role())
                    first = False
                last = len(pieces) - 1 if done else -1
                for i, text in enumerate(pieces):
                    if i == last:
                        parts.append(frames.final(text, req.finish_reason or "stop"))
                    elif text:
                        parts.append(prefix + _encode(text) + suffix)
            if await self._send_parts(send, frames, parts, sink.closed, done):
                return

    async def _send_parts(self, send: Send, frames: _Frames, parts: list[bytes], closed: bool, done: bool) -> bool:
        """Send what one wake-up produced; True when the stream ended. A finished stream ends with
        the usage chunk (when asked) and [DONE]; an aborted one (client gone, server stopping)
        without [DONE]."""
        if closed:
            if done:
                if self._parsed.include_usage:
                    parts.append(frames.usage(self._usage()))
                parts.append(SSE_DONE)
            await send({"type": "http.response.body", "body": b"".join(parts), "more_body": False})
            return True
        if parts:
            await send({"type": "http.response.body", "body": b"".join(parts), "more_body": True})
        return False

    async def _stream_grouped(self, send: Send, frames: _Frames, per_chunk: int) -> None:
        """The stream with several tokens per chunk and/or the running usage on every chunk: the
        general path (the one above is the fast path for one token per chunk and no usage)."""
        req, parsed = self._req, self._parsed
        running = parsed.include_usage and parsed.continuous_usage
        prompt = req.prompt_tokens
        sink = req.sink
        first = parsed.endpoint == "chat"
        pending: list[str] = []
        sent = 0
        while True:
            await sink.wait()
            pending.extend(sink.take())
            done = sink.closed and req.state is RequestState.DONE
            if sink.closed and not done:
                pending = []  # aborted: what was not sent is not sent
            parts: list[bytes] = []
            while len(pending) >= per_chunk or (done and pending):
                group, pending = pending[:per_chunk], pending[per_chunk:]
                sent += len(group)
                if first:
                    parts.append(frames.role_with_usage(prompt) if running else frames.role())
                    first = False
                finish = (req.finish_reason or "stop") if done and not pending else None
                text = "".join(group)
                if running:
                    parts.append(frames.content_with_usage(text, finish, prompt, sent))
                elif finish is not None:
                    parts.append(frames.final(text, finish))
                else:
                    parts.append(frames.prefix + _encode(text) + frames.suffix)
            if await self._send_parts(send, frames, parts, sink.closed, done):
                return

    async def _complete(self, send: Send) -> None:
        req, parsed = self._req, self._parsed
        sink = req.sink
        texts: list[str] = []
        while not sink.closed:
            await sink.wait()
            texts.extend(sink.take())
        texts.extend(sink.take())
        if req.state is RequestState.DONE:
            status = 200
            obj: dict[str, Any] = completion(
                parsed.endpoint,
                object_id(parsed.endpoint, req.id),
                int(time.time()),
                parsed.model,
                text="".join(texts),
                finish_reason=req.finish_reason or "stop",
                usage=self._usage(),
            )
        else:
            err = ApiError(503, "the request was aborted by the engine (shutting down)")
            status, obj = err.status, err.body()
        body = json.dumps(obj, separators=(",", ":")).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})


class SimApp(FastAPI):
    """FastAPI, except that the generation endpoints in ``fast_routes`` are dispatched here as
    plain ASGI: they skip routing, dependency solving and the Starlette error/exception
    middleware, whose wrappers would otherwise sit on every per-token ``send``. Middleware added
    with ``add_middleware`` therefore does not see them. Everything else (and the same routes,
    registered normally for introspection and as a fallback) goes through FastAPI."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fast_routes: dict[str, Callable[[bytes], Awaitable[Response]]] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            handler = self.fast_routes.get(scope["path"])
            if handler is not None:
                body = await _read_body(receive)
                if body is not None:
                    response = await handler(body)
                    await response(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


async def _read_body(receive: Receive) -> bytes | None:
    """The whole request body, or None if the client went away first."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _install_twin(engine: SimEngine, settings: SimSettings, clock: Clock | None) -> RealtimeTwinScheduler:
    """``--mode twin``: the engine twin's step scheduler replaces the fixed-latency one (same
    interface), the flavour's metrics read its KV/prefix/preemption figures, and simulated
    GPU gauges join ``/metrics``."""
    twin = twin_scheduler_from_settings(settings, clock=clock, observer=engine.metrics)
    engine.scheduler = twin
    engine.metrics.bind(twin)
    engine.registry.register(TwinGpuCollector(twin, settings))
    return twin


def create_app(settings: SimSettings | None = None, *, clock: Clock | None = None) -> SimApp:
    """The simulator app; the scheduler loop starts in the lifespan (nothing runs before)."""
    settings = settings if settings is not None else SimSettings()
    state = ServiceState()
    engine = SimEngine(settings, clock=clock, service_state=state)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine.start()
        try:
            yield
        finally:
            await engine.stop()
            log.info("engine simulator stopped", extra=engine.scheduler.snapshot())

    app = SimApp(
        title=f"llmlab engine simulator ({settings.flavor})",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.service_state = state
    app.state.engine = engine
    prompt_tokens = HfPromptTokens(settings.tokenizer) if settings.tokenizer is not None else None
    twin = _install_twin(engine, settings, clock) if settings.mode == "twin" else None
    if twin is None:  # the twin registers its own GPU gauges
        engine.registry.register(
            FixedGpuCollector(lambda: engine.scheduler, engine.metrics, settings, gpu_block_size(settings.flavor))
        )

    async def generate(endpoint: Endpoint, raw: bytes) -> Response:
        if not engine.healthy:
            return _error(ApiError(503, "the engine is not serving (starting or draining)"))
        try:
            parsed = protocol.parse_generation(
                endpoint, raw, settings.model, settings.max_model_len, settings.flavor, prompt_tokens
            )
        except ApiError as e:
            return _error(e)
        req = engine.new_request(parsed)
        if twin is not None:
            bs = settings.block_size
            keys: list[int] = []
            if settings.prefix_caching:
                # the real ids' hash chain where a tokenizer gave them (the blocks vLLM would hash)
                ids = parsed.prompt_ids
                if ids is not None:
                    keys = chain_keys(ids, bs)
                else:
                    keys = twin_keys(parsed.prompt_key, parsed.prompt_tokens, bs)
            twin.submit(req, keys=keys)
        else:
            engine.scheduler.submit(req)
        return _GenerationResponse(engine, req, parsed)

    async def chat_completions_raw(raw: bytes) -> Response:
        return await generate("chat", raw)

    async def completions_raw(raw: bytes) -> Response:
        return await generate("completions", raw)

    app.fast_routes = {"/v1/chat/completions": chat_completions_raw, "/v1/completions": completions_raw}

    # The same endpoints as FastAPI routes; SimApp.__call__ normally serves them first.
    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await generate("chat", await request.body())

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await generate("completions", await request.body())

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        card = {
            "id": settings.model,
            "object": "model",
            "created": engine.created,
            "owned_by": engine.flavor.owned_by,
            "root": settings.model,
            "parent": None,
            "max_model_len": settings.max_model_len,
            "permission": [],
        }
        return JSONResponse({"object": "list", "data": [card]})

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        return Response(engine.render_metrics(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/sim/stats")
    async def sim_stats() -> JSONResponse:
        """Simulator-only (real engines have no such endpoint): counters for tests and demos."""
        out = engine.scheduler.snapshot()
        out.update(
            flavor=settings.flavor,
            model=settings.model,
            ttft_ms=settings.ttft_ms,
            itl_ms=settings.itl_ms,
            tick_ms=settings.tick_ms,
            max_num_seqs=settings.max_num_seqs,
            output_len=settings.output_len,
            mode=settings.mode,
        )
        return JSONResponse(out)

    app.include_router(engine.flavor.router(engine))
    return app
