"""What goes wrong, through the whole stack: no worker, saturation, disconnects, bad input."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import openai
import pytest
from llmlab_testkit.e2e import LLAMA, QWEN, client, eventually, metric, sim_stats
from llmlab_testkit.fixtures import DEV_KEY
from llmlab_testkit.procs import ManagedProcess, Stack, url

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
AUTH = {"Authorization": f"Bearer {DEV_KEY}"}
HELLO = [{"role": "user", "content": "hello"}]


async def test_no_worker_of_the_pool_is_503_quickly(stack: Stack) -> None:
    gw = stack.gateway()
    t0 = time.monotonic()
    with pytest.raises(openai.InternalServerError) as exc:
        await client(gw).chat.completions.create(model=LLAMA, messages=HELLO, max_tokens=3)
    assert exc.value.status_code == 503
    assert exc.value.body["code"] == "no_workers"  # type: ignore[index]
    assert time.monotonic() - t0 < 3


async def test_saturated_pool_is_429_with_retry_after_and_never_generated_later(stack: Stack) -> None:
    sim = stack.sim("vllm", LLAMA, ttft_ms=20, itl_ms=20, output_len=100)  # ~2 s per request
    w = stack.worker("vllm", "gpu-vllm", url(sim), max_concurrency=1)
    gw = stack.gateway(queue_timeout_s=0.7)
    c = client(gw)
    busy = asyncio.create_task(c.chat.completions.create(model=LLAMA, messages=HELLO, max_tokens=100))
    await eventually(lambda: metric(w, "llmlab_worker_in_flight_requests") == 1, what="worker busy")
    t0 = time.monotonic()
    async with httpx.AsyncClient() as h:
        r = await h.post(
            url(gw) + "/v1/chat/completions",
            headers=AUTH,
            timeout=10,
            json={"model": LLAMA, "messages": HELLO, "max_tokens": 5, "stream": True},
        )
    waited = time.monotonic() - t0
    assert r.status_code == 429
    assert int(r.headers["retry-after"]) >= 1
    assert r.json()["error"]["type"] == "rate_limit_error"
    assert 0.6 < waited < 3
    done = await busy
    assert done.choices[0].finish_reason == "stop"
    # The abandoned message is taken once the worker frees up and dropped, never generated.
    await eventually(
        lambda: (
            metric(w, "llmlab_worker_attempts_total", outcome="cancelled")
            + metric(w, "llmlab_worker_attempts_total", outcome="expired")
            == 1
        ),
        what="drop of the 429'd attempt",
    )
    await asyncio.sleep(0.3)
    assert sim_stats(sim)["received"] == 1
    await _attempt_table_empties(gw)


async def _attempt_table_empties(gw: ManagedProcess) -> None:
    """Catches: a request refused after its dispatch (429 queue timeout, engine 400 before the
    first token) leaving its entry in the gateway's attempt table for good (dd4f538 released it
    only for an opened stream; the sweeper walks every entry every 0.1 s)."""
    async with httpx.AsyncClient(timeout=5) as h:
        exposition = (await h.get(url(gw) + "/metrics")).text
    assert "\nllmlab_gateway_dispatch_table_entries " in exposition, "the attempt table's gauge is missing"
    await eventually(lambda: metric(gw, "llmlab_gateway_dispatch_table_entries") == 0, what="the attempt table empties")


async def test_client_disconnect_stops_generation_on_the_engine(stack: Stack) -> None:
    sim = stack.sim("sglang", QWEN, ttft_ms=20, itl_ms=20, output_len=2000)
    stack.worker("sglang", "gpu-sglang", url(sim))
    gw = stack.gateway()
    async with (
        httpx.AsyncClient() as h,
        h.stream(
            "POST",
            url(gw) + "/v1/chat/completions",
            headers=AUTH,
            timeout=30,
            json={"model": QWEN, "messages": HELLO, "max_tokens": 2000, "stream": True},
        ) as r,
    ):
        assert r.status_code == 200
        n = 0
        async for line in r.aiter_lines():
            n += line.startswith("data:")
            if n >= 5:
                break
        assert sim_stats(sim)["running"] == 1
    # the client is gone: the engine's own running gauge drops
    await eventually(lambda: metric(sim, "sglang:num_running_reqs") == 0, timeout=5, what="engine abort")
    stats = sim_stats(sim)
    assert stats["aborted"] == 1 and stats["generation_tokens"] < 2000  # type: ignore[operator]


async def test_bad_input_gets_openai_shaped_4xx(stack: Stack) -> None:
    sim = stack.sim("vllm", LLAMA)
    stack.worker("vllm", "gpu-vllm", url(sim))
    gw = stack.gateway(env={"LLMLAB_GATEWAY_MAX_BODY_BYTES": "20000"})
    base = url(gw) + "/v1/chat/completions"
    cases: list[tuple[dict[str, object], int, str | None]] = [
        ({"content": b"{not json", "headers": AUTH}, 400, "invalid_json"),
        ({"content": b"[1, 2]", "headers": AUTH}, 400, "invalid_json"),
        ({"json": {"model": LLAMA}, "headers": AUTH}, 400, "missing_required_parameter"),
        # Nested past the JSON parser's own recursion limit (a 500 on dd4f538), and past the bound.
        ({"content": b'{"a":' * 3000 + b"1" + b"}" * 3000, "headers": AUTH}, 400, "invalid_json"),
        ({"content": b'{"model": "x", "a": ' + b"[" * 40 + b"]" * 40 + b"}", "headers": AUTH}, 400, "invalid_json"),
        ({"json": {"model": LLAMA, "messages": HELLO, "max_tokens": 10**30}, "headers": AUTH}, 400, "invalid_value"),
        ({"json": {"model": LLAMA, "messages": HELLO, "tools": [{}] * 129}, "headers": AUTH}, 400, "invalid_value"),
        (
            {"json": {"model": LLAMA, "messages": HELLO, "logit_bias": {"1": 500}}, "headers": AUTH},
            400,
            "invalid_value",
        ),
        ({"json": {"messages": HELLO}, "headers": AUTH}, 400, "missing_required_parameter"),
        ({"json": {"model": LLAMA, "messages": HELLO, "n": 2}, "headers": AUTH}, 400, "invalid_value"),
        ({"json": {"model": LLAMA, "messages": HELLO, "temperature": "hot"}, "headers": AUTH}, 400, "invalid_value"),
        ({"json": {"model": "gpt-17", "messages": HELLO}, "headers": AUTH}, 404, "model_not_found"),
        ({"json": {"model": "gpt-17", "messages": HELLO, "stream": True}, "headers": AUTH}, 404, "model_not_found"),
        (
            {"json": {"model": LLAMA, "messages": [{"role": "user", "content": "x" * 30000}]}, "headers": AUTH},
            413,
            "request_too_large",
        ),
        ({"json": {"model": LLAMA, "messages": HELLO}}, 401, "missing_api_key"),
        (
            {"json": {"model": LLAMA, "messages": HELLO}, "headers": {"Authorization": "Bearer sk-wrong"}},
            401,
            "invalid_api_key",
        ),
    ]
    async with httpx.AsyncClient(timeout=10) as h:
        for kwargs, status, code in cases:
            r = await h.post(base, **kwargs)  # type: ignore[arg-type]
            assert r.status_code == status, (kwargs, r.text)
            err = r.json()["error"]
            assert set(err) >= {"message", "type", "code"} and err["message"], r.text
            assert err["code"] == code, (kwargs, err)
            assert r.headers["x-request-id"]
        r = await h.get(base, headers=AUTH)
        assert r.status_code == 405 and "error" in r.json()
        r = await h.get(url(gw) + "/v1/nothing", headers=AUTH)
        assert r.status_code == 404 and "error" in r.json()
        # still healthy afterwards
        ok = await h.post(base, headers=AUTH, json={"model": LLAMA, "messages": HELLO, "max_tokens": 2})
        assert ok.status_code == 200


async def test_engine_rejection_is_a_client_error_not_5xx(stack: Stack) -> None:
    sim = stack.sim("vllm", LLAMA, extra=["--max-model-len", "64"])
    stack.worker("vllm", "gpu-vllm", url(sim))
    gw = stack.gateway()
    for _ in range(3):
        with pytest.raises(openai.BadRequestError):
            await client(gw).chat.completions.create(
                model=LLAMA, messages=[{"role": "user", "content": "word " * 200}], max_tokens=3
            )
    await _attempt_table_empties(gw)


async def test_body_over_the_bus_limit_is_413_not_500(stack: Stack) -> None:
    # The gateway accepts 4 MiB bodies, but one NATS message is capped by the server's
    # max_payload (1 MiB by default): the request is refused cleanly before publishing.
    # A deployment whose context (and the plan's cost cap) fits 2 MB of prompt, so the router lets
    # it through to the bus.
    text = (REPO / "configs" / "catalog.yaml").read_text()
    text = text.replace("max_context: 8192", "max_context: 2000000").replace("cost_cap_usd: 0.10", "cost_cap_usd: 10")
    catalog = stack.workdir / "catalog.yaml"
    catalog.write_text(text)
    env = {"LLMLAB_CATALOG_PATH": str(catalog)}
    sim = stack.sim("vllm", LLAMA)
    stack.worker("vllm", "gpu-vllm", url(sim), env=env)
    gw = stack.gateway(env=env)
    async with httpx.AsyncClient(timeout=10) as h:
        r = await h.post(
            url(gw) + "/v1/chat/completions",
            headers=AUTH,
            json={"model": LLAMA, "messages": [{"role": "user", "content": "x" * 2_000_000}], "max_tokens": 8},
        )
    assert r.status_code == 413, r.text
    assert "max_payload" in r.json()["error"]["message"]
