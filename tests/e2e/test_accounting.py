"""Accounting through the whole stack: gateway (budget auth) → workers → events → accounting → chdb.

One row per attempt and one per request (a retried request, a budget refusal), costs that match a
hand calculation, and exactly-once rows after a SIGKILL mid-batch, a restart and on-purpose
redelivery."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest
from llmlab_common.natsio import connect
from llmlab_common.subjects import Topology
from llmlab_testkit.budget import DEV_ADMIN_KEY, BudgetAdmin
from llmlab_testkit.e2e import LLAMA, client, eventually, metric, sim_stats, stream_chat
from llmlab_testkit.procs import ManagedProcess, Stack, url

pytestmark = pytest.mark.e2e
HELLO = [{"role": "user", "content": "hello"}]
H100_PER_HOUR = 2.99  # configs/catalog.yaml, H100-SXM; llama-8b-vllm runs on 1
LLAMA_PER_MTOK = 0.18  # input and output list price of Llama-3.1-8B


def sql(acc: ManagedProcess, query: str) -> list[list[Any]]:
    r = httpx.post(
        url(acc) + "/admin/v1/query",
        json={"sql": query},
        headers={"Authorization": f"Bearer {DEV_ADMIN_KEY}"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    return r.json()["rows"]  # type: ignore[no-any-return]


async def wait_rows(acc: ManagedProcess, query: str, want: Any, timeout: float = 30) -> None:
    await eventually(lambda: sql(acc, query) == want, timeout=timeout, what=f"{query} == {want}")


async def test_attempts_and_requests_rows_with_hand_calculated_costs(stack: Stack) -> None:
    # A long prefill keeps attempt 1 before its first token while we kill its worker.
    sim = stack.sim("vllm", LLAMA, ttft_ms=4000, itl_ms=20, output_len=8)
    fast_redelivery = {"LLMLAB_WORKER_ACK_WAIT_S": "2"}
    # Two one-slot workers up front: whichever takes attempt 1 is killed, the other answers the
    # retry (no process start inside the kill window, which a loaded machine could stretch).
    workers = [stack.worker("vllm", "gpu-vllm", url(sim), max_concurrency=1, env=fast_redelivery) for _ in range(2)]
    admin = BudgetAdmin(url(stack.budget()))
    gw = stack.gateway(auth="budget")
    acc = stack.accounting(
        env={
            "LLMLAB_ACCOUNTING_FLUSH_INTERVAL_S": "0.2",
            "LLMLAB_ACCOUNTING_ATTRIBUTION_PERIOD_S": "2",
            "LLMLAB_ACCOUNTING_ATTRIBUTION_LAG_S": "0.5",
            "LLMLAB_ACCOUNTING_ATTRIBUTION_LOOKBACK_PERIODS": "30",
            "LLMLAB_ACCOUNTING_HEARTBEAT_FLUSH_S": "0.5",
        }
    )
    p = admin.provision("pro")
    tiny = admin.provision("pro", {"key": {"daily_tokens": 200}})  # below input + margin + minimum

    # 1. A request whose first worker dies before the first token: retried as attempt 2.
    rid: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    call = asyncio.create_task(stream_chat(url(gw), rid, p.api_key, max_tokens=8))
    await eventually(lambda: sim_stats(sim)["received"] == 1, what="attempt 1 on the engine")

    def busy() -> list[ManagedProcess]:
        return [w for w in workers if metric(w, "llmlab_worker_in_flight_requests") == 1]

    await eventually(lambda: len(busy()) == 1, what="the worker holding attempt 1")
    busy()[0].kill()  # SIGKILL before the first token: no drain, no ack, heartbeats stop
    status, _text, _finish = await call
    retried = rid.result()
    assert status == 200
    # 2. A plain request, answered by its first attempt.
    r = await client(gw, p.api_key).chat.completions.with_raw_response.create(model=LLAMA, messages=HELLO, max_tokens=8)
    plain, plain_usage = r.headers["x-request-id"], r.parse().usage
    assert plain_usage is not None
    # 3. A request the budget refuses.
    async with httpx.AsyncClient() as h:
        refused = await h.post(
            url(gw) + "/v1/chat/completions",
            headers={"Authorization": f"Bearer {tiny.api_key}"},
            json={"model": LLAMA, "messages": HELLO},
            timeout=10,
        )
    assert refused.status_code == 429
    refused_id = refused.headers["x-request-id"]

    await wait_rows(acc, "SELECT count() FROM requests", [[3]])
    raw = f"SELECT attempt, source FROM attempts_raw FINAL WHERE request_id = '{retried}' ORDER BY 1, 2"
    # the gateway's worker_lost for attempt 1 and the survivor's completed attempt 2 (a redelivered
    # attempt 1, when the survivor drops it, adds a worker row that the view ranks last)
    try:
        await eventually(lambda: len(sql(acc, raw)) >= 2, timeout=20, what="the retried request's events")
    except AssertionError:
        raise AssertionError(
            (retried, sql(acc, "SELECT request_id, attempt, source, outcome, error_code FROM attempts_raw FINAL"))
        ) from None
    assert sql(acc, "SELECT count(), uniqExact(request_id, attempt) FROM attempts") == [[3, 3]]
    rows = {
        (r[0], r[1]): r[2:]
        for r in sql(
            acc,
            "SELECT request_id, attempt, source, status_class, billed_tokens, list_cost_usd FROM attempts",
        )
    }
    assert rows[(retried, 1)][:3] == ["gateway", "server_error", 0]  # worker lost: not billed
    assert rows[(retried, 2)][:2] == ["worker", "ok"]
    assert rows[(plain, 1)][:2] == ["worker", "ok"]
    # Hand calculation: list cost = (prompt + completion) × $0.18 / 1M for the answered attempt.
    plain_tokens = plain_usage.prompt_tokens + plain_usage.completion_tokens
    assert rows[(plain, 1)][2] == plain_tokens
    assert rows[(plain, 1)][3] == pytest.approx(plain_tokens * LLAMA_PER_MTOK / 1e6)

    reqs = {
        r[0]: r[1:]
        for r in sql(acc, "SELECT request_id, attempts, status_class, http_status, billed_tokens FROM requests")
    }
    assert reqs[retried][:3] == [2, "ok", 200]
    assert reqs[plain] == [1, "ok", 200, plain_tokens]
    assert reqs[refused_id] == [0, "refused_budget", 429, 0]

    # GPU time: every worker-period costs $2.99/h × its length; all of it is attributed (idle
    # included), and so is a standby worker's (heartbeats, no attempt) when its deployment served
    # something in that period; otherwise it stays unattributed.
    async def attributed() -> bool:
        got = sql(acc, "SELECT count() FROM gpu_attribution FINAL WHERE request_id IN ('" + plain + "')")
        standby = sql(acc, "SELECT count() FROM gpu_periods FINAL WHERE attempts = 0")
        return bool(got[0][0]) and bool(standby[0][0])

    deadline = time.monotonic() + 30
    while not await attributed():
        assert time.monotonic() < deadline, "attribution of the plain request and of standby workers"
        await asyncio.sleep(0.5)
    periods = sql(
        acc,
        "SELECT toString(period_start), deployment, attempts, period_s, usd_per_hour, period_usd, attributed_usd "
        "FROM gpu_periods FINAL",
    )
    served = {(start, dep) for start, dep, n, *_ in periods if n > 0}
    for start, dep, _n, period_s, rate, period_usd, attributed_usd in periods:
        assert dep == "llama-8b-vllm" and rate == pytest.approx(H100_PER_HOUR)
        assert period_usd == pytest.approx(H100_PER_HOUR * period_s / 3600)
        assert attributed_usd == pytest.approx(period_usd if (start, dep) in served else 0.0)
    total = sql(acc, "SELECT sum(gpu_cost_usd) FROM gpu_attribution FINAL")[0][0]
    assert total == pytest.approx(sum(p[6] for p in periods))
    assert sql(acc, f"SELECT gpu_cost_usd > 0 FROM requests WHERE request_id = '{plain}'") == [[1]]


async def test_killed_mid_batch_restarted_and_redelivered_rows_stay_exactly_once(stack: Stack) -> None:
    sim = stack.sim("vllm", LLAMA, ttft_ms=10, itl_ms=5, output_len=6)
    stack.worker("vllm", "gpu-vllm", url(sim), max_concurrency=8)
    gw = stack.gateway()
    # Long batches and a short ack wait: the kill lands while events are fetched but not inserted.
    slow = {"LLMLAB_ACCOUNTING_FLUSH_INTERVAL_S": "30", "LLMLAB_ACCOUNTING_ACK_WAIT_S": "3"}
    acc = stack.accounting(env=slow)
    data_dir = stack.workdir / "accounting"
    c = client(gw)
    await asyncio.gather(*[c.chat.completions.create(model=LLAMA, messages=HELLO, max_tokens=6) for _ in range(10)])
    topo = Topology(stack.namespace)
    nc = await connect(stack.nats_url, "test-accounting")
    js = nc.jetstream()
    try:

        async def fetched_not_acked() -> int:
            info = await js.consumer_info(topo.events_stream, topo.ACCOUNTING_CONSUMER)
            return int(info.num_ack_pending)

        deadline = time.monotonic() + 20
        while await fetched_not_acked() < 10:
            assert time.monotonic() < deadline, "accounting never fetched the events"
            await asyncio.sleep(0.1)
        acc.kill()  # SIGKILL mid-batch: fetched, not inserted, not acked
        acc = stack.accounting(data_dir=data_dir, env={"LLMLAB_ACCOUNTING_ACK_WAIT_S": "3"})
        await wait_rows(acc, "SELECT count(), uniqExact(request_id, attempt) FROM attempts", [[10, 10]])
        totals = sql(acc, "SELECT count(), sum(billed_tokens), sum(list_cost_usd) FROM requests")

        # Redeliver on purpose: every event of the stream published again as a new message.
        info = await js.stream_info(topo.events_stream)
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            m = await js.get_msg(topo.events_stream, seq)
            if m.subject == topo.attempt_event_subject and m.data:
                await js.publish(m.subject, m.data)
        deadline = time.monotonic() + 20
        while True:
            ci = await js.consumer_info(topo.events_stream, topo.ACCOUNTING_CONSUMER)
            if ci.num_pending == 0 and ci.num_ack_pending == 0:
                break
            assert time.monotonic() < deadline, ci
            await asyncio.sleep(0.1)
        assert sql(acc, "SELECT count(), uniqExact(request_id, attempt) FROM attempts") == [[10, 10]]
        assert sql(acc, "SELECT count(), sum(billed_tokens), sum(list_cost_usd) FROM requests") == totals
        raw = sql(acc, "SELECT count() FROM attempts_raw")[0][0]
        assert raw >= 10  # duplicates may sit in the raw table until a merge; FINAL hides them
    finally:
        await nc.close()
