"""Prompt token estimate for budgets, where the model's tokenizer is not at hand.

Method (stated in the README): one token per 3 UTF-8 bytes of text, rounded up, plus 4 tokens
per chat message (role and separators) and 3 per conversation. BPE tokenizers of the catalog's
models average about 4 bytes per token on English and code, so this over-reserves by roughly a
third; the settlement charges the engine's own count. Text that tokenises worse than 3 bytes per
token (long digit runs, some scripts) is under-estimated: the plan's ``reserve_tokens`` margin
absorbs it and the reserved-vs-actual metric shows it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

BYTES_PER_TOKEN = 3
TOKENS_PER_MESSAGE = 4
TOKENS_PER_CONVERSATION = 3


def estimate_text(text: str) -> int:
    n = len(text.encode("utf-8"))
    return -(-n // BYTES_PER_TOKEN)


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # parts: count the text ones; others as their JSON
        return " ".join(
            str(p.get("text", "")) if isinstance(p, dict) and p.get("type") == "text" else json.dumps(p, default=str)
            for p in content
        )
    return json.dumps(content, default=str)


@dataclass(frozen=True, slots=True)
class PromptEstimate:
    text_tokens: int  # messages (system prompt included) or the completion prompt
    tool_tokens: int  # tool definitions and tool calls in the history

    @property
    def total(self) -> int:
        return self.text_tokens + self.tool_tokens


def estimate_chat(messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None) -> PromptEstimate:
    text = TOKENS_PER_CONVERSATION
    tool = 0
    for m in messages:
        text += TOKENS_PER_MESSAGE + estimate_text(_content_text(m.get("content")))
        if m.get("name"):
            text += estimate_text(str(m["name"]))
        if m.get("tool_calls"):
            tool += estimate_text(json.dumps(m["tool_calls"], separators=(",", ":"), default=str))
    if tools:
        tool += estimate_text(json.dumps(list(tools), separators=(",", ":"), default=str))
    return PromptEstimate(text, tool)


def estimate_prompt(prompt: str) -> PromptEstimate:
    return PromptEstimate(estimate_text(prompt), 0)
