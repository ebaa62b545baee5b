"""Accounting through the whole stack: gateway (budget auth) → workers → events → accounting → chdb.

One row per attempt and one per request (a retried request, a budget refusal), costs that match a
hand calculation from the usage the client got and the catalog's prices, and the delivery
guarantee on the raw tables: every event stored at least once (a SIGKILL between an insert and its
ack, then the restart's recovery, store it twice; a re-publication once more), exactly once through
FINAL and the views."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml
from llmlab_common.natsio import connect
from llmlab_common.subjects import Topology
from llmlab_testkit.budget import BudgetAdmin
from llmlab_testkit.e2e import LLAMA, client, eventually, metric, sim_stats, stream_chat
from llmlab_testkit.e2e import accounting_sql as sql
from llmlab_testkit.procs import ManagedProcess, Stack, url

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
HELLO = [{"role": "user", "content": "hello"}]
H100_PER_HOUR = 2.99  # configs/catalog.yaml, H100-SXM; llama-8b-vllm runs on 1


def list_prices(model: str) -> tuple[float, float]:
    """(input, output) USD per 1M tokens, read from configs/catalog.yaml itself, not through the
    code under test."""
    doc = yaml.safe_load((REPO / "configs" / "catalog.yaml").read_text())
    (price,) = [p for p in doc["prices"]["models"] if p["model"] == model]
    return float(price["input_per_mtok_usd"]), float(price["output_per_mtok_usd"])


LLAMA_IN, LLAMA_OUT = list_prices(LLAMA)


def list_usd(prompt: int, completion: int) -> float:
    """Hand calculation of a list cost: each token kind at its own price."""
    assert LLAMA_IN != LLAMA_OUT, "with equal prices a swap of input and output would not show"
    return (prompt * LLAMA_IN + completion * LLAMA_OUT) / 1e6


async def wait_rows(acc: ManagedProcess, query: str, want: Any, timeout: float = 30) -> None:
    await eventually(lambda: sql(acc, query) == want, timeout=timeout, what=f"{query} == {want}")


async def test_budget_load_shedding_is_its_own_error_class(stack: Stack) -> None:
    """Catches: the budget service's 429 ``overloaded`` (it sheds load) filed as the gateway's queue
    timeout or as a budget refusal. One reserve is held in Redis (writes paused) so that a second,
    over the budget's bound of one pending reserve, is shed: deterministic, no burst needed."""
    from redis.asyncio import Redis

    sim = stack.sim("vllm", LLAMA, ttft_ms=10, itl_ms=5, output_len=2)
    stack.worker("vllm", "gpu-vllm", url(sim))
    budget = stack.budget(env={"LLMLAB_BUDGET_MAX_PENDING_RESERVES": "1"})
    admin = BudgetAdmin(url(budget))
    gw = stack.gateway(auth="budget")
    acc = stack.accounting(env={"LLMLAB_ACCOUNTING_FLUSH_INTERVAL_S": "0.2"})
    p = admin.provision("pro")
    body = {"model": LLAMA, "messages": HELLO, "max_tokens": 2}
    headers = {"Authorization": f"Bearer {p.api_key}"}
    r = Redis.from_url(stack.redis_url)
    try:
        async with httpx.AsyncClient(timeout=30) as h:
            await r.execute_command("CLIENT", "PAUSE", "5000", "WRITE")
            held = asyncio.create_task(h.post(url(gw) + "/v1/chat/completions", headers=headers, json=body))
            await eventually(lambda: metric(budget, "llmlab_budget_pending_reserves") == 1, what="a pending reserve")
            shed = await h.post(url(gw) + "/v1/chat/completions", headers=headers, json=body)
            await r.execute_command("CLIENT", "UNPAUSE")
            answered = await held
    finally:
        await r.execute_command("CLIENT", "UNPAUSE")
        await r.aclose()
    assert answered.status_code == 200, answered.text
    assert shed.status_code == 429 and shed.json()["error"]["code"] == "overloaded", shed.text
    shed_id, ok_id = shed.headers["x-request-id"], answered.headers["x-request-id"]
    await wait_rows(acc, "SELECT count() FROM requests", [[2]])
    rows = dict(sql(acc, "SELECT request_id, status_class FROM requests"))
    assert rows == {shed_id: "shed_budget", ok_id: "ok"}


