"""vLLM inside the worker process (``LLMLAB_WORKER_ENGINE_MODE=inproc``), as Dynamo's vLLM worker
runs it: the worker owns vLLM's ``AsyncLLM`` and takes each request's output as Python objects.
That removes the HTTP/SSE hop to an API server, its JSON in both directions and the API server
process itself; the engine core still runs in its own process (vLLM spawns it).

What the OpenAI server would do for a request is done here the same way: the chat template, the
model's generation-config defaults under the request's sampling fields, the max_tokens clamp to
the context. Tool calling and ``response_format`` need the server's parsers and are refused (400)
with a pointer to the HTTP mode. vLLM is imported only when this adapter starts: it lives in the
engine's own environment (see ``scripts/setup-vllm-cpu.sh``), not in the services' one.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import AsyncGenerator, Iterable
from typing import TYPE_CHECKING, Any, ClassVar

from llmlab_common.messages import EngineLoad, InferenceRequest, Usage
from llmlab_common.metrics import parse_prometheus_text
from llmlab_worker.engine import EngineEvent, EngineRequestError, continued_chat, continued_prompt
from prometheus_client import REGISTRY
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from llmlab_worker_vllm.adapter import VllmAdapter

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

log = logging.getLogger(__name__)

# Sampling fields passed through as the OpenAI server passes them; None means "the model's default".
_PASSED = ("temperature", "top_p", "seed", "presence_penalty", "frequency_penalty", "stop")


def unsupported(req: InferenceRequest) -> str | None:
    """Why the in-process engine cannot serve ``req`` as the OpenAI server would, or None."""
    p = req.params
    if p.tools or (p.tool_choice not in (None, "none")):
        return "tool calling needs the OpenAI server's tool parser: serve this deployment in HTTP mode"
    if p.response_format and p.response_format.get("type", "text") != "text":
        return "response_format needs the OpenAI server's structured outputs: serve this deployment in HTTP mode"
    return None


def sampling_fields(
    req: InferenceRequest, defaults: dict[str, Any], prompt_len: int, max_model_len: int
) -> dict[str, Any]:
    """vLLM ``SamplingParams`` keyword arguments for ``req``: the model's generation-config
    defaults, then the request's fields, then max_tokens clamped to what the context leaves
    (as the OpenAI server does). Raises :class:`EngineRequestError` (400) when the prompt alone
    fills the context."""
    if prompt_len >= max_model_len:
        raise EngineRequestError(
            400,
            f"This model's maximum context length is {max_model_len} tokens; the prompt has {prompt_len} tokens.",
        )
    p = req.params
    out: dict[str, Any] = dict(defaults)
    for name in _PASSED:
        value = getattr(p, name)
        if value is not None:
            out[name] = value
    if p.logit_bias:
        try:
            out["logit_bias"] = {int(k): float(v) for k, v in p.logit_bias.items()}
        except ValueError as exc:
            raise EngineRequestError(400, f"logit_bias keys must be token ids: {exc}") from exc
    out["max_tokens"] = max(1, min(p.max_tokens, max_model_len - prompt_len))
    return out


def _text_content(content: Any) -> Any:
    # OpenAI content parts: the text ones, joined (this engine takes no images here).
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content


class EngineMetrics(Collector):
    """vLLM's metrics (``vllm:*``), registered by the engine in the process-wide registry, on the
    worker's /metrics (with no API server, nothing else exposes them)."""

    def collect(self) -> Iterable[Metric]:
        for metric in REGISTRY.collect():
            if metric.name.startswith("vllm:"):
                yield metric


