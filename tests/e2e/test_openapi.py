"""The gateway's OpenAPI document against its fast path: the request bodies it documents are the
ones a live gateway accepts. Each body is judged twice, independently: by the JSON schema in the
live /openapi.json (jsonschema) and by the live gateway's answer (400 = refused). They must agree,
except for the rules the routes document as beyond the schema."""

from __future__ import annotations

from typing import Any

import httpx
import jsonschema
import pytest
from llmlab_testkit.e2e import LLAMA
from llmlab_testkit.fixtures import DEV_KEY
from llmlab_testkit.procs import Stack, url

pytestmark = pytest.mark.e2e
HI = [{"role": "user", "content": "hi"}]

CHAT_BAD: list[dict[str, Any]] = [
    {"model": LLAMA},  # no messages
    {"model": LLAMA, "messages": "hi"},
    {"model": LLAMA, "messages": [{"role": "robot", "content": "hi"}]},
    {"model": LLAMA, "messages": [{"content": "hi"}]},  # no role
    {"model": "", "messages": HI},
    {"messages": HI},  # no model
    {"model": LLAMA, "messages": HI, "max_tokens": 0},
    {"model": LLAMA, "messages": HI, "max_completion_tokens": -3},
    {"model": LLAMA, "messages": HI, "temperature": 2.5},
    {"model": LLAMA, "messages": HI, "top_p": 0},
    {"model": LLAMA, "messages": HI, "presence_penalty": -3},
    {"model": LLAMA, "messages": HI, "stream": "yes"},
    {"model": LLAMA, "messages": HI, "stop": 7},
    {"model": LLAMA, "messages": HI, "logit_bias": {"1": "a lot"}},
    {"model": LLAMA, "messages": HI, "user": "u" * 300},
    {"model": LLAMA, "messages": HI, "tools": "all of them"},
    # Rules the schema now states too (they were "beyond the schema" on dd4f538's successor).
    {"model": LLAMA, "messages": HI, "n": 2},
    {"model": LLAMA, "messages": HI, "stop": ["a", "b", "c", "d", "e"]},
    {"model": LLAMA, "messages": HI, "tool_choice": {"type": "function", "function": {"name": "f"}}},
    {"model": LLAMA, "messages": HI, "logit_bias": {"1": 101}},
    {"model": LLAMA, "messages": HI, "seed": 2**60},
]
CHAT_GOOD: list[dict[str, Any]] = [
    {"model": LLAMA, "messages": HI},
    {"model": LLAMA, "messages": HI, "max_tokens": 3, "temperature": 0, "top_p": 1, "stream": True},
    {"model": LLAMA, "messages": HI, "stop": ["a", "b"], "seed": 3, "unknown_field": 1},
    {"model": LLAMA, "messages": HI, "max_tokens": 3.0, "n": 1},  # JSON Schema's integer includes 3.0
]
COMPLETION_BAD: list[dict[str, Any]] = [
    {"model": LLAMA},
    {"model": LLAMA, "prompt": 5},
    {"model": LLAMA, "prompt": "hi", "max_tokens": 0},
    {"model": LLAMA, "prompt": ["a", "b"]},
]
COMPLETION_GOOD: list[dict[str, Any]] = [{"model": LLAMA, "prompt": "hi", "max_tokens": 2}]
# Refused by the handler, accepted by the JSON schema (the routes' description says so): nesting
# past 32 levels, which a JSON schema cannot bound.
DEEP: dict[str, Any] = {"model": LLAMA, "prompt": "hi"}
_node: dict[str, Any] = DEEP
for _ in range(40):
    _node["x"] = {}
    _node = _node["x"]
CHAT_BEYOND_SCHEMA: list[dict[str, Any]] = [{"model": LLAMA, "messages": HI, "metadata": DEEP}]
COMPLETION_BEYOND_SCHEMA: list[dict[str, Any]] = [DEEP]


async def test_the_documented_request_bodies_are_the_ones_the_gateway_accepts(stack: Stack) -> None:
    """Catches: an OpenAPI document that describes no request body or another one than the fast
    path validates (a field constraint on one side only), and completion routes documented for
    handlers that never run."""
    stack.worker("vllm", "gpu-vllm", url(stack.sim("vllm", LLAMA, ttft_ms=5, itl_ms=1, output_len=2)))
    gw = stack.gateway()
    async with httpx.AsyncClient(base_url=url(gw), timeout=30) as h:
        doc = (await h.get("/openapi.json")).json()

        async def judged(path: str, bodies: list[dict[str, Any]]) -> list[tuple[bool, bool]]:
            op = doc["paths"][path]["post"]
            schema = op["requestBody"]["content"]["application/json"]["schema"]
            out = []
            for body in bodies:
                documented = jsonschema.Draft202012Validator(schema).is_valid(body)
                r = await h.post(path, json=body, headers={"Authorization": f"Bearer {DEV_KEY}"})
                assert r.status_code in (200, 400), (body, r.status_code, r.text)
                if r.status_code == 400:
                    assert r.json()["error"]["type"] == "invalid_request_error", r.text
                out.append((documented, r.status_code == 200))
            return out

        for path, bad, good, beyond in [
            ("/v1/chat/completions", CHAT_BAD, CHAT_GOOD, CHAT_BEYOND_SCHEMA),
            ("/v1/completions", COMPLETION_BAD, COMPLETION_GOOD, COMPLETION_BEYOND_SCHEMA),
        ]:
            assert await judged(path, bad) == [(False, False)] * len(bad), path
            assert await judged(path, good) == [(True, True)] * len(good), path
            assert await judged(path, beyond) == [(True, False)] * len(beyond), path
            assert "Besides the schema" in doc["paths"][path]["post"]["description"]
