"""Workers scale separately: a pool's workers share its load, pools never see each other's
requests, a worker that dies before the first token is replaced by a retry."""

from __future__ import annotations

import asyncio

import pytest
from llmlab_common.messages import TokenChunk
from llmlab_common.natsio import connect
from llmlab_common.subjects import Topology
from llmlab_testkit.e2e import LLAMA, QWEN, client, eventually, metric, sim_stats, stream_chat
from llmlab_testkit.procs import Stack, url

pytestmark = pytest.mark.e2e
HELLO = [{"role": "user", "content": "hello"}]


async def test_two_workers_share_a_pool_and_other_pools_see_nothing(stack: Stack) -> None:
    sv = stack.sim("vllm", LLAMA, ttft_ms=20, itl_ms=10, output_len=20)
    ss = stack.sim("sglang", QWEN, ttft_ms=20, itl_ms=10, output_len=20)
    a = stack.worker("vllm", "gpu-vllm", url(sv), max_concurrency=3)
    b = stack.worker("vllm", "gpu-vllm", url(sv), max_concurrency=3)
    other = stack.worker("sglang", "gpu-sglang", url(ss), max_concurrency=3)
    gw = stack.gateway(queue_timeout_s=20)
    c = client(gw)
    results = await asyncio.gather(
        *[c.chat.completions.create(model=LLAMA, messages=HELLO, max_tokens=20) for _ in range(12)]
    )
    assert all(r.choices[0].finish_reason in ("stop", "length") for r in results)
    done = "llmlab_worker_attempts_total"
    na, nb = metric(a, done, outcome="completed"), metric(b, done, outcome="completed")
    assert na + nb == 12 and na >= 3 and nb >= 3, (na, nb)  # 12 requests > 3 slots: both must work
    assert metric(other, done) == 0
    assert sim_stats(ss)["received"] == 0
    r = await c.chat.completions.create(model=QWEN, messages=HELLO, max_tokens=4)
    assert r.usage is not None and r.usage.completion_tokens == 4
    assert metric(other, done, outcome="completed") == 1
    assert metric(a, done) + metric(b, done) == 12


async def test_worker_dying_before_first_token_is_retried_as_attempt_2(stack: Stack) -> None:
    # A long prefill keeps the attempt before its first token while we kill the worker.
    sim = stack.sim("vllm", LLAMA, ttft_ms=1500, itl_ms=50, output_len=40)
    fast_redelivery = {"LLMLAB_WORKER_ACK_WAIT_S": "2"}
    doomed = stack.worker("vllm", "gpu-vllm", url(sim), max_concurrency=1, env=fast_redelivery, worker_id="w-1")
    # The retry goes to the pool while w-1 restarts: give the restart time on a busy machine.
    gw = stack.gateway(
        queue_timeout_s=20, env={"LLMLAB_GATEWAY_GATEWAY_ID": "gwretry", "LLMLAB_GATEWAY_EMPTY_POOL_WAIT_S": "15"}
    )
    topo = Topology(stack.namespace)
    request_id: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    call = asyncio.create_task(stream_chat(url(gw), request_id))
    await eventually(lambda: sim_stats(sim)["received"] == 1, what="attempt 1 on the engine")
    doomed.kill()  # SIGKILL: no drain, no ack, heartbeats stop
    # The router addressed attempt 1 to w-1's own consumer; w-1 restarts under the same identity
    # (a StatefulSet pod), takes attempt 2 through the pool (the chain's replica retry when the
    # deployment had one worker) and finds attempt 1 redelivered on its own consumer.
    survivor = stack.worker("vllm", "gpu-vllm", url(sim), max_concurrency=1, env=fast_redelivery, worker_id="w-1")
    # Headers arrive with attempt 2's first token; a forged late token of attempt 1 published
    # now must never reach the client.
    rid = await asyncio.wait_for(request_id, 20)
    nc = await connect(stack.nats_url, "forger")
    stale = TokenChunk(request_id=rid, attempt=1, seq=1, text=" STALE-ATTEMPT-1", token_times=[0.0])
    await nc.publish(topo.token_subject("gwretry", rid), stale.model_dump_json().encode())
    await nc.flush()
    await nc.close()
    status, text, finish, _usage, _attempts = await call
    assert status == 200
    assert finish == "stop" and text.strip() and "STALE" not in text
    assert metric(gw, "llmlab_gateway_retries_total") == 1
    assert metric(gw, "llmlab_gateway_stale_messages_total") >= 1

    # JetStream redelivers the unacked attempt 1 (attempt 2 had its own Nats-Msg-Id, so it was not
    # deduplicated). The survivor drops it without generating: as "stale" after asking the gateway,
    # as "cancelled" when it was already up to hear the gateway's cancel of attempt 1, or as
    # "expired" when it only gets to it (busy with attempt 2) after its start deadline.
    def dropped() -> float:
        return sum(
            metric(survivor, "llmlab_worker_attempts_total", outcome=o) for o in ("stale", "cancelled", "expired")
        )

    # (at-least-once: a redelivery can arrive twice; each copy is dropped, none generated)
    await eventually(lambda: dropped() >= 1, timeout=15, what="redelivered attempt 1 dropped")
    assert metric(survivor, "llmlab_worker_attempts_total", outcome="completed") == 1
    assert sim_stats(sim)["received"] == 2


async def test_a_request_can_target_one_worker_of_the_pool(stack: Stack) -> None:
    # The router's prefix affinity sends to <ns>.req.worker.<pool>.<id>: only that worker serves it.
    from llmlab_common.messages import StreamEnd
    from llmlab_testkit.natsclient import WorkerClient

    sim = stack.sim("vllm", LLAMA, ttft_ms=10, itl_ms=5, output_len=8)
    a = stack.worker("vllm", "gpu-vllm", url(sim), worker_id="wa")
    b = stack.worker("vllm", "gpu-vllm", url(sim), worker_id="wb")
    async with WorkerClient(stack.namespace) as wc:
        for i in range(6):
            await wc.publish(wc.request(f"t{i}", "gpu-vllm", LLAMA, prompt="hi", max_tokens=4), worker_id="wb")
        for i in range(6):
            end = (await wc.collect(f"t{i}"))[-1]
            assert isinstance(end, StreamEnd)
    assert metric(b, "llmlab_worker_attempts_total", outcome="completed") == 6
    assert metric(a, "llmlab_worker_attempts_total") == 0
