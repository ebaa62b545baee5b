"""OpenAI request bodies as pydantic models: validation errors become 400s naming the param.
Unknown fields are accepted and ignored, as OpenAI-compatible servers commonly do. Types are
strict, as OpenAI's API and the JSON schema the gateway documents (its OpenAPI request bodies are
these models' schemas): ``"stream": "yes"`` or ``"max_tokens": "5"`` is a 400, not coerced; an
integer is a valid number."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from llmlab_common.jsontypes import Integral
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# Input bounds (OpenAI's where it documents one: 128 tools, 4 stop sequences, logit_bias values in
# [-100, 100]): a request past one is a 400 naming the parameter, never work for a worker, an
# integer that overflows a 64-bit column downstream, or a 500.
MAX_MESSAGES = 2048
MAX_STOP_CHARS = 1024
MAX_LOGIT_BIAS = 300
MAX_TOOLS = 128
MAX_TOKENS = 1 << 20  # past any context window the catalog can name
MAX_JSON_DEPTH = 32  # the bodies OpenAI's API describes nest at most ~10 levels (tools' JSON schemas more)
# Seeds within +-2^53: exact as a JSON number in any parser (a float past it is not an exact
# integer), and inside the engines' int64.
SEED_RANGE = (-(1 << 53), 1 << 53)


JsonInt = Annotated[int, Integral]
# Bounds inside the type: on the optional field pydantic would leave them out of the JSON schema.
TokenCount = Annotated[int, Field(ge=1, le=MAX_TOKENS), Integral]
Seed = Annotated[int, Field(ge=SEED_RANGE[0], le=SEED_RANGE[1]), Integral]


def json_depth_exceeds(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether a parsed JSON value nests objects/arrays deeper than ``limit`` (iterative: a
    recursive walk would itself overflow on the bodies it is meant to refuse)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, dict):
            children: Any = v.values()
        elif isinstance(v, list):
            children = v
        else:
            continue
        if depth > limit:
            return True
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return False


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    include_usage: bool = False


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class _Common(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    model: str = Field(min_length=1, max_length=256)
    max_tokens: TokenCount | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    # The validators below give the clear message; the schema says the same (for generated
    # clients and fuzzers: the documented schema is exactly what is accepted).
    n: JsonInt = Field(default=1, json_schema_extra={"minimum": 1, "maximum": 1})
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = Field(
        default=None,
        json_schema_extra={"maxLength": MAX_STOP_CHARS, "maxItems": 4, "items": {"maxLength": MAX_STOP_CHARS}},
    )
    seed: Seed | None = None
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = Field(
        default=None,
        max_length=MAX_LOGIT_BIAS,
        json_schema_extra={"additionalProperties": {"type": "number", "minimum": -100, "maximum": 100}},
    )
    user: str | None = Field(default=None, max_length=256)

    @field_validator("n")
    @classmethod
    def _only_one(cls, v: int) -> int:
        if v != 1:
            raise ValueError("only n=1 is supported; send several requests for several choices")
        return v

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, v: str | list[str] | None) -> str | list[str] | None:
        if isinstance(v, list) and len(v) > 4:
            raise ValueError("at most 4 stop sequences")
        if any(len(x) > MAX_STOP_CHARS for x in ([v] if isinstance(v, str) else v or [])):
            raise ValueError(f"a stop sequence is at most {MAX_STOP_CHARS} characters")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _bias_range(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        if v and any(not -100 <= b <= 100 for b in v.values()):
            raise ValueError("logit_bias values are between -100 and 100")
        return v

    def stop_list(self) -> list[str] | None:
        if self.stop is None:
            return None
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class ChatCompletionRequest(_Common):
    # A tool_choice that names a tool needs tools (the validator below), as a schema says it.
    model_config = ConfigDict(
        json_schema_extra={
            "if": {"properties": {"tool_choice": {"type": "object"}}, "required": ["tool_choice"]},
            "then": {"required": ["tools"], "properties": {"tools": {"type": "array", "minItems": 1}}},
        }
    )
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_completion_tokens: TokenCount | None = None
    tools: list[dict[str, Any]] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None

    @model_validator(mode="after")
    def _tool_choice_needs_tools(self) -> ChatCompletionRequest:
        if isinstance(self.tool_choice, dict) and not self.tools:
            raise ValueError("tool_choice names a tool but no tools were given")
        return self

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(_Common):
    prompt: str | list[str] = Field(json_schema_extra={"minItems": 1, "maxItems": 1})

    @field_validator("prompt")
    @classmethod
    def _single_prompt(cls, v: str | list[str]) -> str | list[str]:
        if isinstance(v, list) and len(v) != 1:
            raise ValueError("exactly one prompt per request is supported")
        return v

    def prompt_text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens
