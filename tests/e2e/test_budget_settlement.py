"""Settlement through a real budget process and the JetStream events stream: duplicates change
nothing, a retried or fallen-back request is charged once (events written here, then through the
whole stack with the router), a killed gateway's streams are settled by their workers, and what
a killed gateway and worker left behind is released by the reaper, charging nothing."""

from __future__ import annotations

import asyncio
import hashlib
import time

import httpx
import pytest
from llmlab_budget.layout import Layout
from llmlab_common.messages import AttemptEvent, ErrorInfo, Principal, ReserveReply, ReserveRequest, Usage
from llmlab_common.natsio import connect
from llmlab_common.subjects import Topology
from llmlab_testkit.budget import BudgetAdmin, Provisioned, Stream
from llmlab_testkit.e2e import LLAMA, QWEN, client, eventually, metric, sim_stats
from llmlab_testkit.procs import Stack, url
from redis.asyncio import Redis

pytestmark = pytest.mark.e2e
SMOL = "SmolLM2-135M-Instruct"
HI = [{"role": "user", "content": "hi"}]


def estimated_input(*texts: str) -> int:
    """The gateway's prompt estimate by the documented rule (docs/budgets.md), by hand: one
    token per 3 UTF-8 bytes rounded up, + 4 per message + 3 per conversation."""
    return 3 + sum(4 + -(-len(t.encode()) // 3) for t in texts)


async def reserve(stack: Stack, p: Provisioned, rid: str, max_tokens: int = 100) -> ReserveReply:
    """What a gateway does before routing, on the real subject."""
    nc = await connect(stack.nats_url, "test-gateway")
    try:
        req = ReserveRequest(
            request_id=rid,
            key_sha256=hashlib.sha256(p.api_key.encode()).hexdigest(),
            model=LLAMA,
            input_tokens=20,
            requested_max_tokens=max_tokens,
            deadline=time.time() + 60,
        )
        msg = await nc.request(Topology(stack.namespace).budget_reserve_subject, req.model_dump_json().encode(), 5)
        return ReserveReply.model_validate_json(msg.data)
    finally:
        await nc.close()


def event(rid: str, attempt: int, outcome: str, deployment: str, usage: Usage | None, source: str = "worker"):
    return AttemptEvent(
        request_id=rid,
        attempt=attempt,
        outcome=outcome,  # type: ignore[arg-type]
        source=source,  # type: ignore[arg-type]
        worker_id="w1",
        pool="gpu-vllm",
        deployment=deployment,
        model=LLAMA,
        endpoint="chat",
        principal=Principal(),
        usage=usage,
        error=None if outcome == "completed" else ErrorInfo(status=0, type="attempt", code=outcome, message=outcome),
        finish_reason="stop" if outcome == "completed" else None,
        created_at=time.time(),
        ended_at=time.time(),
    )


async def publish(stack: Stack, *events: AttemptEvent, msg_ids: list[str] | None = None) -> None:
    nc = await connect(stack.nats_url, "test-publisher")
    js = nc.jetstream()
    topo = Topology(stack.namespace)
    try:
        for i, ev in enumerate(events):
            headers = {"Nats-Msg-Id": msg_ids[i]} if msg_ids else None
            await js.publish(topo.attempt_event_subject, ev.model_dump_json().encode(), headers=headers)
    finally:
        await nc.close()


def day(admin: BudgetAdmin, p: Provisioned, scope: str = "key") -> dict:
    return admin.day(p, scope)


async def test_same_usage_event_three_times_is_charged_once(stack: Stack) -> None:
    """Catches: a settlement that is not idempotent (a redelivered or duplicated completed event
    charged again); request or key ids used as metric labels."""
    budget = stack.budget()
    admin = BudgetAdmin(url(budget))
    p = admin.provision("pro")
    assert (await reserve(stack, p, "req-dup")).max_tokens == 100
    done = event("req-dup", 1, "completed", "llama-8b-vllm", Usage(prompt_tokens=17, completion_tokens=40))
    # Three deliveries that JetStream's dedup window does not catch (distinct message ids).
    await publish(stack, done, done, done, msg_ids=["a", "b", "c"])
    await eventually(lambda: day(admin, p)["used"] == 57 and day(admin, p)["reserved"] == 0, what="settled once")
    await asyncio.sleep(1.5)  # the duplicates have been consumed by now
    assert day(admin, p)["used"] == 57
    assert metric(budget, "llmlab_budget_settlements_total", result="settled") == 1
    assert metric(budget, "llmlab_budget_settlements_total", result="dup") == 2
    assert metric(budget, "llmlab_budget_reservations_total") == 1
    async with httpx.AsyncClient() as h:
        text = (await h.get(url(budget) + "/metrics")).text
    for secret in (p.key_id, p.user_id, p.team_id, p.tenant_id, "req-dup"):
        assert secret not in text  # ids go to logs, never to metric labels


async def test_retried_and_fallen_back_events_are_each_charged_once(stack: Stack) -> None:
    """The charging rule on hand-written events (no gateway or worker: the whole stack is
    ``test_retry_and_fallback_through_the_stack_charge_the_answering_attempt_once``), including
    a failed attempt that burnt tokens, which the stack cannot produce on demand. Catches: a
    failed attempt's usage charged, or any attempt event other than the answer closing the
    reservation; two replicas sharing the consumer settling one request twice."""
    budget = stack.budget()
    stack.budget()  # two replicas share the settlement consumer
    admin = BudgetAdmin(url(budget))
    p = admin.provision("pro")
    for rid in ("req-retry", "req-fallback"):
        assert (await reserve(stack, p, rid)).error is None
    await publish(
        stack,
        # Retry: attempt 1's worker vanished before the first token, attempt 2 answered.
        event("req-retry", 1, "worker_lost", "llama-8b-vllm", None, source="gateway"),
        event("req-retry", 2, "completed", "llama-8b-vllm", Usage(prompt_tokens=17, completion_tokens=30)),
        # Fallback: the first deployment failed after burning tokens; another model answered.
        event("req-fallback", 1, "engine_error", "llama-8b-vllm", Usage(prompt_tokens=17, completion_tokens=5)),
        event("req-fallback", 2, "completed", "qwen3-32b-sglang", Usage(prompt_tokens=19, completion_tokens=11)),
    )
    await eventually(lambda: day(admin, p)["reserved"] == 0, what="both settled")
    # Only the answering attempts: 17 + 30 and 19 + 11; the failed attempts are our cost.
    assert day(admin, p)["used"] == 47 + 30


async def test_retry_and_fallback_through_the_stack_charge_the_answering_attempt_once(stack: Stack) -> None:
    """Catches: an attempt that failed (no first token in time, retried on the same deployment,
    then fallen back to another) closing the reservation or being charged; the request charged
    more than once, or for anything but the answering attempt's own usage."""
    # qwen (quality-first's choice for "best") never gets a first token out within the gateway's
    # first-token timeout: its worker (attempt 1), then its pool (attempt 2, the replica retry)
    # time out; llama, the next deployment by quality, answers (attempt 3).
    sims = {
        LLAMA: stack.sim("vllm", LLAMA, ttft_ms=20, itl_ms=5, output_len=12),
        QWEN: stack.sim("sglang", QWEN, ttft_ms=30_000, itl_ms=5, output_len=12),
        SMOL: stack.sim("vllm", SMOL, ttft_ms=20, itl_ms=5, output_len=12),
    }
    stack.worker("vllm", "gpu-vllm", url(sims[LLAMA]), worker_id="llama-w1")
    stack.worker("sglang", "gpu-sglang", url(sims[QWEN]), worker_id="qwen-w1")
    stack.worker("vllm", "cpu-vllm", url(sims[SMOL]), worker_id="smol-w1")
    budget = stack.budget()
    admin = BudgetAdmin(url(budget))
    stack.router()
    gw = stack.gateway(auth="budget", router="service", env={"LLMLAB_GATEWAY_FIRST_TOKEN_TIMEOUT_S": "2.5"})
    p = admin.provision("pro", {"key": {"daily_tokens": 100_000}})
    r = await client(gw, p.api_key).chat.completions.with_raw_response.create(model="best", messages=HI, max_tokens=10)
    answer = r.parse()
    assert r.headers["x-llmlab-attempts"] == "3"
    assert r.headers["x-llmlab-deployment"] == "llama-8b-vllm"
    assert answer.usage is not None and answer.choices[0].finish_reason == "length"
    assert answer.usage.completion_tokens == 10
    assert sim_stats(sims[QWEN])["received"] == 2  # both failed attempts reached qwen's engine
    assert sim_stats(sims[LLAMA])["received"] == 1
    # Budgets count tokens, not dollars (the catalog's prices do not enter them): the key pays
    # the answering attempt's input and output, as the engine counted them, once.
    expected = answer.usage.prompt_tokens + answer.usage.completion_tokens
    await eventually(lambda: day(admin, p)["reserved"] == 0, what="settled")
    # Every attempt has reported by now (the failed ones before the answer); give stragglers and
    # redeliveries a moment: they must change nothing.
    await asyncio.sleep(1.5)
    for scope in ("key", "user", "team", "tenant"):
        assert day(admin, p, scope)["used"] == expected, scope
    assert metric(budget, "llmlab_budget_reservations_total") == 1  # the attempts shared one
    assert metric(budget, "llmlab_budget_settlements_total", result="settled") == 1


async def test_killed_gateway_streams_are_settled_by_their_workers(stack: Stack) -> None:
    """Catches: a gateway crash leaking reservations while its workers finish the generations
    (their completed events must settle them, at the engine's full count, before any reaper)."""
    sim = stack.sim("vllm", LLAMA, ttft_ms=20, itl_ms=20, output_len=150)  # ~3 s streams
    stack.worker("vllm", "gpu-vllm", url(sim))
    budget = stack.budget(env={"LLMLAB_BUDGET_RESERVATION_GRACE_S": "2"})
    admin = BudgetAdmin(url(budget))
    gw = stack.gateway(auth="budget", env={"LLMLAB_GATEWAY_REQUEST_TIMEOUT_S": "10"})
    p = admin.provision("pro")
    # What one such request costs when it completes normally: "hi" as the engine counts it + 150.
    ref = await client(gw, p.api_key).chat.completions.create(model=LLAMA, messages=HI)
    assert ref.usage is not None and ref.usage.completion_tokens == 150

    async def stream() -> None:
        async with (
            httpx.AsyncClient(timeout=30) as h,
            h.stream(
                "POST",
                url(gw) + "/v1/chat/completions",
                headers={"Authorization": f"Bearer {p.api_key}"},
                json={"model": LLAMA, "messages": HI, "stream": True},
            ) as r,
        ):
            async for _ in r.aiter_lines():
                pass

    t0 = time.monotonic()
    tasks = [asyncio.create_task(stream()) for _ in range(5)]
    await eventually(lambda: admin.concurrent(p) == 5, what="5 in flight")
    await asyncio.sleep(0.5)
    gw.kill()  # SIGKILL mid-stream: no cancel, no event from the gateway
    await asyncio.gather(*tasks, return_exceptions=True)
    await eventually(
        lambda: day(admin, p)["reserved"] == 0 and admin.concurrent(p) == 0, timeout=20, what="no reservation left"
    )
    # Settled by the workers' completed events: each stream generated all 150 tokens and pays
    # them (the rule charges the answering attempt's engine count, client or no client) ...
    assert day(admin, p)["used"] == 6 * ref.usage.total_tokens
    # ... and not by the reaper, whose earliest turn is the deadline (10 s) + grace (2 s).
    assert metric(budget, "llmlab_budget_reaped_reservations_total") == 0
    assert time.monotonic() - t0 < 12


async def test_reaper_releases_what_a_killed_gateway_and_worker_left_charging_nothing(stack: Stack) -> None:
    """Catches: no reaper (reservations of vanished requests held forever: the budget and the
    concurrency slots leak); a reaper that releases before the request's deadline + grace; a
    reaper that charges what it releases (the rule: a request that never settles pays nothing)."""
    sim = stack.sim("vllm", LLAMA, ttft_ms=20, itl_ms=50, output_len=400)  # 20 s streams
    worker = stack.worker("vllm", "gpu-vllm", url(sim))
    timeout_s, grace_s, interval_s = 4.0, 1.0, 0.5
    budget = stack.budget(
        env={"LLMLAB_BUDGET_RESERVATION_GRACE_S": str(grace_s), "LLMLAB_BUDGET_REAPER_INTERVAL_S": str(interval_s)}
    )
    admin = BudgetAdmin(url(budget))
    gw = stack.gateway(auth="budget", env={"LLMLAB_GATEWAY_REQUEST_TIMEOUT_S": str(timeout_s)})
    p = admin.provision("pro")
    # Two requests that complete: their workers' events settle them at their usage.
    done = [await client(gw, p.api_key).chat.completions.create(model=LLAMA, messages=HI, max_tokens=5) for _ in "ab"]
    paid = sum(r.usage.total_tokens for r in done if r.usage is not None)
    await eventually(lambda: day(admin, p)["used"] == paid and day(admin, p)["reserved"] == 0, what="settled")
    # Three streams in flight; then the gateway and the worker generating them die together:
    # no cancel, no completed event, no request event will ever come for them.
    t_sent = time.time()
    async with httpx.AsyncClient(timeout=30) as h:
        streams = [await Stream(h, url(gw), p.api_key, max_tokens=300, text="hi").open() for _ in range(3)]
        assert [s.status for s in streams] == [200, 200, 200]
        t_opened = time.time()
        gw.kill()
        worker.kill()
    # Each holds its reservation: input estimate ("hi": 1 + 4 + 3) + its 300-token allowance, and
    # nothing may release it before its deadline (sent + timeout) + grace. Checked on the
    # reservations' own records, whatever the host's scheduling: each expires no earlier than
    # t_sent + timeout + grace, and the reaper's release time lies between that expiry and now.
    rids = [s.headers["x-request-id"] for s in streams]
    layout = Layout.for_namespace(stack.namespace)
    redis = Redis.from_url(stack.redis_url, decode_responses=True)

    async def records() -> list[dict[str, str]]:
        return [await redis.hgetall(layout.reservation(rid)) for rid in rids]

    try:
        first = await records()
        assert [int(r["total"]) for r in first] == [estimated_input("hi") + 300] * 3, first
        assert all(float(r["expires_at"]) >= t_sent + timeout_s + grace_s for r in first), (t_sent, first)
        # Held until then: a record still 'reserved' here, or released no earlier than its expiry.
        assert all(r["state"] == "reserved" or float(r["closed_at"]) >= float(r["expires_at"]) for r in first)
        await eventually(
            lambda: day(admin, p)["reserved"] == 0 and admin.concurrent(p) == 0,
            timeout=timeout_s + grace_s + interval_s + 10,
            what="the reaper releasing the three",
        )
        now = time.time()
        released = await records()
    finally:
        await redis.aclose()
    assert [r["state"] for r in released] == ["released"] * 3, released
    assert all(float(r["expires_at"]) <= float(r["closed_at"]) <= now for r in released), (now, released)
    assert [int(r["charged"]) for r in released] == [0, 0, 0]
    # Bound (docs/budgets.md): deadline + grace + one reaper interval, plus slack for the host.
    assert time.time() - t_opened < timeout_s + grace_s + interval_s + 6
    assert metric(budget, "llmlab_budget_reaped_reservations_total") == 3
    # Released, not settled: every scope was charged the two completed requests and nothing else.
    for scope in ("key", "user", "team", "tenant"):
        assert day(admin, p, scope)["used"] == paid, scope
        assert day(admin, p, scope)["reserved"] == 0, scope
        assert admin.usage(scope, p.scope_id(scope))["month"]["used"] == paid, scope
