"""Parsing and validating OpenAI request bodies (plain dicts, no pydantic on the hot path).

Errors carry vLLM's error shape ``{"error": {"message", "type", "param", "code"}}`` where ``type``
is ``BadRequestError``/``NotFoundError`` and ``code`` the HTTP status, as vLLM sends them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from llmlab_common.messages import Endpoint

from llmlab_engine_sim import textgen

_ERROR_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": _ERROR_TYPES.get(self.status, "BadRequestError"),
                "param": self.param,
                "code": self.status,
            }
        }


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param)


class PromptTokens(Protocol):
    """A real tokenizer's prompt ids (``hf_tokens.HfPromptTokens``), when the simulator has one."""

    def chat(self, messages: Sequence[dict[str, Any]]) -> list[int]: ...

    def text(self, prompt: str) -> list[int]: ...


@dataclass(slots=True)
class ParsedRequest:
    endpoint: Endpoint
    model: str
    prompt_tokens: int
    prompt_key: bytes  # canonical prompt bytes (seeds the generated text)
    max_tokens: int | None  # as requested; None: up to the context limit
    stream: bool = False
    include_usage: bool = False
    continuous_usage: bool = False  # stream_options.continuous_usage_stats: usage on every chunk
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    priority: int = 0
    # continue_final_message: the final assistant message's text, which the output continues
    # (``prompt_key`` is then the conversation before it, so a continuation of the simulator's
    # own output goes on exactly as the uninterrupted answer would have).
    continue_text: str | None = None
    # The prompt's ids by a real tokenizer (``PromptTokens``); None: counted by the simulator's rule.
    prompt_ids: list[int] | None = None


def load_json_object(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise bad_request(f"JSON decode error: {e}") from None
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    return body


def _opt_int(body: dict[str, Any], name: str, minimum: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"{name} must be an integer", name)
    if minimum is not None and value < minimum:
        raise bad_request(f"{name} must be at least {minimum}, got {value}", name)
    return value


def _opt_bool(body: dict[str, Any], name: str) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise bad_request(f"{name} must be a boolean", name)
    return value


def _stop_list(body: dict[str, Any]) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return list(stop)
    raise bad_request("stop must be a string or a list of strings", "stop")


Prompt = tuple[int, bytes, list[int] | None]  # (prompt tokens, canonical key, the real tokenizer's ids or None)


def _completion_prompt(body: dict[str, Any], tokens: PromptTokens | None = None) -> Prompt:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        if tokens is not None:
            ids = tokens.text(prompt)
            return len(ids), textgen.prompt_key(prompt), ids
        return textgen.count_text_tokens(prompt), textgen.prompt_key(prompt), None
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt)
    ):
        return len(prompt), textgen.prompt_key(prompt), list(prompt) if tokens is not None else None
    if prompt is None:
        raise bad_request("prompt is required", "prompt")
    if isinstance(prompt, list) and len(prompt) > 1:
        raise bad_request("batched prompts are not supported by the engine simulator; send one prompt", "prompt")
    raise bad_request("prompt must be a string or a list of token ids", "prompt")


def _chat_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages must be a non-empty list", "messages")
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise bad_request("each message must be an object with a string role", "messages")
    return messages


def _chat_prompt(body: dict[str, Any], tokens: PromptTokens | None = None) -> Prompt:
    messages = _chat_messages(body)
    if tokens is not None:
        ids = tokens.chat(messages)
        return len(ids), textgen.prompt_key(messages), ids
    return textgen.count_chat_tokens(messages), textgen.prompt_key(messages), None


def _continued_chat_prompt(body: dict[str, Any], flavor: str) -> tuple[int, bytes, str]:
    """``continue_final_message``: the final assistant message is rendered open (the assistant
    header, then its text, no end), so the prompt is the conversation before it plus its text."""
    messages = _chat_messages(body)
    generation_prompt = body.get("add_generation_prompt", flavor == "vllm")  # SGLang has no such field
    if not isinstance(generation_prompt, bool):
        raise bad_request("add_generation_prompt must be a boolean", "add_generation_prompt")
    if generation_prompt and flavor == "vllm":
        raise bad_request(
            "Cannot set both `add_generation_prompt` and `continue_final_message` to True.", "continue_final_message"
        )
    final = messages[-1]
    if final.get("role") != "assistant":
        raise bad_request("continue_final_message needs a final assistant message to continue", "messages")
    head, text = messages[:-1], textgen.message_text(final)
    return textgen.count_chat_tokens(head) + textgen.count_text_tokens(text), textgen.prompt_key(head), text


