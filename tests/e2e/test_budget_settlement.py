"""Settlement through a real budget process and the JetStream events stream: duplicates change
nothing, a retried or fallen-back request is charged once, a killed gateway leaks nothing."""

from __future__ import annotations

import asyncio
import hashlib
import time

import httpx
import pytest
from llmlab_common.messages import AttemptEvent, ErrorInfo, Principal, ReserveReply, ReserveRequest, Usage
from llmlab_common.natsio import connect
from llmlab_common.subjects import Topology
from llmlab_testkit.budget import BudgetAdmin, Provisioned
from llmlab_testkit.e2e import LLAMA, eventually, metric
from llmlab_testkit.procs import Stack, url

pytestmark = pytest.mark.e2e


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


def day(admin: BudgetAdmin, p: Provisioned) -> dict:
    return admin.usage("key", p.key_id)["day"]  # type: ignore[no-any-return]


async def test_same_usage_event_three_times_is_charged_once(stack: Stack) -> None:
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


async def test_retried_and_fallen_back_requests_are_each_charged_once(stack: Stack) -> None:
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


async def test_killed_gateway_leaks_no_reservation(stack: Stack) -> None:
    sim = stack.sim("vllm", LLAMA, ttft_ms=20, itl_ms=20, output_len=150)  # ~3 s streams
    stack.worker("vllm", "gpu-vllm", url(sim))
    admin = BudgetAdmin(url(stack.budget(env={"LLMLAB_BUDGET_RESERVATION_GRACE_S": "2"})))
    gw = stack.gateway(auth="budget", env={"LLMLAB_GATEWAY_REQUEST_TIMEOUT_S": "10"})
    p = admin.provision("pro")

    async def stream() -> None:
        async with (
            httpx.AsyncClient(timeout=30) as h,
            h.stream(
                "POST",
                url(gw) + "/v1/chat/completions",
                headers={"Authorization": f"Bearer {p.api_key}"},
                json={"model": LLAMA, "messages": [{"role": "user", "content": "hi"}], "stream": True},
            ) as r,
        ):
            async for _ in r.aiter_lines():
                pass

    tasks = [asyncio.create_task(stream()) for _ in range(5)]
    await eventually(lambda: admin.usage("key", p.key_id)["concurrent"]["current"] == 5, what="5 in flight")
    await asyncio.sleep(0.5)
    gw.kill()  # SIGKILL mid-stream: no cancel, no event from the gateway
    await asyncio.gather(*tasks, return_exceptions=True)
    # Bound: the workers finish and report (settled), else the reaper releases them after the
    # request deadline (10 s) + grace (2 s) + one reaper interval (5 s).
    t0 = time.monotonic()
    await eventually(
        lambda: day(admin, p)["reserved"] == 0 and admin.usage("key", p.key_id)["concurrent"]["current"] == 0,
        timeout=20,
        what="no reservation left",
    )
    assert time.monotonic() - t0 < 17
