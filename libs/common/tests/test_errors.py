"""The one error surface: complete, immutable errors in OpenAI's shape, rebuilt by status after a
NATS hop, and one call that makes a web app answer every error that way."""

from __future__ import annotations

import httpx
import pytest
from fastapi import FastAPI
from llmlab_common.codes import Code
from llmlab_common.errors import (
    EngineError,
    HttpError,
    InsufficientQuota,
    InvalidRequest,
    LLMLabError,
    ModelNotFound,
    RateLimited,
    Unprocessable,
    error_from_info,
    invalid_request,
)
from llmlab_common.http import install_error_handlers
from pydantic import BaseModel, ConfigDict, ValidationError

pytestmark = pytest.mark.unit


def test_errors_are_complete_at_construction_and_immutable() -> None:
    err = EngineError("lost", code=Code.WORKER_LOST, retryable=True)
    assert (err.status, err.type, err.code, err.retryable) == (502, "server_error", "worker_lost", True)
    with pytest.raises(AttributeError, match="immutable"):
        err.status = 405  # type: ignore[misc]
    with pytest.raises(AttributeError):
        err.retryable = False
    with pytest.raises(TypeError):
        err.headers["X"] = "y"  # type: ignore[index]
    err.add_note("Python may still annotate it")  # dunder attributes stay writable
    assert RateLimited("busy", retry_after_s=2.4).headers["Retry-After"] == "2"


@pytest.mark.parametrize(
    "err",
    [
        InvalidRequest("bad", code=Code.INVALID_VALUE, param="x"),
        ModelNotFound("no such model"),
        Unprocessable("no route"),
        RateLimited("slow down", retry_after_s=7, code=Code.QUEUE_TIMEOUT),
        InsufficientQuota("spent", retry_after_s=60),
        EngineError("boom", code=Code.ENGINE_ERROR),
        HttpError(418, "teapot"),
        LLMLabError("internal"),
    ],
)
def test_an_error_survives_a_nats_hop(err: LLMLabError) -> None:
    back = error_from_info(err.to_info(), getattr(err, "retry_after_s", None), retryable=True)
    assert type(back) is type(err) and back.to_openai()["error"] | {"param": None} == err.to_openai()["error"] | {
        "param": None
    }
    assert back.status == err.status and back.retryable and dict(back.headers) == dict(err.headers)


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    limit: int | None = None
    items: list[int] = []


@pytest.mark.parametrize(
    ("payload", "code", "param"),
    [
        ({}, "missing_required_parameter", "name"),
        ({"name": "n", "bogus": 1}, "unknown_parameter", "bogus"),
        ({"name": "n", "limit": "many"}, "invalid_value", "limit"),  # a union: both members fail
        ({"name": "n", "items": [1, "x"]}, "invalid_value", "items.1"),
    ],
)
def test_validation_errors_name_the_parameter(payload: dict[str, object], code: str, param: str) -> None:
    with pytest.raises(ValidationError) as exc:
        _Body.model_validate(payload)
    err = invalid_request(exc.value.errors())
    assert (err.status, err.code, err.param) == (400, code, param) and f"'{param}'" in err.message


async def test_one_call_answers_every_error_of_an_app_in_openai_shape() -> None:
    app = FastAPI()
    install_error_handlers(app, "test service", request_ids=True)

    @app.get("/limited")
    async def limited() -> None:
        raise RateLimited("slow down", retry_after_s=3)

    @app.get("/crash")
    async def crash() -> None:
        raise ValueError("a bug")

    @app.post("/things")
    async def things(body: _Body) -> dict[str, str]:
        return {"name": body.name}

    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        answers = {
            "limited": await c.get("/limited"),
            "crash": await c.get("/crash"),
            "bad body": await c.post("/things", json={"limit": 1}),
            "not json": await c.post("/things", content=b"{", headers={"content-type": "application/json"}),
            "unknown path": await c.get("/nowhere"),
            "wrong method": await c.delete("/things"),
        }
    expected = {
        "limited": (429, "rate_limit_exceeded"),
        "crash": (500, "internal_error"),
        "bad body": (400, "missing_required_parameter"),
        "not json": (400, "invalid_json"),
        "unknown path": (404, "not_found"),
        "wrong method": (405, "method_not_allowed"),
    }
    for name, r in answers.items():
        body = r.json()
        assert (r.status_code, body["error"]["code"]) == expected[name], name
        assert set(body["error"]) == {"message", "type", "param", "code"} and r.headers["x-request-id"], name
    assert answers["limited"].headers["retry-after"] == "3"
    assert "test service" in answers["crash"].json()["error"]["message"]
    assert answers["wrong method"].headers["allow"] == "POST"
