from __future__ import annotations

import pytest
from llmlab_common.errors import invalid_request
from llmlab_gateway.schemas import ChatCompletionRequest, CompletionRequest
from pydantic import ValidationError

pytestmark = pytest.mark.unit
MSG = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": MSG}, "model"),
        ({"model": "m"}, "messages"),
        ({"model": "m", "messages": []}, "messages"),
        ({"model": "m", "messages": MSG, "n": 2}, "n"),
        ({"model": "m", "messages": MSG, "temperature": 3}, "temperature"),
        ({"model": "m", "messages": MSG, "max_tokens": 0}, "max_tokens"),
        ({"model": "m", "messages": [{"role": "robot", "content": "x"}]}, "messages.0.role"),
        ({"model": "m", "messages": MSG, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
        # Input bounds: each one past its limit (values derived here, not from the module).
        ({"model": "m", "messages": MSG * 2049}, "messages"),
        ({"model": "m", "messages": MSG, "stop": "x" * 1025}, "stop"),
        ({"model": "m", "messages": MSG, "stop": ["ok", "x" * 1025]}, "stop"),
        ({"model": "m", "messages": MSG, "logit_bias": {str(i): 1.0 for i in range(301)}}, "logit_bias"),
        ({"model": "m", "messages": MSG, "logit_bias": {"50256": 101.0}}, "logit_bias"),
        ({"model": "m", "messages": MSG, "tools": [{"type": "function"}] * 129}, "tools"),
        ({"model": "m", "messages": MSG, "max_tokens": 10**30}, "max_tokens"),
        ({"model": "m", "messages": MSG, "max_completion_tokens": 2**21}, "max_completion_tokens"),
        ({"model": "m", "messages": MSG, "seed": 2**53 + 1}, "seed"),
        ({"model": "m" * 257, "messages": MSG}, "model"),
    ],
)
def test_invalid_chat_bodies_name_the_param(body: dict[str, object], param: str) -> None:
    with pytest.raises(ValidationError) as exc:
        ChatCompletionRequest.model_validate(body)
    err = invalid_request(exc.value.errors())
    assert err.status == 400 and err.param is not None and err.param.startswith(param)


def test_n_greater_than_one_says_why() -> None:
    with pytest.raises(ValidationError) as exc:
        ChatCompletionRequest.model_validate({"model": "m", "messages": MSG, "n": 3})
    assert "only n=1" in invalid_request(exc.value.errors()).message


def test_max_completion_tokens_wins_and_unknown_fields_are_ignored() -> None:
    r = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": MSG, "max_tokens": 5, "max_completion_tokens": 7, "store": True}
    )
    assert r.requested_max_tokens() == 7


def test_completion_prompt_forms() -> None:
    assert CompletionRequest.model_validate({"model": "m", "prompt": ["x"]}).prompt_text() == "x"
    with pytest.raises(ValidationError):
        CompletionRequest.model_validate({"model": "m", "prompt": ["x", "y"]})


def test_bounds_admit_what_openai_admits() -> None:
    """The bounds refuse only past OpenAI's own limits: 128 tools, 4 stops, bias of +-100."""
    ChatCompletionRequest.model_validate(
        {
            "model": "m",
            "messages": MSG * 2048,
            "tools": [{"type": "function"}] * 128,
            "stop": ["a", "b", "c", "x" * 1024],
            "logit_bias": {str(i): -100.0 if i % 2 else 100.0 for i in range(300)},
            "max_tokens": 2**20,
            "seed": -(2**53),
        }
    )


def test_json_depth() -> None:
    from llmlab_gateway.schemas import json_depth_exceeds

    def nested(depth: int) -> object:
        v: object = 1
        for i in range(depth):
            v = [v] if i % 2 else {"k": v}
        return v

    assert not json_depth_exceeds(nested(32))
    assert json_depth_exceeds(nested(33))
    assert json_depth_exceeds(nested(100_000))  # iterative: no RecursionError of its own
    assert not json_depth_exceeds({"a": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["})
