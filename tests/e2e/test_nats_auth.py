"""NATS as a trust boundary: the whole stack on a nats-server with one user per role and
processes' own users (llmlab_common.natsauth), serving requests without a single permission
violation, and each forgery of the hardening review refused by the server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import nats
import nats.errors
import pytest
from llmlab_common.natsauth import ROLES, inbox_prefix
from llmlab_common.natsio import ensure_streams, stream_configs
from llmlab_common.subjects import Topology
from llmlab_testkit.budget import BudgetAdmin
from llmlab_testkit.e2e import LLAMA, accounting_sql, client
from llmlab_testkit.natsserver import AuthNats, nats_server_binary, start_auth_nats
from llmlab_testkit.procs import Stack, unique_namespace, url
from nats.aio.client import Client as NATS

pytestmark = pytest.mark.e2e
# Processes' own users (<role>.<id>): narrowed to their id.
PROCESS_USERS = ("gateway.gw-a", "gateway.gw-b", "worker.w-1")


@pytest.fixture
def secure(tmp_path: Path) -> Iterator[tuple[AuthNats, Topology]]:
    if nats_server_binary() is None:  # the machine's NATS package provides it: never skipped silently
        pytest.fail("nats-server binary not found")
    ns = unique_namespace()
    srv = start_auth_nats(tmp_path / "nats", ns, [*ROLES, *PROCESS_USERS])
    try:
        yield srv, Topology(ns)
    finally:
        srv.stop()


async def _as(srv: AuthNats, role: str, errors: list[str]) -> NATS:
    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    return await nats.connect(
        srv.url,
        user=role,
        password=srv.passwords[role],
        inbox_prefix=inbox_prefix(role),
        error_cb=on_error,
        allow_reconnect=False,
    )


async def test_the_whole_stack_runs_on_its_users_without_a_violation(secure: tuple[AuthNats, Topology]) -> None:
    """Catches: a permission the stack needs and the contract lacks (a service that cannot pull,
    ack, reply or create its consumer), a process that still connects unauthenticated, and a
    process user narrowed too far to serve. The gateway and the worker run on their own
    process users, budget, router and accounting on their roles'."""
    srv, topo = secure
    stack = Stack(namespace=topo.namespace, nats_url=srv.url, nats_passwords=srv.passwords)
    try:
        sim = stack.sim("vllm", LLAMA, ttft_ms=20, itl_ms=5, output_len=8)
        worker = stack.worker("vllm", "gpu-vllm", url(sim), worker_id="w-1")
        budget = stack.budget()
        stack.router()
        acc = stack.accounting(env={"LLMLAB_ACCOUNTING_FLUSH_INTERVAL_S": "0.2"})
        gw = stack.gateway(auth="budget", router="service", env={"LLMLAB_GATEWAY_GATEWAY_ID": "gw-a"})
        assert (gw.env["LLMLAB_NATS_USER"], worker.env["LLMLAB_NATS_USER"]) == ("gateway.gw-a", "worker.w-1")
        key = BudgetAdmin(url(budget)).provision("pro").api_key
        c = client(gw, key)
        r = await c.chat.completions.create(model=LLAMA, messages=[{"role": "user", "content": "hi"}], max_tokens=5)
        assert r.choices[0].message.content
        stream = await c.chat.completions.create(
            model=LLAMA, messages=[{"role": "user", "content": "hi"}], max_tokens=5, stream=True
        )
        assert [ch async for ch in stream]
        deadline = time.monotonic() + 20
        while accounting_sql(acc, "SELECT count() FROM attempts WHERE outcome = 'completed'") != [[2]]:
            assert time.monotonic() < deadline, "the two attempts never reached accounting"
            await asyncio.sleep(0.2)
        assert srv.violations() == [], srv.violations()
    finally:
        stack.close()


async def test_unauthenticated_and_wrong_password_connections_are_refused(secure: tuple[AuthNats, Topology]) -> None:
    srv, _ = secure
    with pytest.raises(nats.errors.Error):
        await nats.connect(srv.url, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=2)
    with pytest.raises(nats.errors.Error):
        await nats.connect(
            srv.url, user="budget", password="guess", allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=2
        )