class InProcessVllmAdapter(VllmAdapter):
    """The worker's engine adapter over an in-process ``AsyncLLM``. Health, load and metric names
    are vLLM's own (read from the engine and its registry, not over HTTP)."""

    engine: ClassVar[str] = "vllm"

    def __init__(self, model: str, served_name: str, engine_args: dict[str, Any], max_concurrency: int) -> None:
        super().__init__("inproc://" + served_name, max_concurrency)
        self.model = model
        self.served_name = served_name
        self.engine_args = engine_args
        self._llm: AsyncLLM | None = None
        self._tokenizer: Any = None
        self._defaults: dict[str, Any] = {}
        self._max_model_len = 0

    @property
    def llm(self) -> AsyncLLM:
        if self._llm is None:
            raise RuntimeError("adapter not started")
        return self._llm

    async def start(self) -> None:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        started = time.monotonic()
        args = AsyncEngineArgs(model=self.model, served_model_name=[self.served_name], **self.engine_args)
        # Blocks while the engine core loads the weights: the worker serves nothing before it is up.
        self._llm = AsyncLLM.from_engine_args(args)
        self._tokenizer = self._llm.get_tokenizer()
        self._defaults = self._llm.model_config.get_diff_sampling_param()
        self._max_model_len = self._llm.model_config.max_model_len
        log.info(
            "in-process vLLM engine up in %.1fs (model %s, context %d, defaults %s)",
            time.monotonic() - started,
            self.served_name,
            self._max_model_len,
            self._defaults,
        )

    async def close(self) -> None:
        if self._llm is not None:
            self._llm.shutdown()
            self._llm = None

    def collectors(self) -> list[Collector]:
        return [EngineMetrics()]

    async def healthy(self) -> bool:
        if self._llm is None or self._llm.errored:
            return False
        try:
            await self._llm.check_health()
        except Exception:
            return False
        return True

    async def load(self) -> EngineLoad:
        return self.load_from_metrics(parse_prometheus_text(generate_latest(REGISTRY).decode()))

    def prompt_ids(self, req: InferenceRequest) -> list[int]:
        tok = self._tokenizer
        if req.endpoint == "chat":
            # A resumed stream: the engine continues the delivered text as the final assistant
            # message (as the OpenAI server's continue_final_message does).
            resume = req.resume is not None
            conversation = continued_chat(req) if resume else req.messages or []
            messages = [{**m, "content": _text_content(m.get("content"))} for m in conversation]
            text = tok.apply_chat_template(
                messages, add_generation_prompt=not resume, continue_final_message=resume, tokenize=False
            )
            return list(tok.encode(text, add_special_tokens=False))
        return list(tok.encode(continued_prompt(req) if req.resume is not None else req.prompt or ""))

    async def stream(self, req: InferenceRequest) -> AsyncGenerator[EngineEvent, None]:
        from vllm import SamplingParams
        from vllm.exceptions import VLLMClientError
        from vllm.sampling_params import RequestOutputKind
        from vllm.v1.engine.exceptions import EngineDeadError

        if req.model != self.served_name:
            raise EngineRequestError(404, f"The model `{req.model}` does not exist.")
        why = unsupported(req)
        if why is not None:
            raise EngineRequestError(400, why)
        try:
            ids = self.prompt_ids(req)
            params = SamplingParams(
                **sampling_fields(req, self._defaults, len(ids), self._max_model_len),
                output_kind=RequestOutputKind.DELTA,
            )
        except (ValueError, TypeError) as exc:
            raise EngineRequestError(400, str(exc)[:500]) from exc
        # Unique per run: a redelivered attempt must not collide with one still aborting.
        request_id = f"{req.request_id}-{req.attempt}-{secrets.token_hex(3)}"
        completion = 0
        queue_told = False
        gen = self.llm.generate({"prompt_token_ids": ids}, params, request_id)
        try:
            async for out in gen:
                at = time.monotonic()
                o = out.outputs[0]
                completion += len(o.token_ids)
                # DELTA outputs: the token ids generated since the last one (several when the
                # engine ran ahead of this loop).
                ev = EngineEvent(
                    at=at, text=o.text, finish_reason=o.finish_reason, tokens=len(o.token_ids), engine_counted=True
                )
                stats = out.metrics
                if not queue_told and stats is not None and stats.scheduled_ts:
                    ev.engine_queue_s = max(0.0, stats.scheduled_ts - stats.queued_ts)
                    queue_told = True
                if out.finished:
                    ev.usage = Usage(
                        prompt_tokens=len(ids),
                        completion_tokens=completion,
                        total_tokens=len(ids) + completion,
                        cached_tokens=out.num_cached_tokens,
                    )
                yield ev
        except EngineDeadError as exc:
            raise EngineRequestError(503, f"the in-process engine died: {exc}") from exc
        except (VLLMClientError, ValueError) as exc:
            raise EngineRequestError(400, str(exc)[:500]) from exc
        finally:
            # Closing vLLM's generator aborts the request inside the engine (cancel, timeout, drain).
            await gen.aclose()