async def test_attempts_and_requests_rows_with_hand_calculated_costs(stack: Stack) -> None:
    """Catches: a retried request billed for its lost attempt, or for other tokens than the client
    was told; input and output prices swapped or merged in list cost; GPU time not attributed in
    full."""
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
    call = asyncio.create_task(stream_chat(url(gw), rid, p.api_key, max_tokens=5, include_usage=True, timeout=60))
    await eventually(lambda: sim_stats(sim)["received"] == 1, what="attempt 1 on the engine")

    def busy() -> list[ManagedProcess]:
        return [w for w in workers if metric(w, "llmlab_worker_in_flight_requests") == 1]

    await eventually(lambda: len(busy()) == 1, what="the worker holding attempt 1")
    busy()[0].kill()  # SIGKILL before the first token: no drain, no ack, heartbeats stop
    status, _text, _finish, retried_usage, attempts_header = await call
    retried = rid.result()
    assert status == 200 and attempts_header == "2"
    assert retried_usage["prompt_tokens"] > 0 and retried_usage["completion_tokens"] > 0, retried_usage
    # 2. A plain request, answered by its first attempt.
    r = await client(gw, p.api_key).chat.completions.with_raw_response.create(model=LLAMA, messages=HELLO, max_tokens=3)
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
            (
                retried,
                sql(acc, "SELECT request_id, attempt, source, outcome, error_code FROM attempts_raw FINAL"),
            )
        ) from None
    rows = {
        (r[0], r[1]): r[2:]
        for r in sql(
            acc,
            "SELECT request_id, attempt, source, status_class, billed_input_tokens, billed_output_tokens,"
            " list_cost_usd FROM attempts",
        )
    }
    # One row per attempt, no more: the retried request's two and the plain one's.
    assert set(rows) == {(retried, 1), (retried, 2), (plain, 1)}
    assert rows[(retried, 1)] == ["gateway", "server_error", 0, 0, 0]  # worker lost: not billed
    # Hand calculation from what the client was told: the answering attempt bills the usage the
    # client got, input and output tokens each at the catalog's own price; the lost attempt nothing.
    r_in, r_out = retried_usage["prompt_tokens"], retried_usage["completion_tokens"]
    p_in, p_out = plain_usage.prompt_tokens, plain_usage.completion_tokens
    assert r_in != r_out and p_in != p_out and r_out != p_out  # else a swap or a mix-up could not show
    assert rows[(retried, 2)][:4] == ["worker", "ok", r_in, r_out]
    assert rows[(retried, 2)][4] == pytest.approx(list_usd(r_in, r_out))
    assert rows[(plain, 1)][:4] == ["worker", "ok", p_in, p_out]
    assert rows[(plain, 1)][4] == pytest.approx(list_usd(p_in, p_out))

    reqs = {
        r[0]: r[1:]
        for r in sql(
            acc, "SELECT request_id, attempts, status_class, http_status, billed_tokens, list_cost_usd FROM requests"
        )
    }
    assert reqs[retried][:4] == [2, "ok", 200, r_in + r_out]
    assert reqs[retried][4] == pytest.approx(list_usd(r_in, r_out))  # the lost attempt adds nothing
    assert reqs[plain][:4] == [1, "ok", 200, p_in + p_out]
    assert reqs[plain][4] == pytest.approx(list_usd(p_in, p_out))
    assert reqs[refused_id] == [0, "refused_budget", 429, 0, 0]

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


# -- exactly once, on the raw tables ------------------------------------------------------------------
# chdb merges small parts within a second or so, and a ReplacingMergeTree merge collapses the
# duplicates at a time of its choosing: the raw count would be anything between the number of
# events and the number of rows inserted. The test's store has no background merges (a table
# setting, made before the service first opens the directory), so count() without FINAL is
# exactly the rows inserted.
_PREPARE_STORE = """
import sys
from pathlib import Path
from llmlab_accounting.store import ClickHouseStore
s = ClickHouseStore.open(data_dir=Path(sys.argv[1]))
try:
    s.ensure_schema()
    for t in ("attempts_raw", "requests_raw"):
        s.client.command(f"ALTER TABLE {t} MODIFY SETTING max_bytes_to_merge_at_max_space_in_pool = 1")
    where = "database = currentDatabase() AND name = 'attempts_raw'"
    print(s.scalar("SELECT data_paths[1] FROM system.tables WHERE " + where))
finally:
    s.close()
"""
_PART = re.compile(r"^\d+_\d+_\d+_\d+$")  # a committed part: <partition>_<min block>_<max block>_<level>


