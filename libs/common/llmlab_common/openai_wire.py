"""OpenAI wire format: response objects, stream chunks and SSE framing.

Used by the gateway (what clients see) and the engine simulator (what vLLM/SGLang emit), so
both speak exactly the same dialect; parsing helpers are used by the workers.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from llmlab_common.messages import Endpoint, Usage

SSE_DONE = b"data: [DONE]\n\n"


def dumps(obj: Any) -> bytes:
    """Compact JSON: orjson (a twentieth of json.dumps's time for a chunk), or json.dumps for what
    orjson refuses (a lone surrogate in a text)."""
    try:
        return orjson.dumps(obj)
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        return json.dumps(obj, separators=(",", ":")).encode()


def sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + dumps(obj) + b"\n\n"


def object_id(endpoint: Endpoint, request_id: str) -> str:
    return f"chatcmpl-{request_id}" if endpoint == "chat" else f"cmpl-{request_id}"


def usage_dict(usage: Usage) -> dict[str, Any]:
    out: dict[str, Any] = {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }
    if usage.cached_tokens is not None:
        out["prompt_tokens_details"] = {"cached_tokens": usage.cached_tokens}
    return out


def chunk(
    endpoint: Endpoint,
    oid: str,
    created: int,
    model: str,
    *,
    text: str | None = None,
    role: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    finish_reason: str | None = None,
    usage: Usage | None = None,
    include_usage_field: bool = False,
) -> dict[str, Any]:
    """One streamed chunk. ``usage`` given → the usage-only chunk (``choices: []``), as OpenAI sends
    last when ``stream_options.include_usage`` is set (every other chunk then has ``usage: null``)."""
    obj: dict[str, Any] = {
        "id": oid,
        "object": "chat.completion.chunk" if endpoint == "chat" else "text_completion",
        "created": created,
        "model": model,
    }
    if usage is not None:
        obj["choices"] = []
        obj["usage"] = usage_dict(usage)
        return obj
    if endpoint == "chat":
        delta: dict[str, Any] = {}
        if role is not None:
            delta["role"] = role
        if text is not None:
            delta["content"] = text
        if tool_calls:
            delta["tool_calls"] = tool_calls
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
    obj["choices"] = [choice]
    if include_usage_field:
        obj["usage"] = None
    return obj


def completion(
    endpoint: Endpoint,
    oid: str,
    created: int,
    model: str,
    *,
    text: str,
    finish_reason: str,
    usage: Usage,
    tool_calls: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A whole (non-streamed) response object."""
    if endpoint == "chat":
        message: dict[str, Any] = {"role": "assistant", "content": text if text or not tool_calls else None}
        if tool_calls:
            message["tool_calls"] = tool_calls
        choices: list[dict[str, Any]] = [
            {"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}
        ]
        obj_type = "chat.completion"
    else:
        choices = [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}]
        obj_type = "text_completion"
    return {
        "id": oid,
        "object": obj_type,
        "created": created,
        "model": model,
        "choices": choices,
        "usage": usage_dict(usage),
    }


def merge_tool_call_deltas(acc: list[dict[str, Any]], deltas: list[dict[str, Any]]) -> None:
    """Fold streamed tool-call deltas (by index) into whole tool calls, for non-streamed answers."""
    for d in deltas:
        idx = d.get("index", 0)
        while len(acc) <= idx:
            acc.append({"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
        tgt = acc[idx]
        if d.get("id"):
            tgt["id"] = d["id"]
        fn = d.get("function") or {}
        if fn.get("name"):
            tgt["function"]["name"] += fn["name"]
        if fn.get("arguments"):
            tgt["function"]["arguments"] += fn["arguments"]


class ContentChunkEncoder:
    """SSE frames of plain content chunks for one stream, serialised once: each token then costs
    one dump of its text instead of building and dumping the whole chunk object."""

    _MARK = "\x00llmlab-text\x00"

    def __init__(self, endpoint: Endpoint, oid: str, created: int, model: str, include_usage_field: bool) -> None:
        template = sse(chunk(endpoint, oid, created, model, text=self._MARK, include_usage_field=include_usage_field))
        marker = dumps(self._MARK)
        self.prefix, _, self.suffix = template.partition(marker)

    def encode(self, text: str) -> bytes:
        return self.prefix + dumps(text) + self.suffix
