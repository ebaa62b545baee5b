"""Batched reserves over real NATS and Redis: one message, one reply per request in order, the
same limits as one request per message, and the ledger's pipeline keeps each answer its own."""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from llmlab_budget.directory import Directory
from llmlab_budget.ledger import Ledger, _lua
from llmlab_budget.metrics import BudgetMetrics
from llmlab_budget.service import BudgetService
from llmlab_budget.settings import BudgetSettings
from llmlab_budget.transport import BudgetTransport
from llmlab_budget.windows import Windows
from llmlab_common.catalog import load_catalog
from llmlab_common.messages import ReserveBatch, ReserveBatchReply, ReserveReply, ReserveRequest
from llmlab_common.metrics import Metrics
from llmlab_common.natsio import connect, delete_streams, ensure_streams
from llmlab_common.subjects import Topology

pytestmark = pytest.mark.integration
CATALOG = load_catalog(Path(__file__).resolve().parents[3] / "configs" / "catalog.yaml")


@pytest.fixture
async def budget(redis_layout) -> AsyncIterator[tuple]:
    redis, layout = redis_layout
    topo = Topology(f"tb{uuid.uuid4().hex[:8]}")
    nc = await connect("nats://127.0.0.1:4222", "test-budget-batch")
    js = nc.jetstream()
    await ensure_streams(js, topo)
    directory = Directory(redis, layout, CATALOG)
    ledger = Ledger(redis, layout, 3600)
    settings = BudgetSettings(max_pending_reserves=50)
    svc = BudgetService(settings, CATALOG, directory, ledger, BudgetMetrics(Metrics("test")))
    transport = BudgetTransport(nc, js, topo, svc, settings)
    await transport.start()
    t = await directory.create_tenant("t", "pro")
    team = await directory.create_team(t.id, "team")
    user = await directory.create_user(team.id, "u")
    key, plaintext = await directory.create_key(user.id, "k")
    try:
        yield nc, topo, directory, key, hashlib.sha256(plaintext.encode()).hexdigest(), ledger
    finally:
        await transport.stop()
        await delete_streams(js, topo)
        await nc.close()


def req(sha: str, rid: str, max_tokens: int = 100) -> ReserveRequest:
    return ReserveRequest(request_id=rid, key_sha256=sha, input_tokens=10, requested_max_tokens=max_tokens)


async def ask_batch(nc, topo: Topology, reqs: list[ReserveRequest]) -> ReserveBatchReply:
    msg = await nc.request(topo.budget_reserve_batch_subject, ReserveBatch(requests=reqs).model_dump_json().encode(), 5)
    return ReserveBatchReply.model_validate_json(msg.data)


async def test_a_batch_is_answered_in_order_under_the_same_limits(budget) -> None:
    nc, topo, directory, key, sha, _ = budget
    await directory.set_overrides("key", key.id, {"max_concurrent": 3})
    reqs = [req(sha, f"b{i}", max_tokens=20 + i) for i in range(5)]
    reqs.insert(2, req("0" * 64, "unknown"))
    reply = await ask_batch(nc, topo, reqs)
    assert reply.error is None
    assert [r.request_id for r in reply.replies] == [r.request_id for r in reqs]
    by_id = {r.request_id: r for r in reply.replies}
    assert by_id["unknown"].error is not None and by_id["unknown"].error.status == 401
    granted = [r for r in reply.replies if r.error is None]
    refused = [r for r in reply.replies if r.error is not None and r.request_id != "unknown"]
    assert len(granted) == 3 and len(refused) == 2  # max_concurrent 3, as three single requests would get
    assert all(r.error is not None and r.error.status == 429 for r in refused)
    for r in granted:  # each answer is its own request's (the pipeline keeps the order)
        assert r.max_tokens == 20 + int(r.request_id[1:])
    # The single-request subject still answers, and sees the batch's reservations.
    msg = await nc.request(topo.budget_reserve_subject, req(sha, "single").model_dump_json().encode(), 5)
    single = ReserveReply.model_validate_json(msg.data)
    assert single.error is not None and single.error.status == 429