def prepare_store(data_dir: Path) -> Path:
    """Create the schema in ``data_dir`` with merges of the raw tables off; return the directory
    of ``attempts_raw``'s parts. (In a subprocess: chdb stays out of the test process.)"""
    out = subprocess.run(
        [sys.executable, "-c", _PREPARE_STORE, str(data_dir)], capture_output=True, text=True, timeout=120, check=True
    )
    return Path(out.stdout.strip().splitlines()[-1])


def parts(table_dir: Path) -> int:
    """Committed parts of a table: an insert's part gets its name only once all its files are written."""
    return sum(1 for d in table_dir.iterdir() if d.is_dir() and _PART.match(d.name))


def store_pid(data_dir: Path) -> int:
    """The service's chdb child process: the writer lock file holds its pid."""
    return int((data_dir / "accounting.lock").read_text())


def _states(pid: int) -> set[str]:
    states = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):  # a thread that just exited
            states.add(Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()[0])
    return states


async def pause(pid: int) -> None:
    """SIGSTOP, and wait until every thread of the process is stopped (state T)."""
    os.kill(pid, signal.SIGSTOP)
    await eventually(lambda: _states(pid) <= {"T"}, what=f"pid {pid} stopped")


async def resume(pid: int) -> None:
    os.kill(pid, signal.SIGCONT)
    await eventually(lambda: "T" not in _states(pid), what=f"pid {pid} running")


async def kill_between_insert_and_ack(acc: ManagedProcess, child: int, table_dir: Path) -> None:
    """With the store child stopped and a batch waiting on it: stop the service, let the child
    run until the batch's part is committed, then SIGKILL the service (and the child with it). The
    service never runs while the child can insert, nor the child while the service can ack, so
    the kill lands after the insert and before its ack, whatever the machine's speed. (Should the
    service not have handed the batch over yet, it gets another turn with the child stopped.)"""
    before = parts(table_dir)
    for _ in range(30):
        await pause(acc.pid)
        await resume(child)
        deadline = time.monotonic() + 10
        while parts(table_dir) == before and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await pause(child)  # both stopped: what is on disk now is what the kill leaves
        if parts(table_dir) > before:
            break
        await resume(acc.pid)
        await asyncio.sleep(1)
    assert parts(table_dir) == before + 1, "the batch's insert never landed"
    acc.kill()  # SIGKILL to the process group: the stopped service and its stopped store child


