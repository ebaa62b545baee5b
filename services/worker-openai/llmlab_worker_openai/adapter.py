"""What differs per local server: how it says it is up, loading or busy, and which model it holds.

Generation is the shared OpenAI path (``OpenAIEngineAdapter.stream``). Each backend reads its own endpoints
and reports ``None`` for what it does not expose (never a guess):

* **llama.cpp** (``llama-server``, or ``xllamacpp``): ``/health`` answers 503 "Loading model" while the model
  loads, 200 once ready; ``/metrics`` (``--metrics``) has ``llamacpp:requests_processing`` and
  ``llamacpp:requests_deferred`` (and ``llamacpp:kv_cache_usage_ratio`` in older builds); without it,
  ``/slots`` counts the busy slots. A final assistant message is continued, not answered (measured on
  xllamacpp 2026.10: no extra field needed), so mid-stream failover works.
* **Ollama**: ``/api/version`` for health; ``/api/ps`` lists the models in memory: a request for a model not
  among them loads it first (a cold start). No load figures (no ``/metrics``).
* **LM Studio**: ``/v1/models`` for health; ``/api/v1/models`` (``loaded_instances``, LM Studio 0.4) or
  ``/api/v0/models`` (``state``: loaded / not-loaded, 0.3.6+) for the model's state. No load figures.
* **openai**: any other OpenAI-compatible server: ``/v1/models`` for health, nothing else.

Model load is timed apart from generation (``llmlab_worker_engine_model_load_seconds``): for llama.cpp from
the first "loading" health answer to the first ready one (as often as the worker polls); for Ollama and LM
Studio the time to the first token of a request whose model was not in memory (the load and that request's
prefill). Connection failures are counted by kind (``llmlab_worker_engine_connect_failures_total``: refused,
timeout, broken mid-stream, other) and named so in the attempt's error and the log.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncGenerator
from typing import Any, ClassVar, Literal

import aiohttp
from llmlab_common.messages import EngineLoad, InferenceRequest
from llmlab_worker.engine import EngineEvent, EngineRequestError, MetricNames, OpenAIEngineAdapter
from llmlab_worker.http1 import EngineStreamBroken
from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

State = Literal["ready", "loading", "down"]
FailureKind = Literal["refused", "timeout", "broken", "other"]
LOAD_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_PROBE_TIMEOUT = aiohttp.ClientTimeout(total=3)


class BackendMetrics:
    """The adapter's own series, added to the worker's /metrics (``collectors``); labels are bounded."""

    def __init__(self) -> None:
        self.loading = Gauge(
            "llmlab_worker_engine_loading", "1 while the engine says it is loading its model", registry=None
        )
        self.model_load = Histogram(
            "llmlab_worker_engine_model_load_seconds",
            "Model load seen by the worker: llama.cpp's loading health answers to ready; Ollama and LM Studio, "
            "a cold request's time to first token",
            ("kind",),
            buckets=LOAD_BUCKETS,
            registry=None,
        )
        self.cold_starts = Counter(
            "llmlab_worker_engine_cold_starts", "Requests that found their model not in memory", registry=None
        )
        self.connect_failures = Counter(
            "llmlab_worker_engine_connect_failures",
            "Engine requests that got no answer, by kind (refused, timeout, broken, other)",
            ("kind",),
            registry=None,
        )

    def collectors(self) -> list[Collector]:
        return [self.loading, self.model_load, self.cold_starts, self.connect_failures]


def failure_kind(exc: BaseException) -> FailureKind:
    """Why the engine gave no answer, from the exception chain of the transport's error."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ConnectionRefusedError):
            return "refused"
        if isinstance(seen, TimeoutError):
            return "timeout"
        if isinstance(seen, EngineStreamBroken):
            return "broken"
        seen = seen.__cause__ or seen.__context__
    return "other"