async def test_each_forgery_of_the_review_is_refused(secure: tuple[AuthNats, Topology]) -> None:
    """Catches: any role able to do what the hardening review showed anyone could do on an open
    NATS. Each forgery is published by a role that must not, while an admin observer listens on
    the target: the observer must receive nothing, and the server must report the violation."""
    srv, topo = secure
    ns = topo.namespace
    observer = await _as(srv, "admin", [])
    await ensure_streams(observer.jetstream(), topo)
    seen: dict[str, list[bytes]] = {}

    async def watch(subject: str) -> None:
        async def cb(msg: nats.aio.msg.Msg) -> None:
            seen.setdefault(subject, []).append(msg.data)

        await observer.subscribe(subject, cb=cb)

    # (role, subject, what the forgery would do)
    forged_publishes = [
        ("worker", topo.request_event_subject, "settle a request with a forged request event"),
        ("router", topo.attempt_event_subject, "settle a live request for free with a forged completed event"),
        ("gateway", topo.token_subject("gw1", "r1"), "inject text into another user's stream"),
        ("worker", topo.cancel_subject, "cancel any request"),
        ("worker", topo.pool_subject("gpu-vllm"), "publish requests for unmetered GPU time"),
        ("budget", topo.pool_subject("gpu-vllm"), "publish requests for unmetered GPU time"),
        ("gateway", topo.heartbeat_subject("gpu-vllm", "w1"), "forge a worker's heartbeat"),
        ("accounting", f"{inbox_prefix('gateway')}.x.y", "answer budget.reserve with a forged principal"),
        ("worker", f"$JS.API.STREAM.DELETE.{topo.events_stream}", "delete the events stream"),
        ("gateway", f"$JS.API.STREAM.PURGE.{topo.events_stream}", "purge the billing events"),
        ("router", f"$JS.API.STREAM.UPDATE.{topo.events_stream}", "shrink the events stream"),
        ("worker.w-1", topo.heartbeat_subject("gpu-vllm", "w-2"), "heartbeat as another worker"),
    ]
    for _, subject, _ in forged_publishes:
        await watch(subject)
    # Reads a role must not make: a request's prompt, the reserve requests (key hashes), tokens.
    forged_subscriptions = [
        ("worker", topo.budget_reserve_subject, "read key hashes and answer reserves"),
        ("accounting", topo.budget_reserve_batch_subject, "read batches of key hashes and answer them"),
        ("budget", f"{ns}.tok.>", "read every stream's text"),
        ("accounting", topo.pool_subject("gpu-vllm"), "read prompts"),
        ("worker", f"{inbox_prefix('gateway')}.>", "read the gateway's replies (principals)"),
        ("gateway.gw-b", f"{ns}.tok.gw-a.>", "read another gateway's streams"),
        ("gateway.gw-b", f"{inbox_prefix('gateway.gw-a')}.>", "read another gateway's replies"),
        ("worker.w-1", f"{inbox_prefix('worker')}.>", "read other workers' replies"),
    ]
    await observer.flush()
    for role, subject, why in forged_publishes:
        errors: list[str] = []
        nc = await _as(srv, role, errors)
        await nc.publish(subject, b'{"forged": true}')
        await nc.flush()
        await asyncio.sleep(0.2)
        await nc.close()
        assert subject not in seen, f"{role} could {why} ({subject})"
        assert any("permissions violation" in e.lower() for e in errors), (role, subject, errors)
    for role, subject, why in forged_subscriptions:
        errors = []
        got: list[bytes] = []
        nc = await _as(srv, role, errors)

        async def take(msg: nats.aio.msg.Msg, got: list[bytes] = got) -> None:
            got.append(msg.data)

        await nc.subscribe(subject, cb=take)
        await nc.flush()
        await asyncio.sleep(0.2)
        await observer.publish(subject.replace(">", "x.y"), b"secret")
        await observer.flush()
        await asyncio.sleep(0.2)
        await nc.close()
        assert got == [], f"{role} could {why} ({subject})"
        assert any("permissions violation" in e.lower() for e in errors), (role, subject, errors)
    # The events stream is still there, with its configuration.
    info = await observer.jetstream().stream_info(topo.events_stream)
    assert info.config.max_bytes == stream_configs(topo)[1].max_bytes
    await observer.close()
