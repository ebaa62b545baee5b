"""Engine adapters: what the worker lifecycle needs of an engine (:class:`EngineAdapter`), and the
HTTP one that drives an OpenAI-compatible engine server.

vLLM (``vllm serve`` / ``python -m vllm.entrypoints.openai.api_server``) and SGLang
(``python -m sglang.launch_server``) both speak OpenAI's streaming API; what differs (metric
names, health endpoint, extra request fields) is declared by a subclass. worker-vllm also has an
in-process adapter (vLLM's engine inside the worker process, no HTTP hop).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import aiohttp
import orjson
from llmlab_common import openai_wire as wire
from llmlab_common.messages import EngineLoad, InferenceRequest, Usage
from llmlab_common.metrics import parse_prometheus_text
from prometheus_client.registry import Collector

from llmlab_worker.http1 import EngineHTTP, EngineHTTPError, EngineResponse

log = logging.getLogger(__name__)


class EngineRequestError(Exception):
    """The engine refused or failed the request. ``status`` is the engine's HTTP status (0: no connection)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(slots=True)
class EngineEvent:
    """One parsed chunk of the engine's stream."""

    at: float  # time.monotonic() when it arrived
    text: str = ""
    # Tokens this chunk carries, as the engine counted them: token ids (in-process), the change of
    # the running usage (an OpenAI server with ``stream_options.continuous_usage_stats``); 1 when
    # the engine does not say (``engine_counted`` False).
    tokens: int = 1
    engine_counted: bool = False
    tool_calls: list[dict[str, Any]] | None = None
    finish_reason: str | None = None
    usage: Usage | None = None
    # Time the request waited inside the engine before it was scheduled, where the engine tells
    # per request (the in-process vLLM engine does; an OpenAI-compatible server does not).
    engine_queue_s: float | None = None


# What SSELines.event returns for the engine's "data: [DONE]": the stream is over.
_DONE = EngineEvent(at=-1.0)

# Runs a request, handing each event to the callback as it is parsed; returns at the stream's end.
PushRelay = Callable[[InferenceRequest, Callable[[EngineEvent], None]], Awaitable[None]]


class SSELines:
    """An OpenAI-compatible engine's SSE body, split into lines as it arrives (we split it
    ourselves: an SSE event is two lines), each line's event handed to ``emit``."""

    __slots__ = ("chat", "counted", "done", "emit", "parse", "rest")

    def __init__(
        self,
        chat: bool,
        emit: Callable[[EngineEvent], None],
        parse: Callable[[dict[str, Any], float, bool], EngineEvent | None],
    ) -> None:
        self.chat, self.emit, self.parse = chat, emit, parse
        self.rest = b""  # a line not complete yet
        self.counted = 0  # completion tokens of the running usage so far
        self.done = False  # "data: [DONE]" seen

    def feed(self, part: bytes) -> bool:
        """Take what arrived; True once the stream's end was seen (nothing after it is read)."""
        if b"\n" not in part:
            self.rest += part
            return False
        *lines, self.rest = (self.rest + part).split(b"\n")
        for raw in lines:
            event = self.event(raw)
            if event is _DONE:
                self.done = True
                return True
            if event is not None:
                self.emit(event)
        return False

    def end(self) -> None:
        """The body ended: a last line without its newline, if any."""
        if not self.done:
            event = self.event(self.rest)
            if event is not None and event is not _DONE:
                self.emit(event)

    def event(self, raw: bytes) -> EngineEvent | None:
        """One line's event, None (nothing to pass on), or ``_DONE``."""
        if not raw.startswith(b"data:"):
            return None
        data = raw[5:].strip()
        if data == b"[DONE]":
            return _DONE
        obj = orjson.loads(data)
        event = self.parse(obj, time.monotonic(), self.chat)
        if event is not None:
            running = (obj.get("usage") or {}).get("completion_tokens")
            if running is not None:
                event.engine_counted = True
                event.tokens = max(0, running - self.counted)
                self.counted = max(self.counted, running)
        return event


class EngineAdapter(Protocol):
    """What the worker lifecycle calls on an engine, whichever way it is reached."""

    engine: ClassVar[str]

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def healthy(self) -> bool: ...

    async def load(self) -> EngineLoad: ...

    def stream(self, req: InferenceRequest) -> AsyncGenerator[EngineEvent, None]:
        """The request's chunks as they come; closing the iterator aborts it in the engine.
        Raises :class:`EngineRequestError` when the engine refuses or fails it."""
        ...

    def collectors(self) -> list[Collector]:
        """Prometheus collectors the worker's /metrics adds (the engine's own, when in-process)."""
        ...