_KIND_WORDS: dict[FailureKind, str] = {
    "refused": "connection refused",
    "timeout": "connect timed out",
    "broken": "stream broken",
    "other": "unreachable",
}


class LocalServerAdapter(OpenAIEngineAdapter):
    """A server reached over its OpenAI API that is not vLLM or SGLang. Subclasses say how to read its state."""

    engine: ClassVar[str] = "openai"
    health_path: ClassVar[str] = "/v1/models"
    reads_metrics: ClassVar[bool] = False  # a Prometheus /metrics with ``metric_names``; else no load figures
    continue_fields: ClassVar[dict[str, Any] | None] = None  # unknown: a partial answer is not continued

    def __init__(self, base_url: str, max_concurrency: int, connect_timeout_s: float = 5.0) -> None:
        super().__init__(base_url, max_concurrency, connect_timeout_s)
        self.metrics = BackendMetrics()
        self.state: State = "down"
        self._loading_since: float | None = None
        # Models the server holds in memory (None: it does not say); refreshed with the load.
        self.loaded: set[str] | None = None

    def collectors(self) -> list[Collector]:
        return self.metrics.collectors()

    # -- health ----------------------------------------------------------------------------------
    async def probe(self) -> State:
        """The server's state from its health endpoint: 200 ready, 503 loading, anything else down."""
        try:
            async with self.session.get(self.base_url + self.health_path, timeout=_PROBE_TIMEOUT) as resp:
                if resp.status == 200:
                    return "ready"
                return "loading" if resp.status == 503 else "down"
        except (aiohttp.ClientError, TimeoutError):
            return "down"

    async def healthy(self) -> bool:
        self.observe_state(await self.probe(), time.monotonic())
        return self.state == "ready"

    def observe_state(self, state: State, now: float) -> None:
        if state == "loading" and self._loading_since is None:
            self._loading_since = now
            log.info("engine %s is loading its model", self.base_url)
        elif state == "ready" and self._loading_since is not None:
            took = now - self._loading_since
            self.metrics.model_load.labels("startup").observe(took)
            log.info("engine %s loaded its model in %.1f s (as polled)", self.base_url, took)
            self._loading_since = None
        elif state == "down":
            self._loading_since = None
        if state != self.state:
            log.info("engine %s: %s -> %s", self.base_url, self.state, state)
        self.state = state
        self.metrics.loading.set(1 if state == "loading" else 0)

    # -- load ------------------------------------------------------------------------------------
    async def load(self) -> EngineLoad:
        self.loaded = await self.loaded_models()
        if not self.reads_metrics:
            return EngineLoad()
        return await super().load()

    async def loaded_models(self) -> set[str] | None:
        """The models in memory, where the server says; None where it does not."""
        return None

    async def _get_json(self, path: str) -> Any:
        async with self.session.get(self.base_url + path, timeout=_PROBE_TIMEOUT) as resp:
            resp.raise_for_status()
            return await resp.json(content_type=None)

    def is_cold(self, model: str) -> bool:
        return self.loaded is not None and normalize(model) not in self.loaded

    # -- generation ------------------------------------------------------------------------------
    async def stream(self, req: InferenceRequest) -> AsyncGenerator[EngineEvent, None]:
        cold = self.is_cold(req.model)
        t0 = time.monotonic()
        first = True
        try:
            # Closing this stream closes the engine's (the request is aborted there), not only at GC.
            async with contextlib.aclosing(super().stream(req)) as events:
                async for event in events:
                    if first:
                        first = False
                        if cold:
                            took = time.monotonic() - t0
                            self.metrics.cold_starts.inc()
                            self.metrics.model_load.labels("first_request").observe(took)
                            log.info("model %s was not in memory: first token after %.1f s", req.model, took)
                        if self.loaded is not None:
                            self.loaded.add(normalize(req.model))  # in memory now
                    yield event
        except EngineRequestError as exc:
            if exc.status != 0:
                raise
            kind = failure_kind(exc)
            self.metrics.connect_failures.labels(kind).inc()
            log.warning("engine %s: %s (%s)", self.base_url, _KIND_WORDS[kind], exc.message)
            raise EngineRequestError(0, f"{_KIND_WORDS[kind]}: {exc.message}") from exc


