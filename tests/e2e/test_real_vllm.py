"""The official openai SDK through the whole stack to REAL vLLM on this CPU."""

from __future__ import annotations

import httpx
import pytest
from llmlab_testkit.budget import BudgetAdmin
from llmlab_testkit.e2e import client, eventually
from llmlab_testkit.fixtures import DEV_KEY
from llmlab_testkit.procs import Stack, url
from llmlab_testkit.vllm import SERVED_NAME, vllm_gauge

pytestmark = [pytest.mark.e2e, pytest.mark.vllm_cpu]


async def test_sdk_streaming_and_unary_through_the_stack(stack: Stack, vllm_url: str) -> None:
    stack.worker("vllm", "cpu-vllm", vllm_url)
    gw = stack.gateway()
    c = client(gw)
    r = await c.chat.completions.create(
        model=SERVED_NAME, messages=[{"role": "user", "content": "Name a fruit."}], max_tokens=6, temperature=0
    )
    assert r.choices[0].finish_reason == "length" and r.choices[0].message.content
    assert r.usage is not None and r.usage.completion_tokens == 6 and r.usage.prompt_tokens > 5

    stream = await c.chat.completions.create(
        model="cheap",
        messages=[{"role": "user", "content": "Count: 1, 2, 3"}],
        max_tokens=30,
        temperature=0,
        stop=["\n"],
        stream=True,
        stream_options={"include_usage": True},
    )
    parts, finish, usage = [], None, None
    async for ch in stream:
        if ch.usage:
            usage = ch.usage
        elif ch.choices:
            parts.append(ch.choices[0].delta.content or "")
            finish = ch.choices[0].finish_reason or finish
    assert "".join(parts)
    assert finish in ("stop", "length")
    assert usage is not None and 0 < usage.completion_tokens <= 30
    if finish == "stop":
        assert usage.completion_tokens < 30

    comp = await c.completions.create(model=SERVED_NAME, prompt="The capital of France is", max_tokens=4, temperature=0)
    assert comp.choices[0].text and comp.usage is not None and comp.usage.completion_tokens == 4


async def test_client_disconnect_stops_real_vllm(stack: Stack, vllm_url: str) -> None:
    stack.worker("vllm", "cpu-vllm", vllm_url)
    gw = stack.gateway()
    async with (
        httpx.AsyncClient() as h,
        h.stream(
            "POST",
            url(gw) + "/v1/completions",
            headers={"Authorization": f"Bearer {DEV_KEY}"},
            timeout=60,
            json={
                "model": SERVED_NAME,
                "prompt": "Once upon a time, in a land far away,",
                "max_tokens": 1500,
                "temperature": 0,
                "stream": True,
            },
        ) as r,
    ):
        n = 0
        async for line in r.aiter_lines():
            n += line.startswith("data:")
            if n >= 4:
                break
        assert vllm_gauge(vllm_url, "vllm:num_requests_running") == 1
    await eventually(
        lambda: vllm_gauge(vllm_url, "vllm:num_requests_running") == 0, timeout=10, what="vLLM aborts the request"
    )


async def test_settlement_charges_the_tokens_real_vllm_counted(stack: Stack, vllm_url: str) -> None:
    """Catches: a settlement that charges the gateway's own estimate of the prompt (the
    reservation's) or drops the prompt or the output from the charge, instead of what the engine
    counted (read here from vLLM's own counters, not from our messages)."""
    stack.worker("vllm", "cpu-vllm", vllm_url)
    admin = BudgetAdmin(url(stack.budget()))
    gw = stack.gateway(auth="budget")
    p = admin.provision("pro", {"key": {"daily_tokens": 100_000}})
    counters = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total")
    before = [vllm_gauge(vllm_url, n) for n in counters]
    messages = [
        {"role": "system", "content": "You are a terse assistant. Answer with one word, lower case."},
        {"role": "user", "content": "Which colour is the sky on a clear day, seen from the ground?"},
    ]
    r = await client(gw, p.api_key).chat.completions.create(
        model=SERVED_NAME,
        messages=messages,
        max_tokens=5,
        temperature=0,  # type: ignore[arg-type]
    )
    prompt, generated = (vllm_gauge(vllm_url, n) - b for n, b in zip(counters, before, strict=True))
    assert prompt > 20 and generated == r.usage.completion_tokens  # type: ignore[union-attr]
    assert r.usage is not None and r.usage.prompt_tokens == prompt

    def day() -> dict[str, int]:
        return admin.usage("key", p.key_id)["day"]  # type: ignore[no-any-return]

    await eventually(lambda: day()["used"] == prompt + generated, timeout=10, what=f"{prompt + generated} settled")
    assert day()["reserved"] == 0
