"""Budgets through the whole stack: gateway (auth=budget) → budget service → worker → simulator."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest
from llmlab_testkit.budget import BudgetAdmin, Provisioned, Stream
from llmlab_testkit.e2e import LLAMA, client, eventually, sim_stats
from llmlab_testkit.procs import ManagedProcess, Stack, url

pytestmark = pytest.mark.e2e
HELLO = [{"role": "user", "content": "hello there"}]


def budget_stack(
    stack: Stack, output_len: int = 8, itl_ms: float = 5, sim_args: list[str] | None = None, **gw_env: str
) -> tuple[ManagedProcess, ManagedProcess, BudgetAdmin]:
    sim = stack.sim("vllm", LLAMA, ttft_ms=20, itl_ms=itl_ms, output_len=output_len, extra=sim_args)
    stack.worker("vllm", "gpu-vllm", url(sim))
    budget = stack.budget()
    gw = stack.gateway(auth="budget", env=gw_env)
    return sim, gw, BudgetAdmin(url(budget))


def day(admin: BudgetAdmin, p: Provisioned, scope: str = "key") -> dict:
    return admin.day(p, scope)


def estimated_input(*texts: str) -> int:
    """The gateway's prompt estimate by the documented rule (docs/budgets.md), computed here by
    hand: one token per 3 UTF-8 bytes rounded up, per message, + 4 per message + 3 per
    conversation."""
    return 3 + sum(4 + -(-len(t.encode()) // 3) for t in texts)


async def test_request_is_reserved_then_settled_at_actual_usage(stack: Stack) -> None:
    _sim, gw, admin = budget_stack(stack)
    p = admin.provision("pro", {"key": {"daily_tokens": 100_000}})
    r = await client(gw, p.api_key).chat.completions.create(model=LLAMA, messages=HELLO, max_tokens=50)
    assert r.choices[0].finish_reason == "stop" and r.usage is not None
    await eventually(lambda: day(admin, p)["used"] == r.usage.total_tokens, what="settlement")  # type: ignore[union-attr]
    assert day(admin, p)["reserved"] == 0
    for scope in ("user", "team", "tenant"):  # every scope is charged the same request
        assert day(admin, p, scope)["used"] == r.usage.total_tokens  # type: ignore[union-attr]


async def test_short_budget_clamps_max_tokens_and_stream_ends_with_length(stack: Stack) -> None:
    _sim, gw, admin = budget_stack(stack, output_len=200)
    # 'hello there' is estimated at 3 + 4 + 4 = 11 tokens; 11 + 256 margin + 40 = 307.
    p = admin.provision("pro", {"user": {"daily_tokens": 307}})
    stream = await client(gw, p.api_key).chat.completions.create(
        model=LLAMA, messages=HELLO, max_tokens=500, stream=True, stream_options={"include_usage": True}
    )
    finish, usage = None, None
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
        if chunk.usage:
            usage = chunk.usage
    assert finish == "length" and usage is not None and usage.completion_tokens == 40
    await eventually(lambda: day(admin, p, "user")["used"] == usage.total_tokens, what="settlement")


async def test_over_budget_is_429_insufficient_quota_and_never_reaches_a_worker(stack: Stack) -> None:
    sim, gw, admin = budget_stack(stack)
    p = admin.provision("pro", {"key": {"daily_tokens": 200}})  # below input + margin + minimum
    async with httpx.AsyncClient() as h:
        r = await h.post(
            url(gw) + "/v1/chat/completions",
            headers={"Authorization": f"Bearer {p.api_key}"},
            json={"model": LLAMA, "messages": HELLO, "stream": True},
            timeout=10,
        )
    assert r.status_code == 429
    assert r.json()["error"]["type"] == "insufficient_quota"
    assert r.json()["error"]["code"] == "insufficient_quota"
    assert int(r.headers["retry-after"]) >= 1
    assert sim_stats(sim)["received"] == 0
    assert day(admin, p) == {**day(admin, p), "used": 0, "reserved": 0}


async def test_revoked_key_is_refused_at_once_and_rotation_hands_over(stack: Stack) -> None:
    _sim, gw, admin = budget_stack(stack)
    p = admin.provision("pro")
    c = client(gw, p.api_key)
    await c.chat.completions.create(model=LLAMA, messages=HELLO, max_tokens=2)
    rotated = admin.post(f"/keys/{p.key_id}/rotate")
    t0 = time.monotonic()
    with pytest.raises(openai.AuthenticationError) as exc:
        await c.chat.completions.create(model=LLAMA, messages=HELLO, max_tokens=2)
    assert time.monotonic() - t0 < 2
    assert exc.value.body["code"] == "api_key_revoked"  # type: ignore[index]
    r = await client(gw, rotated["key"]).chat.completions.create(model=LLAMA, messages=HELLO, max_tokens=2)
    assert r.choices[0].finish_reason in ("stop", "length")
    with pytest.raises(openai.AuthenticationError):
        await client(gw, "sk-llm-not-a-key").models.list()


async def test_rpm_limit_is_429_with_retry_after(stack: Stack) -> None:
    """Catches: an RPM check that admits one request too many in a minute, or refuses with the
    wrong error (type rate_limit_error, code rate_limit_exceeded, Retry-After within the minute)."""
    _sim, gw, admin = budget_stack(stack)
    p = admin.provision("pro", {"key": {"rpm": 3}})
    c = client(gw, p.api_key)
    if 60 - time.time() % 60 < 10:  # the four requests must fall in one calendar minute
        await asyncio.sleep(60 - time.time() % 60 + 0.2)
    for _ in range(3):
        await c.chat.completions.create(model=LLAMA, messages=HELLO, max_tokens=2)
    with pytest.raises(openai.RateLimitError) as exc:
        await c.chat.completions.create(model=LLAMA, messages=HELLO, max_tokens=2)
    assert exc.value.body["type"] == "rate_limit_error"  # type: ignore[index]
    assert exc.value.body["code"] == "rate_limit_exceeded"  # type: ignore[index]
    assert 1 <= int(exc.value.response.headers["retry-after"]) <= 60


async def test_concurrency_limit_refuses_the_extra_stream_and_frees_a_slot_at_settlement(stack: Stack) -> None:
    """Catches: a concurrency check that admits N+1 streams (off by one, or not checked); a
    refusal with the wrong error (429 rate_limit_error / concurrency_limit_exceeded, Retry-After
    1); a slot that is not given back when a request settles (the next one refused forever)."""
    # 100 ms between tokens: the short stream lasts ~4 s, the long one until the test closes it.
    sim, gw, admin = budget_stack(stack, output_len=400, itl_ms=100)
    p = admin.provision("pro", {"key": {"max_concurrent": 2}})
    async with httpx.AsyncClient(timeout=30) as h:
        short = await Stream(h, url(gw), p.api_key, max_tokens=40).open()
        long = await Stream(h, url(gw), p.api_key, max_tokens=400).open()
        assert (short.status, long.status) == (200, 200)
        assert admin.concurrent(p) == 2
        extra = await Stream(h, url(gw), p.api_key, max_tokens=5).open()  # the N+1th, while both stream
        assert extra.status == 429, extra.error
        assert extra.error["type"] == "rate_limit_error"
        assert extra.error["code"] == "concurrency_limit_exceeded"
        assert extra.headers["retry-after"] == "1"
        assert not short.done and not long.done  # it was refused while two streams were open
        assert sim_stats(sim)["received"] == 2  # the refused one never reached the engine
        await short.finish_all()
        assert short.finish == "length" and short.usage is not None
        # The slot comes back when the short request settles; the long one still holds its own.
        await eventually(lambda: admin.concurrent(p) == 1, what="the short request's slot given back")
        after = await Stream(h, url(gw), p.api_key, max_tokens=3).open()
        assert after.status == 200, after.error
        await after.finish_all()
        assert not long.done  # admitted while the long stream still held the other slot
        await long.close()  # client disconnect: settled as cancelled, its slot given back too
    await eventually(lambda: admin.concurrent(p) == 0 and day(admin, p)["reserved"] == 0, what="every slot given back")


async def test_budget_service_down_is_503_not_a_hang(stack: Stack) -> None:
    sim = stack.sim("vllm", LLAMA)
    stack.worker("vllm", "gpu-vllm", url(sim))
    gw = stack.gateway(auth="budget")
    t0 = time.monotonic()
    with pytest.raises(openai.InternalServerError) as exc:
        await client(gw, "sk-llm-whatever").chat.completions.create(model=LLAMA, messages=HELLO, max_tokens=2)
    assert exc.value.status_code == 503
    assert exc.value.body["code"] == "budget_unavailable"  # type: ignore[index]
    assert time.monotonic() - t0 < 5
    assert sim_stats(sim)["received"] == 0


async def test_client_cancel_pays_input_plus_delivered(stack: Stack) -> None:
    """Catches: a cancelled request charged anything but its estimated input plus exactly the
    tokens relayed before the client left (its reservation, its input only, the tokens only,
    one token more or less than delivered)."""
    # 800 ms between tokens: the gateway sees the disconnect long before the next token, so
    # what it relayed is exactly what the client received.
    _sim, gw, admin = budget_stack(stack, output_len=400, itl_ms=800)
    p = admin.provision("pro", {"key": {"daily_tokens": 1_000_000}})
    async with httpx.AsyncClient(timeout=30) as h:
        s = await Stream(h, url(gw), p.api_key, max_tokens=400).open()
        assert s.status == 200, s.error
        await s.read(3)
        await s.close()  # the client leaves after 3 tokens
    assert s.tokens == 3 and not s.done
    await eventually(lambda: day(admin, p)["reserved"] == 0, what="settlement of the cancelled request")
    # 'hello there' (11 bytes) is estimated at 4 + 4 + 3 = 11 input tokens; the reservation was
    # 11 + 400. The request pays that input and the 3 tokens it received.
    assert estimated_input("hello there") == 11
    assert day(admin, p)["used"] == 11 + 3
    await asyncio.sleep(1)  # the worker's own 'cancelled' event comes later: it changes nothing
    assert day(admin, p)["used"] == 11 + 3


async def test_cancel_of_a_stream_whose_chunks_carry_several_tokens_pays_every_token_received(
    stack: Stack,
) -> None:
    """Catches: delivered tokens counted as chunks. vLLM merges output deltas into one chunk when
    its consumer lags; the simulator here puts 3 tokens in every chunk. A client that leaves after
    two chunks received 6 tokens (the simulator's tokens are one word each, so the client counts
    them in the text itself), and the request pays input + 6, not input + 2."""
    _sim, gw, admin = budget_stack(stack, output_len=400, itl_ms=300, sim_args=["--chunk-tokens", "3"])
    p = admin.provision("pro", {"key": {"daily_tokens": 1_000_000}})
    async with httpx.AsyncClient(timeout=30) as h:
        s = await Stream(h, url(gw), p.api_key, max_tokens=400).open()
        assert s.status == 200, s.error
        await s.read(2)  # two content chunks
        await s.close()
    received = len(s.received.split())
    assert s.tokens == 2 and received == 6, (s.tokens, s.received)
    await eventually(lambda: day(admin, p)["reserved"] == 0, what="settlement of the cancelled request")
    assert day(admin, p)["used"] == estimated_input("hello there") + received
    await asyncio.sleep(1)  # the worker's own 'cancelled' event comes later: it changes nothing
    assert day(admin, p)["used"] == estimated_input("hello there") + received


async def test_two_tenants_streaming_at_once_are_each_charged_their_own_usage(stack: Stack) -> None:
    """Catches: ledgers shared between tenants (a key, user, team or tenant ledger that does not
    include its id: each tenant charged the other's tokens); a request charged to another key's
    identity (e.g. a mis-keyed identity cache); one tenant's spent budget refusing another."""
    _sim, gw, admin = budget_stack(stack, output_len=60)
    # Tenant A has room for exactly one 50-token answer: 256 margin + 11 input + 50 output + 10.
    # After it, at most 10 - (its engine-counted prompt) output tokens are left: below the
    # 16-token minimum, so A's next request is refused.
    a = admin.provision("pro", {"tenant": {"daily_tokens": 256 + 11 + 50 + 10}})
    b = admin.provision("pro", {"tenant": {"daily_tokens": 1_000_000}})
    async with httpx.AsyncClient(timeout=30) as h:

        async def full(key: str, max_tokens: int, text: str) -> Stream:
            return await (await Stream(h, url(gw), key, max_tokens, text).open()).finish_all()

        # Both tenants at once: A one stream, B three (different prompts, different lengths).
        first = await asyncio.gather(
            full(a.api_key, 50, "hello there"),
            *(full(b.api_key, 20, f"tenant b asks question {i}") for i in range(3)),
        )
        for s in first:
            assert s.status == 200 and s.usage is not None, s.error
        assert first[0].usage["completion_tokens"] == 50  # type: ignore[index]
        spent_a = first[0].usage["total_tokens"]  # type: ignore[index]
        spent_b = sum(s.usage["total_tokens"] for s in first[1:])  # type: ignore[index]

        def settled() -> bool:
            return day(admin, a, "tenant")["reserved"] == 0 and day(admin, b, "tenant")["reserved"] == 0

        await eventually(settled, what="both tenants settled")
        # A is spent now; at the same moment B asks again and must get its full answer.
        refused, again = await asyncio.gather(
            Stream(h, url(gw), a.api_key, 50).open(), full(b.api_key, 20, "tenant b asks once more")
        )
    assert refused.status == 429 and refused.error["type"] == "insufficient_quota", refused.error
    assert "tenant limit" in refused.error["message"]
    assert again.status == 200 and again.usage is not None, again.error
    assert again.usage["completion_tokens"] == 20  # not clamped by A's spent budget
    spent_b += again.usage["total_tokens"]
    await eventually(settled, what="both tenants settled again")
    for scope in ("key", "user", "team", "tenant"):
        assert day(admin, a, scope)["used"] == spent_a, scope
        assert day(admin, b, scope)["used"] == spent_b, scope
        assert admin.usage(scope, a.scope_id(scope))["month"]["used"] == spent_a, scope
        assert admin.usage(scope, b.scope_id(scope))["month"]["used"] == spent_b, scope


async def test_request_retried_after_its_worker_died_is_charged_once(stack: Stack) -> None:
    # A long prefill keeps attempt 1 before its first token while its worker is killed.
    sim = stack.sim("vllm", LLAMA, ttft_ms=1500, itl_ms=20, output_len=20)
    fast = {"LLMLAB_WORKER_ACK_WAIT_S": "2"}
    doomed = stack.worker("vllm", "gpu-vllm", url(sim), max_concurrency=1, env=fast)
    admin = BudgetAdmin(url(stack.budget()))
    # The retry goes to the pool while a new worker starts: give it time on a busy machine.
    gw = stack.gateway(auth="budget", queue_timeout_s=20, env={"LLMLAB_GATEWAY_EMPTY_POOL_WAIT_S": "15"})
    p = admin.provision("pro")
    call = asyncio.create_task(
        client(gw, p.api_key).chat.completions.create(model=LLAMA, messages=HELLO, max_tokens=50)
    )
    await eventually(lambda: sim_stats(sim)["received"] == 1, what="attempt 1 on the engine")
    doomed.kill()
    stack.worker("vllm", "gpu-vllm", url(sim), max_concurrency=1, env=fast)
    r = await asyncio.wait_for(call, 30)
    assert r.usage is not None and r.choices[0].finish_reason == "stop"
    await eventually(lambda: day(admin, p)["reserved"] == 0, timeout=20, what="settled")
    # Attempt 1 generated nothing it could be charged for; the user pays attempt 2 only, once.
    await asyncio.sleep(2)  # the redelivered attempt 1 is dropped meanwhile; it must change nothing
    assert day(admin, p)["used"] == r.usage.total_tokens