@dataclass(frozen=True)
class MetricNames:
    running: str
    waiting: str
    kv_cache_usage: str
    queue_time_sum: str | None = None
    queue_time_count: str | None = None
    prefix_hits: str | None = None  # counter pair (vLLM) ...
    prefix_queries: str | None = None
    prefix_hit_rate: str | None = None  # ... or a ready gauge (SGLang)
    preemptions: str | None = None  # the engine's cumulative preemption counter, where it has one
    # Tokens per engine step, a histogram (vLLM's iteration_tokens_total): the batch size is its
    # mean over the window; without it (or without a previous read) the running requests.
    batch_tokens_sum: str | None = None
    batch_tokens_count: str | None = None


@dataclass
class _LoadWindow:
    """Previous counter values, so rates/means are over the last heartbeat interval."""

    last: dict[str, float] = field(default_factory=dict)

    def delta(self, values: dict[str, float], name: str | None) -> float | None:
        if name is None or name not in values:
            return None
        prev = self.last.get(name)
        self.last[name] = values[name]
        return None if prev is None else max(0.0, values[name] - prev)


def continued_chat(req: InferenceRequest) -> list[dict[str, Any]]:
    """A resumed chat's messages: the conversation, then what the client has received as a final
    assistant message for the engine to continue (not to answer)."""
    assert req.resume is not None
    return [*(req.messages or []), {"role": "assistant", "content": req.resume.text}]


def continued_prompt(req: InferenceRequest) -> str:
    """A resumed completion's prompt: the prompt, then what the client has received."""
    return (req.prompt or "") + (req.resume.text if req.resume is not None else "")