def parse_generation(
    endpoint: Endpoint,
    raw: bytes,
    served_model: str,
    max_model_len: int,
    flavor: str = "vllm",
    tokens: PromptTokens | None = None,
) -> ParsedRequest:
    """Validate a /v1/chat/completions or /v1/completions body; raises :class:`ApiError`. With ``tokens``
    the prompt is counted by that tokenizer (a continued chat keeps the simulator's rule)."""
    body = load_json_object(raw)
    model = body.get("model")
    if model is None:
        model = served_model  # vLLM serves its model when none is named
    elif not isinstance(model, str):
        raise bad_request("model must be a string", "model")
    elif model != served_model:
        raise ApiError(404, f"The model `{model}` does not exist.", param="model")

    continue_text = None
    prompt_ids = None
    if endpoint == "chat" and _opt_bool(body, "continue_final_message"):
        prompt_tokens, key, continue_text = _continued_chat_prompt(body, flavor)
    elif endpoint == "chat":
        prompt_tokens, key, prompt_ids = _chat_prompt(body, tokens)
    else:
        prompt_tokens, key, prompt_ids = _completion_prompt(body, tokens)

    max_tokens = _opt_int(body, "max_tokens", 1)
    if endpoint == "chat":
        max_tokens = _opt_int(body, "max_completion_tokens", 1) or max_tokens
    n = _opt_int(body, "n", 1)
    if n is not None and n > 1:
        raise bad_request("n > 1 is not supported by the engine simulator", "n")

    if prompt_tokens >= max_model_len:
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens. However, your request has "
            f"{prompt_tokens} input tokens. Please reduce the length of the input.",
            "messages" if endpoint == "chat" else "prompt",
        )
    if max_tokens is not None and prompt_tokens + max_tokens > max_model_len:
        raise bad_request(
            f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's maximum "
            f"context length is {max_model_len} tokens and your request has {prompt_tokens} input tokens "
            f"({max_tokens} > {max_model_len} - {prompt_tokens}).",
            "max_tokens",
        )

    stream = _opt_bool(body, "stream")
    include_usage = continuous_usage = False
    stream_options = body.get("stream_options")
    if stream_options is not None:
        if not stream:
            raise bad_request("Stream options can only be defined when `stream=True`.", "stream_options")
        if not isinstance(stream_options, dict):
            raise bad_request("stream_options must be an object", "stream_options")
        include_usage = bool(stream_options.get("include_usage"))
        continuous_usage = bool(stream_options.get("continuous_usage_stats"))

    return ParsedRequest(
        endpoint=endpoint,
        model=model,
        prompt_tokens=prompt_tokens,
        prompt_key=key,
        max_tokens=max_tokens,
        stream=stream,
        include_usage=include_usage,
        continuous_usage=continuous_usage,
        stop=_stop_list(body),
        seed=_opt_int(body, "seed"),
        ignore_eos=_opt_bool(body, "ignore_eos"),
        min_tokens=_opt_int(body, "min_tokens", 0) or 0,
        priority=_opt_int(body, "priority") or 0,
        continue_text=continue_text,
        prompt_ids=prompt_ids,
    )


def parse_tokenize(raw: bytes, served_model: str) -> tuple[list[int], bool]:
    """A vLLM ``/tokenize`` body → (token ids, was chat)."""
    body = load_json_object(raw)
    model = body.get("model")
    if model is not None and model != served_model:
        raise ApiError(404, f"The model `{model}` does not exist.", param="model")
    if "messages" in body:
        _chat_prompt(body)
        return textgen.tokenize_chat(body["messages"]), True
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise bad_request("prompt (a string) or messages is required", "prompt")
    return textgen.tokenize_text(prompt), False
