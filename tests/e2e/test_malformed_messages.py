"""Garbage on every subject a service consumes: every service stays up and ready, a request on a
request/reply subject gets an error answer (not silence), every bad message on a JetStream
subject is dead-lettered with its reason (not retried forever, not dropped unseen), and the good
traffic after it is served and billed."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import pytest
from llmlab_common.messages import (
    ReserveBatchReply,
    ReserveReply,
    RouteBatch,
    RouteBatchReply,
    RouteQuery,
    RouteReply,
)
from llmlab_common.natsio import connect
from llmlab_common.subjects import Topology
from llmlab_testkit.budget import BudgetAdmin
from llmlab_testkit.e2e import LLAMA, accounting_sql, client, edited_json, metric
from llmlab_testkit.procs import ManagedProcess, Stack, url
from nats.aio.msg import Msg

pytestmark = pytest.mark.e2e
GW = "gwmalformed"


def _attempt(request_id: str, **changes: Any) -> bytes:
    body: dict[str, Any] = {
        "schema_version": 1,
        "request_id": request_id,
        "attempt": 1,
        "outcome": "completed",
        "source": "worker",
        "pool": "gpu-vllm",
        "deployment": "llama-8b-vllm",
        "model": LLAMA,
        "endpoint": "chat",
        "principal": {},
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        "created_at": time.time(),
        "ended_at": time.time(),
    }
    return edited_json(json.dumps(body), **changes)


def _garbage(marker: str) -> list[bytes]:
    """Each carries its marker, so its dead letter can be found."""
    return [
        f"not json {marker}".encode(),
        json.dumps({"marker": marker}).encode(),
        json.dumps([marker, 1, 2]).encode(),
        b"\xff\xfe" + marker.encode(),
    ]


async def test_garbage_on_every_subject_is_refused_or_dead_lettered_and_traffic_goes_on(stack: Stack) -> None:
    topo = Topology(stack.namespace)
    sim = stack.sim("vllm", LLAMA, ttft_ms=5, itl_ms=1, output_len=4)
    worker = stack.worker("vllm", "gpu-vllm", url(sim))
    budget = stack.budget(env={"LLMLAB_BUDGET_SETTLE_MAX_DELIVER": "2"})
    router = stack.router()
    acc = stack.accounting(env={"LLMLAB_ACCOUNTING_FLUSH_INTERVAL_S": "0.2"})
    gw = stack.gateway(auth="budget", router="service", env={"LLMLAB_GATEWAY_GATEWAY_ID": GW})
    procs: dict[str, ManagedProcess] = {
        "worker": worker,
        "budget": budget,
        "router": router,
        "accounting": acc,
        "gateway": gw,
    }
    key = BudgetAdmin(url(budget)).provision("pro").api_key
    nc = await connect(stack.nats_url, "malformed-test")
    js = nc.jetstream()
    dead: list[tuple[bytes, str]] = []

    async def on_dead(msg: Msg) -> None:
        dead.append((msg.data, (msg.headers or {}).get("Llmlab-Reason", "")))

    await nc.subscribe(topo.dead_letter_subject, cb=on_dead)
    try:
        # JetStream subjects: the worker's requests, and the events budget and accounting settle.
        jetstream = {
            "request": (topo.pool_subject("gpu-vllm"), _garbage("req")),
            "attempt event": (
                topo.attempt_event_subject,
                [
                    *_garbage("att"),
                    _attempt("att-huge", usage__prompt_tokens=10**20),
                    _attempt("att-time", ended_at=1e300),
                ],
            ),
            "request event": (topo.request_event_subject, _garbage("rev")),
        }
        for subject, payloads in jetstream.values():
            for p in payloads:
                await js.publish(subject, p)
        # Core subjects: tokens to the gateway (lone and batched), its alive probe, heartbeats,
        # cancels, shared routing decisions, and the two request/reply services.
        for subject in (
            topo.token_subject(GW, "r-unknown"),
            topo.token_batch_subject(GW),
            topo.heartbeat_subject("gpu-vllm", "w-forged"),
            topo.cancel_subject,
            topo.router_commit_subject("gw-forged"),  # the router follows shared-mode decisions
        ):
            for p in [*_garbage("core"), b"{" * 5000]:
                await nc.publish(subject, p)
        answers = {  # how each request/reply subject's refusal reads
            topo.alive_subject(GW): None,
            topo.budget_reserve_subject: ReserveReply,
            topo.budget_reserve_batch_subject: ReserveBatchReply,
            topo.router_route_subject: RouteReply,
            topo.router_route_batch_subject: RouteBatchReply,
        }
        for subject, shape in answers.items():
            for p in _garbage("rr"):
                reply = await nc.request(subject, p, timeout=5)  # an answer, not silence
                if shape is not None:
                    assert shape.model_validate_json(reply.data).error is not None, (subject, p[:60])
        # A good batch of route queries: one reply per query, in order.
        queries = [RouteQuery(request_id=f"rq{i}", model=LLAMA, prompt_tokens=5, max_output_tokens=4) for i in range(3)]
        reply = await nc.request(
            topo.router_route_batch_subject, RouteBatch(queries=queries).model_dump_json().encode(), 5
        )
        routed = RouteBatchReply.model_validate_json(reply.data)
        assert [r.request_id for r in routed.replies] == ["rq0", "rq1", "rq2"] and routed.error is None
        reserve = json.dumps({"schema_version": 1, "request_id": "rr-huge", "key_sha256": "0" * 64}).encode()
        huge = json.loads(reserve) | {"input_tokens": 10**20}
        reply = ReserveReply.model_validate_json(
            (await nc.request(topo.budget_reserve_subject, json.dumps(huge).encode(), timeout=5)).data
        )
        assert reply.error is not None and reply.error.status < 500, reply

        # Every bad JetStream message reaches the dead letters, with its reason.
        def lettered(payload: bytes) -> bool:
            return any(d == payload for d, _ in dead)

        deadline = time.monotonic() + 30
        want = [p for _, payloads in jetstream.values() for p in payloads]
        while not all(lettered(p) for p in want):
            assert time.monotonic() < deadline, [p[:60] for p in want if not lettered(p)]
            await asyncio.sleep(0.2)
        assert all(reason for _, reason in dead)

        # Every service is up and ready, and good traffic after the garbage is served and billed.
        async with httpx.AsyncClient(timeout=10) as h:
            for name, p in procs.items():
                assert p.proc is not None and p.proc.poll() is None, f"{name} died"
                r = await h.get(url(p) + "/ready")
                assert r.status_code == 200, (name, r.text)
        r = await client(gw, key).chat.completions.with_raw_response.create(
            model=LLAMA, messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        rid = r.headers["x-request-id"]
        deadline = time.monotonic() + 20
        while accounting_sql(acc, f"SELECT count() FROM attempts WHERE request_id = '{rid}'") != [[1]]:
            assert time.monotonic() < deadline, "the good request after the garbage was not billed"
            await asyncio.sleep(0.2)
        assert metric(worker, "llmlab_worker_attempts_total", outcome="malformed") >= len(jetstream["request"][1])
    finally:
        await nc.close()
