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