async def test_malformed_and_oversized_batches_are_refused_whole(budget) -> None:
    nc, topo, _, _, sha, _ = budget
    msg = await nc.request(topo.budget_reserve_batch_subject, b'{"requests": [{"request_id": 1}]}', 5)
    bad = ReserveBatchReply.model_validate_json(msg.data)
    assert bad.error is not None and bad.error.status == 400 and not bad.replies
    too_many = [req(sha, f"o{i}").model_dump() for i in range(51)]  # over max_pending_reserves=50
    msg = await nc.request(
        topo.budget_reserve_batch_subject,
        ReserveBatch.model_validate({"requests": too_many}).model_dump_json().encode(),
        5,
    )
    shed = ReserveBatchReply.model_validate_json(msg.data)
    assert shed.error is not None and shed.error.code == "overloaded" and shed.retry_after_s == 1


async def test_pipelined_reserves_load_a_missing_script_and_keep_answers_apart(budget, redis_layout) -> None:
    _, _, directory, _key, sha, ledger = budget
    redis, _ = redis_layout
    # A script Redis has never seen (as after a restart): every pipelined call gets NOSCRIPT first.
    ledger._reserve = redis.register_script(_lua("reserve.lua") + f"\n-- {uuid.uuid4().hex}")
    svc_reqs = [req(sha, f"p{i}", max_tokens=30 + i) for i in range(8)]
    resolved = await BudgetService(
        BudgetSettings(), CATALOG, directory, ledger, BudgetMetrics(Metrics("test2"))
    ).resolve(sha)
    assert resolved is not None
    now = time.time()
    rs = await asyncio.gather(
        *(
            ledger.reserve(
                r.request_id, resolved.identity, resolved.limits, resolved.policy,
                input_tokens=10, output_tokens=r.requested_max_tokens or 1, tools_exempt=0,
                now=now, windows=Windows.at(now, ZoneInfo("UTC")), hold_s=60,
            )
            for r in svc_reqs
        )
    )  # fmt: skip
    assert [r.status for r in rs] == ["ok"] * 8
    assert [r.output_tokens for r in rs] == [30 + i for i in range(8)]


async def test_pipelined_settles_load_a_missing_script_and_charge_each_its_own(budget, redis_layout) -> None:
    """Catches: settles of one loop turn (a fetched batch of events) pipelined with their answers
    or charges crossed, or lost when Redis has not loaded the settle script."""
    _, _, directory, _key, sha, ledger = budget
    redis, _ = redis_layout
    resolved = await BudgetService(
        BudgetSettings(), CATALOG, directory, ledger, BudgetMetrics(Metrics("test3"))
    ).resolve(sha)
    assert resolved is not None
    now = time.time()
    ids = [f"s{i}" for i in range(8)]
    for rid in ids:
        r = await ledger.reserve(
            rid, resolved.identity, resolved.limits, resolved.policy,
            input_tokens=10, output_tokens=50, tools_exempt=0,
            now=now, windows=Windows.at(now, ZoneInfo("UTC")), hold_s=60,
        )  # fmt: skip
        assert r.status == "ok"

    def settle(rid: str, output_tokens: int):  # type: ignore[no-untyped-def]
        return ledger.close(rid, "settled", input_tokens=10, output_tokens=output_tokens, now=now)

    # First batch: a settle script Redis has never seen (every pipelined call gets NOSCRIPT).
    ledger._settle = redis.register_script(_lua("common.lua") + "\n" + _lua("settle.lua") + f"\n-- {uuid.uuid4().hex}")
    first = await asyncio.gather(*(settle(rid, i + 1) for i, rid in enumerate(ids[:3])))
    assert [(c.status, c.charged) for c in first] == [("ok", 11), ("ok", 12), ("ok", 13)]
    # Second batch, the script now loaded: one pipeline; s7 released, s3 settled twice (a dup).
    second = await asyncio.gather(
        *(settle(rid, i + 4) for i, rid in enumerate(ids[3:7])),
        ledger.close("s7", "released", now=now),
        settle("s3", 4),
    )
    assert [(c.status, c.charged) for c in second] == [
        ("ok", 14), ("ok", 15), ("ok", 16), ("ok", 17), ("ok", 0), ("dup", 0)
    ]  # fmt: skip
    for rid in ids[:7]:
        rec = await ledger.reservation(rid)
        assert rec.get("state") == "settled", rec
    assert (await ledger.reservation("s7")).get("state") == "released"