async def test_killed_between_insert_and_ack_restarted_and_redelivered_rows_stay_exactly_once(stack: Stack) -> None:
    """The delivery guarantee, with exact counts on the raw tables: at least once (a batch killed
    before its insert is stored once by the restart's recovery; one killed between its insert and
    its ack is stored twice, a re-published event once more), exactly once through FINAL and the
    views. Catches: an event lost (acked before its insert, or no recovery after a kill), a batch
    inserted twice, a table key that does not collapse a re-inserted event, totals that drift
    with duplicates."""
    sim = stack.sim("vllm", LLAMA, ttft_ms=10, itl_ms=5, output_len=6)
    stack.worker("vllm", "gpu-vllm", url(sim), max_concurrency=8)
    gw = stack.gateway()
    data_dir = stack.workdir / "accounting"
    attempts_dir = prepare_store(data_dir)
    env = {
        # No redelivery by the server within the test: what is inserted twice comes from the
        # restart's recovery and from our re-publication only, so the counts below are exact.
        "LLMLAB_ACCOUNTING_ACK_WAIT_S": "900",
        # The store child serves ingest only (no attribution run or heartbeat batch behind it).
        "LLMLAB_ACCOUNTING_ATTRIBUTION_PERIOD_S": "3600",
        "LLMLAB_ACCOUNTING_HEARTBEAT_FLUSH_S": "3600",
        "LLMLAB_ACCOUNTING_FLUSH_INTERVAL_S": "0.2",
    }
    # Batches of exactly 10 events, closed by size, never by time: the 10 events sent at once are
    # one batch however slowly they come.
    by_tens = {**env, "LLMLAB_ACCOUNTING_BATCH_ROWS": "10", "LLMLAB_ACCOUNTING_FLUSH_INTERVAL_S": "600"}
    topo = Topology(stack.namespace)
    nc = await connect(stack.nats_url, "test-accounting")
    js = nc.jetstream()
    c = client(gw)
    usages: list[tuple[int, int]] = []

    async def send(n: int) -> None:
        rs = await asyncio.gather(
            *[c.chat.completions.create(model=LLAMA, messages=HELLO, max_tokens=4) for _ in range(n)]
        )
        for r in rs:
            assert r.usage is not None
            usages.append((r.usage.prompt_tokens, r.usage.completion_tokens))
            assert r.usage.prompt_tokens != r.usage.completion_tokens  # else a price swap would not show

    async def fetched_not_acked(n: int) -> None:
        deadline = time.monotonic() + 30
        while (info := await js.consumer_info(topo.events_stream, topo.ACCOUNTING_CONSUMER)).num_ack_pending < n:
            assert time.monotonic() < deadline, f"want {n} events fetched and not acked: {info}"
            await asyncio.sleep(0.1)
        assert info.num_ack_pending == n and info.num_pending == 0, f"want {n} events fetched and not acked: {info}"

    def committing(acc: ManagedProcess) -> float:
        """Events of the batches the commit loop has taken (counted before their insert)."""
        return sum(metric(acc, "llmlab_accounting_events_total", kind=k) for k in ("attempt", "request"))

    def counts(acc: ManagedProcess) -> list[int]:
        return sql(
            acc,
            "SELECT (SELECT count() FROM attempts_raw), (SELECT count() FROM requests_raw),"
            " (SELECT count() FROM attempts_raw FINAL), (SELECT count() FROM requests_raw FINAL)",
        )[0]

    stopped: list[int] = []
    try:
        # 1. Killed after fetching, before inserting: the store child is stopped, nothing can land.
        acc = stack.accounting(data_dir=data_dir, env=by_tens)
        child = store_pid(data_dir)
        await pause(child)
        stopped.append(child)
        await send(10)
        with pytest.raises(openai.NotFoundError):  # refused before any attempt: one request event
            await c.chat.completions.create(model="no-such-model", messages=HELLO, max_tokens=4)
        await fetched_not_acked(11)
        # The first batch is in the commit loop, its insert held up: nothing may be acked.
        await eventually(lambda: committing(acc) == 10, what="batch 1 committing")
        await asyncio.sleep(1)
        await fetched_not_acked(11)
        acc.kill()
        stopped.clear()

        # The restart re-reads what its predecessor fetched and never acked: stored once.
        acc = stack.accounting(data_dir=data_dir, env=by_tens)
        assert counts(acc) == [10, 1, 10, 1]

        # 2. Killed between the insert of a batch and its ack.
        child = store_pid(data_dir)
        await pause(child)
        stopped.append(child)
        await send(10)
        await fetched_not_acked(21)  # batch 1 is still unacked (recovery inserts, it does not ack)
        await eventually(lambda: committing(acc) == 10, what="batch 2 committing")
        stopped.append(acc.pid)
        await kill_between_insert_and_ack(acc, child, attempts_dir)
        stopped.clear()

        # The restart's recovery stores every unacked event again: batch 1 (recovered once
        # already) and batch 2 (inserted before the kill) are now twice in the raw tables.
        acc = stack.accounting(data_dir=data_dir, env=env)
        assert counts(acc) == [40, 2, 20, 1]
        totals = sql(acc, "SELECT count(), countIf(attempts = 1), sum(billed_tokens), sum(list_cost_usd) FROM requests")

        # 3. Redeliver on purpose: every event of the stream published again as a new message.
        info = await js.stream_info(topo.events_stream)
        assert (info.state.first_seq, info.state.last_seq) == (1, 21)
        for seq in range(1, 22):
            m = await js.get_msg(topo.events_stream, seq)
            assert m.subject is not None and m.data is not None
            await js.publish(m.subject, m.data)
        deadline = time.monotonic() + 30
        while True:  # all acked: the ack of the re-published batch covers the older unacked ones
            ci = await js.consumer_info(topo.events_stream, topo.ACCOUNTING_CONSUMER)
            if ci.num_pending == 0 and ci.num_ack_pending == 0:
                break
            assert time.monotonic() < deadline, ci
            await asyncio.sleep(0.1)
        assert counts(acc) == [60, 3, 20, 1]
        assert sql(acc, "SELECT count() FROM attempts") == [[20]]
        # Totals through the views are those of 20 answered requests and 1 refused, once each.
        assert (
            sql(acc, "SELECT count(), countIf(attempts = 1), sum(billed_tokens), sum(list_cost_usd) FROM requests")
            == totals
        )
        assert totals[0][:3] == [21, 20, sum(i + o for i, o in usages)]
        assert totals[0][3] == pytest.approx(sum(list_usd(i, o) for i, o in usages))
    finally:
        for pid in stopped:  # never leave a stopped process behind a failed assertion
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        await nc.close()
