"""Prompt token ids as the real engine counts them (adapter): a Hugging Face tokenizer directory's
``tokenizer.json`` and the model's chat template, rendered the way vLLM renders it (the template over
the messages with the generation prompt, then encoded without extra special tokens). With it the
twin sees the prompt lengths and prefix blocks the real engine would, instead of the simulator's own
counting rule (:mod:`llmlab_engine_sim.textgen`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from llmlab_engine_sim.textgen import message_text


class HfPromptTokens:
    def __init__(self, directory: Path) -> None:
        # Imported here: only a simulator started with a tokenizer needs them.
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(str(directory / "tokenizer.json"))
        config = directory / "tokenizer_config.json"
        settings: dict[str, Any] = json.loads(config.read_text()) if config.exists() else {}
        template_file = directory / "chat_template.jinja"
        template = template_file.read_text() if template_file.exists() else settings.get("chat_template")
        if not isinstance(template, str) or not template:
            raise ValueError(f"{directory} has no chat template (chat_template.jinja or tokenizer_config.json)")
        # As transformers renders chat templates: sandboxed, trim_blocks and lstrip_blocks.
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        self._template = env.from_string(template)
        self._specials = {k: _token_text(settings.get(k)) for k in ("bos_token", "eos_token")}

    def chat(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        plain = [{"role": str(m.get("role", "")), "content": message_text(m)} for m in messages]
        text = self._template.render(messages=plain, add_generation_prompt=True, **self._specials)
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def text(self, prompt: str) -> list[int]:
        return list(self._tok.encode(prompt).ids)


def _token_text(value: Any) -> str:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken object."""
    if isinstance(value, dict):
        return str(value.get("content", ""))
    return value if isinstance(value, str) else ""