class OpenAIEngineAdapter:
    """Base adapter; subclasses set ``engine``, ``metric_names`` and may override hooks."""

    engine: ClassVar[str] = "openai"
    metric_names: ClassVar[MetricNames]
    health_path: ClassVar[str] = "/health"
    # What asks the engine to continue a chat's final assistant message instead of answering it
    # (mid-stream failover): vLLM's chat-template options; None where the engine has no way.
    continue_fields: ClassVar[dict[str, Any] | None] = {"continue_final_message": True, "add_generation_prompt": False}

    def __init__(self, base_url: str, max_concurrency: int, connect_timeout_s: float = 5.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.max_concurrency = max_concurrency
        self.connect_timeout_s = connect_timeout_s
        self._session: aiohttp.ClientSession | None = None
        self._http: EngineHTTP | None = None  # the generation requests (see http1)
        self._window = _LoadWindow()

    async def start(self) -> None:
        # aiohttp serves the health and metrics polls only (one or two at a time); the generation
        # requests, one per attempt, go through EngineHTTP.
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=4, ttl_dns_cache=300),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout_s),
        )
        self._http = EngineHTTP(self.base_url, self.connect_timeout_s, max_idle=self.max_concurrency + 4)

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    def collectors(self) -> list[Collector]:
        return []  # the engine server has its own /metrics

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("adapter not started")
        return self._session

    # -- health and load ----------------------------------------------------------------------
    async def healthy(self) -> bool:
        try:
            async with self.session.get(
                self.base_url + self.health_path, timeout=aiohttp.ClientTimeout(total=3)
            ) as resp:
                return resp.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def load(self) -> EngineLoad:
        async with self.session.get(self.base_url + "/metrics", timeout=aiohttp.ClientTimeout(total=3)) as resp:
            resp.raise_for_status()
            values = parse_prometheus_text(await resp.text())
        return self.load_from_metrics(values)

    def load_from_metrics(self, values: dict[str, float]) -> EngineLoad:
        names = self.metric_names
        hit_rate: float | None = None
        if names.prefix_hit_rate is not None:
            hit_rate = values.get(names.prefix_hit_rate)
        else:
            hits = self._window.delta(values, names.prefix_hits)
            queries = self._window.delta(values, names.prefix_queries)
            if hits is not None and queries:
                hit_rate = hits / queries
        q_sum = self._window.delta(values, names.queue_time_sum)
        q_count = self._window.delta(values, names.queue_time_count)
        running = values.get(names.running)
        batch = running
        b_sum = self._window.delta(values, names.batch_tokens_sum)
        b_count = self._window.delta(values, names.batch_tokens_count)
        if b_sum is not None and b_count is not None:
            batch = b_sum / b_count if b_count else 0.0  # no engine step in the window: no batch
        elif names.batch_tokens_count is not None and names.batch_tokens_count in values:
            batch = None  # the first read of the histogram: no window yet
        return EngineLoad(
            running=running,
            waiting=values.get(names.waiting),
            kv_cache_usage=values.get(names.kv_cache_usage),
            prefix_cache_hit_rate=hit_rate,
            mean_queue_time_s=(q_sum / q_count) if q_sum is not None and q_count else None,
            preemptions_total=values.get(names.preemptions) if names.preemptions is not None else None,
            batch_size=batch,
        )

    # -- generation ---------------------------------------------------------------------------
    def build_body(self, req: InferenceRequest) -> dict[str, Any]:
        """The engine request: always streamed (so cancel and timings work for every client)."""
        body: dict[str, Any] = {
            "model": req.model,
            "stream": True,
            # continuous_usage_stats: every chunk carries the running usage (vLLM, SGLang), so a
            # chunk that merges several tokens is counted as such (see stream()).
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
        if req.endpoint == "chat":
            if req.resume is not None:
                if self.continue_fields is None:
                    raise EngineRequestError(400, f"{self.engine} cannot continue a partial answer")
                body["messages"] = continued_chat(req)
                body.update(self.continue_fields)
            else:
                body["messages"] = req.messages
        else:
            body["prompt"] = continued_prompt(req) if req.resume is not None else req.prompt
        body.update(req.params.model_dump(exclude_none=True))
        return body

    def path_for(self, req: InferenceRequest) -> str:
        return "/v1/chat/completions" if req.endpoint == "chat" else "/v1/completions"

    async def _open(self, req: InferenceRequest) -> EngineResponse:
        """The engine's answer to the request once its head is in, a 200 (else raised)."""
        if self._http is None:
            raise RuntimeError("adapter not started")
        try:
            resp = await self._http.post(self.path_for(req), wire.dumps(self.build_body(req)))
        except EngineHTTPError as exc:
            raise EngineRequestError(0, f"engine unreachable: {exc}") from exc
        if resp.status != 200:
            async with resp:
                try:
                    text = (await resp.read()).decode("utf-8", "replace")
                except EngineHTTPError as exc:
                    text = str(exc)
            raise EngineRequestError(resp.status, _engine_error_message(text))
        return resp

    async def stream(self, req: InferenceRequest) -> AsyncGenerator[EngineEvent, None]:
        """Yield parsed chunks; closing the iterator closes the HTTP stream, which aborts the
        request inside the engine (both vLLM and SGLang abort on client disconnect)."""
        async with await self._open(req) as resp:
            events: list[EngineEvent] = []
            lines = SSELines(req.endpoint == "chat", events.append, self.parse_chunk)
            try:
                # One await per network read, where the body's line iterator costs one per line.
                async for part in resp.iter_chunks():
                    done = lines.feed(part)
                    for event in events:
                        yield event
                    events.clear()
                    if done:
                        return
                lines.end()
                for event in events:
                    yield event
            except EngineHTTPError as exc:
                raise EngineRequestError(0, f"engine stream broke: {exc}") from exc

    def push_relay(self) -> PushRelay | None:
        """:meth:`relay`, unless a subclass reshapes :meth:`stream` (its events must go through it)."""
        return self.relay if type(self).stream is OpenAIEngineAdapter.stream else None

    async def relay(self, req: InferenceRequest, sink: Callable[[EngineEvent], None]) -> None:
        """:meth:`stream`'s events handed to ``sink`` from the connection's reads, returning at the
        stream's end: no task wake-up per chunk (see :meth:`EngineResponse.push_chunks`).
        Cancelling it closes the HTTP stream as closing :meth:`stream` does."""
        async with await self._open(req) as resp:
            lines = SSELines(req.endpoint == "chat", sink, self.parse_chunk)
            try:
                await resp.push_chunks(lines.feed)
            except EngineHTTPError as exc:
                raise EngineRequestError(0, f"engine stream broke: {exc}") from exc
            lines.end()

    @staticmethod
    def parse_chunk(obj: dict[str, Any], at: float, chat: bool) -> EngineEvent | None:
        if "error" in obj and "choices" not in obj:
            err = obj["error"]
            msg = err.get("message", str(err)) if isinstance(err, dict) else str(err)
            raise EngineRequestError(int(err.get("code", 500)) if isinstance(err, dict) else 500, msg)
        event = EngineEvent(at=at)
        usage = obj.get("usage")
        choices = obj.get("choices") or []
        if choices:
            choice = choices[0]
            if chat:
                delta = choice.get("delta") or {}
                event.text = delta.get("content") or ""
                event.tool_calls = delta.get("tool_calls") or None
            else:
                event.text = choice.get("text") or ""
            event.finish_reason = choice.get("finish_reason")
        # With continuous_usage_stats every chunk carries the running usage; only the one that
        # closes the stream (the usage chunk, or the finishing chunk) becomes the attempt's usage,
        # so no model is built per token (stream() takes each chunk's count from the raw dict).
        if usage and (not choices or event.finish_reason is not None):
            details = usage.get("prompt_tokens_details") or {}
            event.usage = Usage(
                prompt_tokens=usage.get("prompt_tokens", 0),
                completion_tokens=usage.get("completion_tokens", 0),
                total_tokens=usage.get("total_tokens", 0),
                cached_tokens=details.get("cached_tokens"),
            )
        if not event.text and event.tool_calls is None and event.finish_reason is None and not usage:
            return None  # e.g. the role-only first chunk
        return event


def _engine_error_message(text: str) -> str:
    try:
        obj = json.loads(text)
    except ValueError:
        return text[:500]
    err = obj.get("error", obj) if isinstance(obj, dict) else obj
    if isinstance(err, dict):
        return str(err.get("message") or err.get("detail") or err)[:500]
    return str(err)[:500]
