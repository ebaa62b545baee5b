"""`python -m llmlab_accounting.explain` on requests that went through the whole stack (budget
auth, router service, worker, simulator, accounting): every phase is measured, their sum covers the
request's time measured apart from them (accepted → ended, the row's wall clocks), each phase is
where the simulator and the gateway put the time, and ``--slowest`` finds the slow request."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import pytest
from llmlab_testkit.budget import BudgetAdmin
from llmlab_testkit.e2e import LLAMA, eventually, metric, stream_chat
from llmlab_testkit.e2e import accounting_sql as sql
from llmlab_testkit.procs import ManagedProcess, Stack, url

pytestmark = pytest.mark.e2e
TTFT_S, ITL_S = 0.3, 0.02


def explain(acc: ManagedProcess, *args: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-m", "llmlab_accounting.explain", "--url", url(acc), "--json", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(out.stdout)  # type: ignore[no-any-return]


async def test_explain_latency_splits_a_request_where_its_time_went(stack: Stack) -> None:
    """Catches: admission time not carried to the row (gateway → worker → accounting), a stamp
    lost on the way or a phase counted twice (the measured parts no longer cover the independently
    measured total), the engine's first-token time or the
    decode time put in the wrong phase, and --slowest picking another request."""
    sim = stack.sim("vllm", LLAMA, ttft_ms=TTFT_S * 1000, itl_ms=ITL_S * 1000, output_len=64)
    stack.worker("vllm", "gpu-vllm", url(sim))
    admin = BudgetAdmin(url(stack.budget()))
    stack.router()
    gw = stack.gateway(auth="budget", router="service", env={"LLMLAB_GATEWAY_ROUTE_AHEAD_MAX_ADMITTING": "16"})
    acc = stack.accounting(env={"LLMLAB_ACCOUNTING_FLUSH_INTERVAL_S": "0.2"})
    key = admin.provision("pro").api_key
    loop = asyncio.get_running_loop()

    async def one(max_tokens: int) -> tuple[str, float]:
        rid: asyncio.Future[str] = loop.create_future()
        t0 = time.monotonic()
        got = await stream_chat(url(gw), rid, key, max_tokens=max_tokens, include_usage=True)
        assert got.status == 200 and got.usage["completion_tokens"] == max_tokens, got
        return rid.result(), time.monotonic() - t0

    short, _ = await one(4)
    slow, client_s = await one(30)
    # The second request's key was admitted moments before: it was routed while its reserve was
    # on the way (route-ahead), through the real budget and router services, and the decision used.
    ahead = {o: metric(gw, "llmlab_gateway_route_ahead_total", outcome=o) for o in ("used", "rerouted", "refused")}
    assert ahead == {"used": 1, "rerouted": 0, "refused": 0}, ahead
    await eventually(
        lambda: sql(acc, f"SELECT count() FROM attempts WHERE request_id IN ('{short}', '{slow}')") == [[2]],
        timeout=30,
        what="both rows ingested",
    )
    s = explain(acc, slow)
    phases = {p["name"]: p["seconds"] for p in s["phases"]}  # type: ignore[union-attr, index]
    assert s["request_id"] == slow and s["answering_attempt"] == 1 and s["completion_tokens"] == 30
    # Every phase measured from its own stamps (a stamp lost on the way shows as None here). The
    # engine queue alone may be unknown: an HTTP engine does not report it per request and the
    # window estimate needs two heartbeats; prefill then holds the whole first-token time.
    assert [k for k, v in phases.items() if v is None] in ([], ["engine queue"]), phases
    assert phases["gateway: auth + reserve"] and phases["gateway: route"], phases  # not 0 either
    # The request's time measured apart from the phases: the row's ended_at - created_at (worker's
    # and gateway's wall clocks, millisecond precision). The phases must cover it: what no stamp
    # measures (the gateway between admission and routing, the worker's bookkeeping) is
    # microseconds; the tolerance allows 5 ms + 1% for the rows' millisecond rounding.
    total = float(s["total_s"])  # type: ignore[arg-type]
    accounted = sum(v for v in phases.values() if v is not None)
    assert abs(total - accounted) <= 0.005 + 0.01 * total, (total, accounted, phases)
    # The client waited for all of it and a little more (HTTP, the last hop): never less.
    assert total <= client_s + 0.005 and total > client_s - 0.25, (total, client_s)
    # The simulator's first token takes TTFT_S (queue + prefill), each next one ITL_S.
    first = (phases["engine queue"] or 0) + phases["prefill"]  # type: ignore[operator]
    assert TTFT_S - 0.01 <= first <= TTFT_S + 0.25, phases
    assert 29 * ITL_S * 0.9 <= phases["decode"] <= 29 * ITL_S + 0.3, phases  # type: ignore[operator]
    assert explain(acc, "--slowest")["request_id"] == slow
