"""The official openai SDK through the whole stack: gateway → NATS → worker → simulator, both flavours."""

from __future__ import annotations

import httpx
import pytest
from llmlab_testkit.e2e import LLAMA, QWEN, client
from llmlab_testkit.procs import Stack, url

pytestmark = pytest.mark.e2e


@pytest.fixture
def both_flavours(stack: Stack) -> Stack:
    sv = stack.sim("vllm", LLAMA, ttft_ms=30, itl_ms=5, output_len=24)
    ss = stack.sim("sglang", QWEN, ttft_ms=30, itl_ms=5, output_len=24)
    stack.worker("vllm", "gpu-vllm", url(sv))
    stack.worker("sglang", "gpu-sglang", url(ss))
    stack.gateway()
    return stack


@pytest.mark.parametrize("model", [LLAMA, QWEN])
async def test_chat_streaming_and_unary(both_flavours: Stack, model: str) -> None:
    gw = both_flavours.procs[-1]
    c = client(gw)
    # unary, cut by max_tokens → length
    r = await c.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Hello there"}], max_tokens=10
    )
    assert r.id.startswith("chatcmpl-") and r.object == "chat.completion" and r.model == model
    assert r.choices[0].finish_reason == "length"
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content
    assert r.usage is not None and r.usage.completion_tokens == 10
    assert r.usage.prompt_tokens > 0 and r.usage.total_tokens == r.usage.prompt_tokens + 10

    # streamed, the engine stops by itself (output_len 24 < max_tokens) → stop, usage last
    stream = await c.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Hello there"}],
        max_tokens=100,
        stream=True,
        stream_options={"include_usage": True},
    )
    roles, parts, finishes, usages, ids = [], [], [], [], set()
    async for ch in stream:
        ids.add(ch.id)
        if ch.usage is not None:
            assert ch.choices == []
            usages.append(ch.usage)
            continue
        d = ch.choices[0].delta
        if d.role:
            roles.append(d.role)
        if d.content:
            parts.append(d.content)
        if ch.choices[0].finish_reason:
            finishes.append(ch.choices[0].finish_reason)
    assert roles == ["assistant"] and len(ids) == 1
    assert finishes == ["stop"]
    assert len(usages) == 1 and usages[0].completion_tokens == 24
    assert len(parts) >= 2 and "".join(parts).strip()


@pytest.mark.parametrize("model", [LLAMA, QWEN])
async def test_completions_streaming_and_unary(both_flavours: Stack, model: str) -> None:
    c = client(both_flavours.procs[-1])
    r = await c.completions.create(model=model, prompt="Once upon a time", max_tokens=5)
    assert r.object == "text_completion" and r.choices[0].finish_reason == "length"
    assert r.usage is not None and r.usage.completion_tokens == 5 and r.choices[0].text
    stream = await c.completions.create(model=model, prompt="Once upon a time", max_tokens=7, stream=True)
    texts, finish = [], None
    async for ch in stream:
        texts.append(ch.choices[0].text)
        finish = ch.choices[0].finish_reason or finish
    assert finish == "length" and "".join(texts).strip()


async def test_request_id_header_models_list_and_aliases(both_flavours: Stack) -> None:
    gw = both_flavours.procs[-1]
    c = client(gw)
    raw = await c.chat.completions.with_raw_response.create(
        model="auto", messages=[{"role": "user", "content": "hi"}], max_tokens=3
    )
    assert len(raw.headers["x-request-id"]) >= 16
    assert raw.parse().model == LLAMA  # alias resolved through the catalog
    models = await c.models.list()
    assert {LLAMA, QWEN} <= {m.id for m in models.data}
    # curl-style raw SSE ends with [DONE]
    async with httpx.AsyncClient() as h:
        body = (
            await h.post(
                url(gw) + "/v1/chat/completions",
                headers={"Authorization": "Bearer sk-llmlab-dev"},
                json={"model": QWEN, "messages": [{"role": "user", "content": "x"}], "max_tokens": 3, "stream": True},
                timeout=30,
            )
        ).text
    assert body.rstrip().endswith("data: [DONE]")