def normalize(model: str) -> str:
    """Ollama's default tag: ``llama3`` is ``llama3:latest``."""
    return model if ":" in model or "/" in model else f"{model}:latest"


class LlamaCppAdapter(LocalServerAdapter):
    engine: ClassVar[str] = "llamacpp"
    health_path: ClassVar[str] = "/health"
    reads_metrics: ClassVar[bool] = True
    metric_names: ClassVar[MetricNames] = MetricNames(
        running="llamacpp:requests_processing",
        waiting="llamacpp:requests_deferred",
        kv_cache_usage="llamacpp:kv_cache_usage_ratio",  # older builds only; None where absent
    )
    continue_fields: ClassVar[dict[str, Any] | None] = {}  # a final assistant message is continued as is

    async def load(self) -> EngineLoad:
        try:
            return await super().load()
        except aiohttp.ClientResponseError:
            # No /metrics (started without --metrics): the busy slots, if /slots is on.
            try:
                slots = await self._get_json("/slots")
            except (aiohttp.ClientError, TimeoutError, ValueError):
                return EngineLoad()
            return slots_load(slots)


def slots_load(slots: Any) -> EngineLoad:
    """llama.cpp's ``/slots``: a list of slots, each with ``is_processing``."""
    if not isinstance(slots, list):
        return EngineLoad()
    return EngineLoad(running=float(sum(1 for s in slots if isinstance(s, dict) and s.get("is_processing"))))


class OllamaAdapter(LocalServerAdapter):
    engine: ClassVar[str] = "ollama"
    health_path: ClassVar[str] = "/api/version"

    async def loaded_models(self) -> set[str] | None:
        try:
            return ollama_loaded(await self._get_json("/api/ps"))
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None


def ollama_loaded(ps: Any) -> set[str] | None:
    """Ollama's ``/api/ps``: ``{"models": [{"name": ..., "model": ..., "expires_at": ...}, ...]}``."""
    if not isinstance(ps, dict) or not isinstance(ps.get("models"), list):
        return None
    out: set[str] = set()
    for m in ps["models"]:
        if isinstance(m, dict):
            out.update(normalize(str(m[k])) for k in ("name", "model") if m.get(k))
    return out


class LMStudioAdapter(LocalServerAdapter):
    engine: ClassVar[str] = "lmstudio"
    health_path: ClassVar[str] = "/v1/models"

    async def loaded_models(self) -> set[str] | None:
        for path in ("/api/v1/models", "/api/v0/models"):
            try:
                found = lmstudio_loaded(await self._get_json(path))
            except (aiohttp.ClientError, TimeoutError, ValueError):
                continue
            if found is not None:
                return found
        return None


def lmstudio_loaded(doc: Any) -> set[str] | None:
    """LM Studio's model list: v1 ``{"models": [{"key", "loaded_instances": [...]}]}`` or v0
    ``{"data": [{"id", "state": "loaded" | "not-loaded"}]}``."""
    if not isinstance(doc, dict):
        return None
    if isinstance(doc.get("models"), list):
        return {
            normalize(str(m["key"]))
            for m in doc["models"]
            if isinstance(m, dict) and m.get("key") and m.get("loaded_instances")
        }
    if isinstance(doc.get("data"), list):
        return {
            normalize(str(m["id"]))
            for m in doc["data"]
            if isinstance(m, dict) and m.get("id") and m.get("state") == "loaded"
        }
    return None


ADAPTERS: dict[str, type[LocalServerAdapter]] = {
    "llamacpp": LlamaCppAdapter,
    "ollama": OllamaAdapter,
    "lmstudio": LMStudioAdapter,
    "openai": LocalServerAdapter,
}
