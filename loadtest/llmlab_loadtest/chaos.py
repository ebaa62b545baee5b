"""Chaos suite (resilience issue; ``make chaos``): one fault at a time under a steady streaming
load, and what it cost: requests hung, failed by class, resumed, tokens billed against tokens
delivered, reservations left open, accounting rows against attempts, time to recover.

Each fault runs on a stack of its own (so its books are its own): a private nats-server (JetStream
on disk) and redis-server, two simulated engines with a worker each (one pool), the budget service
(every request authenticated and reserved), the router service, the accounting service and a
gateway. ``--streams`` client loops send streamed chat requests one after another through the
gateway for ``before_s``; then the fault; then load for ``after_s`` more once the fault is over
(a killed process is started again after ``down_s``, as its supervisor would; a paused one is
resumed). Then the load stops and the books are read:

* **hung**: a request with no end (terminal chunk, error or closed connection) within ``hung_s``;
* **failed by class**: HTTP status and error code, a closed connection, an in-band stream error;
* **resumed**: attempts that continued a stream another attempt had begun (accounting's
  ``resumed_tokens > 0``);
* **billing**: for every answered request, the output tokens accounting bills against the
  ``usage`` the client received (and its prompt tokens); the budget ledger's spend against
  accounting's billed total (one charge, in both books); for streams that broke after tokens,
  what they were billed against the chunks that reached the client;
* **reservations**: the key's reserved tokens and concurrent count once the bound has passed (the
  last request's deadline, the reaper's grace and two reaper periods; every one must be 0);
* **accounting rows**: rows of the ``attempts`` view against the distinct attempts in the JetStream
  events stream (exactly one row each, no duplicate);
* **recovery**: from the fault to the send of the first request after which nothing failed.

The faults (``--faults``, default all): ``worker_kill``, ``gateway_kill``, ``budget_kill``,
``router_kill``, ``accounting_kill`` (SIGKILL, restarted after ``down_s``), ``nats_restart``
(SIGKILL of nats-server, restarted on the same port and store), ``redis_pause`` (SIGSTOP for
``redis_pause_s``), ``engine_stall`` (the engine of the busiest worker SIGSTOPped for ``stall_s``:
its connections stay open and silent), ``engine_dead`` (that engine SIGKILLed, restarted after
``down_s``). Simulated engines: the figures are the control plane's.

    python -m llmlab_loadtest.chaos [--faults worker_kill,nats_restart] [--out results]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import logging
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
import httpx
from llmlab_common.messages import AttemptEvent
from llmlab_common.natsio import connect
from llmlab_common.subjects import Topology
from llmlab_testkit.budget import BudgetAdmin, Provisioned
from llmlab_testkit.e2e import accounting_sql, metric
from llmlab_testkit.natsserver import nats_server_binary
from llmlab_testkit.procs import ManagedProcess, free_port, unique_namespace, url, wait_port

from llmlab_loadtest import bench_meta
from llmlab_loadtest.relay_bench import BenchStack
from llmlab_loadtest.sse_client import RequestRecord, http_error_code, stream_request

log = logging.getLogger("chaos")
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
POOL = "gpu-vllm"
PREFIX = "chaos"
UNLIMITED = dict.fromkeys(("daily_tokens", "monthly_tokens", "rpm", "tpm", "max_concurrent"), "unlimited")


@dataclass(frozen=True)
class Fault:
    name: str
    what: str  # what is done
    client_sees: str  # what a client of the gateway sees (README, report)


FAULTS: dict[str, Fault] = {
    f.name: f
    for f in (
        Fault(
            "worker_kill",
            "SIGKILL the worker serving the most streams; a new one starts after down_s",
            "Nothing but a pause: its streams continue on the other worker (same id, no repeated or "
            "missing text, one usage block); queued requests are taken by the other worker.",
        ),
        Fault(
            "gateway_kill",
            "SIGKILL the gateway; it starts again on the same port after down_s",
            "Its open streams break (connection closed) and new connections are refused until it is "
            "back; workers finish and settle the broken streams' generations, so each is billed "
            "exactly what the engine generated, and nothing else is charged.",
        ),
        Fault(
            "budget_kill",
            "SIGKILL the budget service; it starts again after down_s",
            "Open streams go on. New requests get 503 budget_unavailable (fail closed: no request "
            "runs unauthenticated) until it is back; settlement resumes from the events stream.",
        ),
        Fault(
            "router_kill",
            "SIGKILL the router service; it starts again after down_s",
            "Nothing: the gateway decides with its embedded router core while the service is away.",
        ),
        Fault(
            "accounting_kill",
            "SIGKILL the accounting service; it starts again on the same data after down_s",
            "Nothing: events wait in JetStream and are ingested when it is back, each once.",
        ),
        Fault(
            "nats_restart",
            "SIGKILL nats-server; it starts again on the same port and store after down_s",
            "A pause: services reconnect by themselves; open streams continue (a cut attempt is resumed) "
            "and new requests wait for the workers' next heartbeats. A request whose attempt cannot be "
            "published while the server is down fails (5xx).",
        ),
        Fault(
            "redis_pause",
            "SIGSTOP redis-server for redis_pause_s, then SIGCONT",
            "Open streams go on. New requests get 503 budget_unavailable after the budget's Redis "
            "timeout while Redis is frozen; settlement catches up when it answers again.",
        ),
        Fault(
            "engine_stall",
            "SIGSTOP the busiest worker's engine for stall_s (its connections stay open, silent)",
            "A pause: the worker's stall bound (or its health checks, for streams before their "
            "first token) fails the silent attempts and the gateway continues them on the other worker.",
        ),
        Fault(
            "engine_dead",
            "SIGKILL the busiest worker's engine; it starts again after down_s",
            "A pause: the broken engine streams fail their attempts and the gateway continues them "
            "on the other worker; the dead engine's worker stops pulling until it is back.",
        ),
    )
}


@dataclass(frozen=True)
class ChaosConfig:
    streams: int = 8
    max_tokens: int = 40
    ttft_ms: float = 50.0
    itl_ms: float = 25.0
    before_s: float = 4.0
    after_s: float = 8.0
    down_s: float = 2.0
    redis_pause_s: float = 20.0
    stall_s: float = 10.0
    hung_s: float = 45.0
    # The gateway's request timeout: a reservation's deadline, after which the reaper may release it.
    request_timeout_s: float = 20.0
    reservation_grace_s: float = 2.0
    reaper_interval_s: float = 1.0
    stall_timeout_s: float = 3.0  # the workers' engine stall bound
    heartbeat_s: float = 0.5
    faults: tuple[str, ...] = tuple(FAULTS)
    out: Path = Path("results")
    dirty: bool = False


@dataclass
class Timeline:
    load_started: float = 0.0  # monotonic
    fault_at: float = 0.0  # seconds since load_started
    restored_at: float = 0.0
    load_stopped_at: float = 0.0
    target: str = ""
    fault_wall: float = 0.0  # time.time() at the fault: accounting's timestamps are wall clock
    # nats_restart: the events stream's state just before the kill and just after the restart
    # (a last sequence that went back: the server lost writes it had acknowledged)
    events_stream: dict[str, dict[str, int]] = field(default_factory=dict)


class ChaosStack:
    """The stack of one fault, on a NATS and a Redis of its own (they are faulted too)."""

    def __init__(self, cfg: ChaosConfig) -> None:
        self.cfg = cfg
        self.dir = Path(tempfile.mkdtemp(prefix="llmlab-chaos-"))
        binary = nats_server_binary()
        redis_binary = shutil.which("redis-server")
        if binary is None or redis_binary is None:
            raise RuntimeError("the chaos suite runs its own nats-server and redis-server; one is not installed")
        nport, mport, self.redis_port = free_port(), free_port(), free_port()
        self.nats = ManagedProcess(
            "chaos-nats",
            [binary, "-a", "127.0.0.1", "-p", str(nport), "-m", str(mport), "-js", "-sd", str(self.dir / "js")],
            {},
            ready_url=f"http://127.0.0.1:{mport}/healthz",
        )
        self.redis = ManagedProcess(
            "chaos-redis",
            [redis_binary, "--port", str(self.redis_port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            {},
        )
        self.stack = BenchStack(
            namespace=unique_namespace(),
            nats_url=f"nats://127.0.0.1:{nport}",
            redis_url=f"redis://127.0.0.1:{self.redis_port}/0",
        )
        self.sims: list[ManagedProcess] = []
        self.workers: list[ManagedProcess] = []
        self.services: dict[str, ManagedProcess] = {}
        self.key: Provisioned | None = None

    def start(self) -> None:
        c, s = self.cfg, self.stack
        self.nats.start().wait_ready(15)
        self.redis.start()
        wait_port(self.redis_port)
        for i in range(2):
            sim = s.sim("vllm", MODEL, ttft_ms=c.ttft_ms, itl_ms=c.itl_ms, output_len=c.max_tokens)
            self.sims.append(sim)
            wenv = {"LLMLAB_WORKER_ENGINE_STALL_TIMEOUT_S": str(c.stall_timeout_s)}
            self.workers.append(
                s.worker("vllm", POOL, url(sim), worker_id=f"chaos-w{i}", heartbeat_s=c.heartbeat_s, env=wenv)
            )
        self.services["budget"] = s.budget(
            env={
                "LLMLAB_BUDGET_RESERVATION_GRACE_S": str(c.reservation_grace_s),
                "LLMLAB_BUDGET_REAPER_INTERVAL_S": str(c.reaper_interval_s),
            }
        )
        open_audit(s.nats_url, s.namespace)  # the workers created the events stream
        self.services["router"] = s.router()
        self.services["accounting"] = s.accounting()
        admin = BudgetAdmin(url(self.services["budget"]))
        try:
            self.key = admin.provision("enterprise", {"key": UNLIMITED, "user": UNLIMITED, "team": UNLIMITED})
        finally:
            admin.close()
        self.services["gateway"] = s.gateway(
            auth="budget", router="service", env={"LLMLAB_GATEWAY_REQUEST_TIMEOUT_S": str(c.request_timeout_s)}
        )
        self._wait_workers_seen()

    def _wait_workers_seen(self, timeout: float = 15.0) -> None:
        gw = self.services["gateway"]
        deadline = time.monotonic() + timeout
        while metric(gw, "llmlab_gateway_live_workers", pool=POOL) < 2:
            if time.monotonic() > deadline:
                raise TimeoutError("the gateway did not see both workers")
            time.sleep(0.1)

    def busiest(self) -> int:
        """The worker with the most attempts in flight (the one whose loss hurts)."""
        loads = []
        for w in self.workers:
            try:
                loads.append(metric(w, "llmlab_worker_in_flight_requests"))
            except httpx.HTTPError:
                loads.append(-1.0)
        return max(range(len(loads)), key=lambda i: loads[i])

    def close(self) -> None:
        self.stack.close()
        self.redis.stop()
        self.nats.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


# -- the fault ---------------------------------------------------------------------------------
async def inject(fault: str, cs: ChaosStack, cfg: ChaosConfig, tl: Timeline) -> None:
    """Do ``fault`` and undo it (restart or resume); records when in ``tl``."""
    t0 = tl.load_started

    def now() -> float:
        return time.monotonic() - t0

    kill_restart: dict[str, ManagedProcess] = {
        "gateway_kill": cs.services["gateway"],
        "budget_kill": cs.services["budget"],
        "router_kill": cs.services["router"],
        "accounting_kill": cs.services["accounting"],
        "nats_restart": cs.nats,
    }
    if fault == "worker_kill":
        i = cs.busiest()
        kill_restart[fault] = cs.workers[i]
        tl.target = cs.workers[i].name + f" #{i}"
    elif fault == "engine_dead":
        i = cs.busiest()
        kill_restart[fault] = cs.sims[i]
        tl.target = f"engine of worker #{i}"
    if fault in kill_restart:
        p = kill_restart[fault]
        tl.target = tl.target or p.name
        if fault == "nats_restart":
            tl.events_stream["before_kill"] = await events_stream_state(cs)
        tl.fault_at, tl.fault_wall = now(), time.time()
        await asyncio.to_thread(p.kill)
        await asyncio.sleep(cfg.down_s)
        await asyncio.to_thread(p.restart, 60.0)
        if fault == "nats_restart":
            tl.events_stream["after_restart"] = await events_stream_state(cs)
    elif fault in ("redis_pause", "engine_stall"):
        if fault == "redis_pause":
            p, hold, tl.target = cs.redis, cfg.redis_pause_s, "redis-server"
        else:
            i = cs.busiest()
            p, hold, tl.target = cs.sims[i], cfg.stall_s, f"engine of worker #{i}"
        tl.fault_at, tl.fault_wall = now(), time.time()
        p.pause()
        await asyncio.sleep(hold)
        p.resume()
    else:
        raise ValueError(f"unknown fault {fault!r}; known: {', '.join(FAULTS)}")
    tl.restored_at = now()
    log.info("%s: %s at %.1f s, restored at %.1f s", fault, tl.target, tl.fault_at, tl.restored_at)


# -- the load ----------------------------------------------------------------------------------
async def load(cs: ChaosStack, cfg: ChaosConfig, fault: str, tl: Timeline) -> list[RequestRecord]:
    assert cs.key is not None
    base = url(cs.services["gateway"]) + "/v1/chat/completions"
    headers = {"Authorization": f"Bearer {cs.key.api_key}"}
    records: list[RequestRecord] = []
    stop = asyncio.Event()

    async def loop(stream: int, session: aiohttp.ClientSession) -> None:
        while not stop.is_set():
            rec = RequestRecord(index=len(records), stream=stream, sent_at=0.0)
            records.append(rec)
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": f"chaos request {rec.index}: tell a long story"}],
                "max_tokens": cfg.max_tokens,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            await stream_request(session, base, body, rec, tl.load_started, cfg.hung_s, headers)
            if not rec.ok:
                await asyncio.sleep(0.2)  # a client backs off a little after a failure

    tl.load_started = time.monotonic()
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=5)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        loops = [asyncio.create_task(loop(i, session)) for i in range(cfg.streams)]
        await asyncio.sleep(cfg.before_s)
        await inject(fault, cs, cfg, tl)
        await asyncio.sleep(cfg.after_s)
        stop.set()
        tl.load_stopped_at = time.monotonic() - tl.load_started
        await asyncio.gather(*loops)
    return records


# -- the books ---------------------------------------------------------------------------------
def failure_class(r: RequestRecord) -> str | None:
    if r.ok:
        return None
    if r.error_kind == "http":
        code = http_error_code(r.error)
        return f"http {r.status} {code}" if code else f"http {r.status}"
    if r.error_kind == "stream" and r.error and r.error.startswith("in-band error ("):
        return "in-band " + r.error[len("in-band error (") :].split(")", 1)[0]
    return r.error_kind or "unknown"


async def events_stream_state(cs: ChaosStack) -> dict[str, int]:
    nc = await connect(cs.stack.nats_url, "chaos-books")
    try:
        info = await nc.jetstream().stream_info(Topology(cs.stack.namespace).events_stream)
        return {"last_seq": int(info.state.last_seq), "messages": int(info.state.messages)}
    finally:
        await nc.close()


AUDIT = "chaos-audit"  # a durable consumer of the attempt events of our own: the books' count


async def _audit_consumer(nats_url: str, namespace: str) -> tuple[Any, Any]:
    """A connection and the audit consumer's subscription (the durable is created on first use)."""
    nc = await connect(nats_url, "chaos-books")
    topo = Topology(namespace)
    sub = await nc.jetstream().pull_subscribe(topo.attempt_event_subject, durable=AUDIT, stream=topo.events_stream)
    return nc, sub


def open_audit(nats_url: str, namespace: str) -> None:
    """Before any event: the events stream keeps each event until every durable consumer acked it
    (interest retention), so this one sees every attempt event, whatever the services did."""

    async def create() -> None:
        nc, _ = await _audit_consumer(nats_url, namespace)
        await nc.close()

    asyncio.run(create())


async def attempts_in_events(nats_url: str, namespace: str) -> set[tuple[str, int]]:
    """Distinct (request_id, attempt) of the attempt events, read from the audit consumer."""
    nc, sub = await _audit_consumer(nats_url, namespace)
    out: set[tuple[str, int]] = set()
    try:
        while True:
            try:
                msgs = await sub.fetch(512, timeout=1.0)
            except TimeoutError:
                break
            for m in msgs:
                ev = AttemptEvent.model_validate_json(m.data)
                out.add((ev.request_id, ev.attempt))
                await m.ack()
    finally:
        await nc.close()
    return out


def _sql(cs: ChaosStack, query: str) -> list[list[Any]]:
    return accounting_sql(cs.services["accounting"], query)


async def books(cs: ChaosStack, cfg: ChaosConfig, records: list[RequestRecord], tl: Timeline) -> dict[str, Any]:
    assert cs.key is not None
    admin = BudgetAdmin(url(cs.services["budget"]))
    try:
        # Reservations: every one settled or released once the bound has passed.
        last_send = max(r.sent_at for r in records)
        bound = (
            tl.load_started + last_send + cfg.request_timeout_s + cfg.reservation_grace_s + 2 * cfg.reaper_interval_s
        )
        settled_after: float | None = None
        while True:
            u = await asyncio.to_thread(admin.usage, "key", cs.key.key_id)
            reserved, concurrent = int(u["day"]["reserved"]), int(u["concurrent"]["current"])
            if reserved == 0 and concurrent == 0:
                settled_after = time.monotonic() - tl.load_started - tl.load_stopped_at
                break
            if time.monotonic() > bound + 2.0:
                break
            await asyncio.sleep(0.25)
        ledger_used = int(u["day"]["used"])
    finally:
        admin.close()
    # Accounting: one row per attempt in the events stream (waiting for ingestion to catch up).
    events = await attempts_in_events(cs.stack.nats_url, cs.stack.namespace)
    deadline = time.monotonic() + 30
    while True:
        rows = await asyncio.to_thread(_sql, cs, "SELECT count(), uniqExact(request_id, attempt) FROM attempts")
        n_rows, n_distinct = int(rows[0][0]), int(rows[0][1])
        if n_rows >= len(events) or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)
    # Attempts accounting holds that the audit never read: when each ended, against the fault
    # (seconds; negative: before it). All just before a NATS kill: writes the server had
    # acknowledged (and delivered to the services) but lost.
    ended = await asyncio.to_thread(
        _sql, cs, "SELECT request_id, attempt, toFloat64(max(ended_at)) FROM attempts_raw GROUP BY request_id, attempt"
    )
    not_in_events = sorted(round(float(e) - tl.fault_wall, 2) for rid, att, e in ended if (rid, int(att)) not in events)
    billed = {
        r[0]: (int(r[1]), int(r[2]), int(r[3]))
        for r in await asyncio.to_thread(
            _sql, cs, "SELECT request_id, billed_input_tokens, billed_output_tokens, attempts FROM requests"
        )
    }
    resumed = int(
        (
            await asyncio.to_thread(
                _sql, cs, "SELECT uniqExact(request_id, attempt) FROM attempts_raw WHERE resumed_tokens > 0"
            )
        )[0][0]
    )
    acc_billed_total = sum(i + o for i, o, _ in billed.values())
    # Generations that completed on an engine although a later attempt answered the client: GPU
    # work done for nothing (a worker cut off while its gateway moved on).
    superseded = int(
        (
            await asyncio.to_thread(
                _sql, cs, "SELECT count() FROM attempts WHERE outcome = 'completed' AND is_billing = 0"
            )
        )[0][0]
    )

    mismatches: list[dict[str, Any]] = []
    broken_billed = broken_delivered = 0
    for r in records:
        if r.ok and r.usage:
            got = billed.get(r.request_id or "")
            want = (int(r.usage.get("prompt_tokens", 0)), int(r.usage.get("completion_tokens", 0)))
            if got is None or got[:2] != want:
                mismatches.append({"request_id": r.request_id, "delivered": want, "billed": got and got[:2]})
        elif r.chunk_times and r.request_id in billed:
            broken_delivered += len(r.chunk_times)  # at least one token a chunk
            broken_billed += billed[r.request_id][1]
    for m in mismatches[:5]:  # what accounting holds for them, to read in the report
        m["attempts"] = await asyncio.to_thread(
            _sql,
            cs,
            "SELECT attempt, source, outcome, completion_tokens, billed_input_tokens, billed_output_tokens, "
            f"is_billing, resumed_tokens, carried_tokens FROM attempts_raw WHERE request_id = '{m['request_id']}' "
            "ORDER BY attempt, source",
        )
    return {
        "reservations": {
            "settled_after_load_s": round(settled_after, 2) if settled_after is not None else None,
            "reserved_tokens_at_bound": reserved,
            "concurrent_at_bound": concurrent,
        },
        "accounting": {
            "attempts_in_events": len(events),
            "attempt_rows": n_rows,
            "duplicate_rows": n_rows - n_distinct,
            "missing_rows": len(events) - n_distinct,
            "not_in_events": len(not_in_events),
            "not_in_events_ended_s_from_fault": not_in_events[:20],
            "resumed_attempts": resumed,
            "superseded_completions": superseded,
        },
        "billing": {
            "answered_mismatches": len(mismatches),
            "mismatch_examples": mismatches[:5],
            "ledger_used_tokens": ledger_used,
            "accounting_billed_tokens": acc_billed_total,
            "ledger_minus_accounting": ledger_used - acc_billed_total,
            "broken_streams_chunks_delivered": broken_delivered,
            "broken_streams_output_billed": broken_billed,
        },
    }


def client_side(records: list[RequestRecord], tl: Timeline, cfg: ChaosConfig) -> dict[str, Any]:
    classes = Counter(failure_class(r) for r in records if not r.ok)
    hung = sum(1 for r in records if r.error_kind == "timeout")
    failed_sends = [r.sent_at for r in records if not r.ok]
    failed_ends = [r.sent_at + (r.end_at or 0.0) for r in records if not r.ok]
    recovery = 0.0
    if failed_sends:
        last_failed = max(failed_sends)
        after = [r.sent_at for r in records if r.ok and r.sent_at > last_failed]
        recovery = (min(after) if after else tl.load_stopped_at) - tl.fault_at
    # The longest silence inside an answered stream that was open at the fault: what a client
    # whose stream was moved elsewhere waited.
    gaps = [
        max((b - a for a, b in zip(r.chunk_times, r.chunk_times[1:], strict=False)), default=0.0)
        for r in records
        if r.ok and r.sent_at <= tl.fault_at <= r.sent_at + (r.end_at or 0)
    ]
    return {
        "requests": len(records),
        "completed": sum(1 for r in records if r.ok),
        "failed": dict(sorted((k or "?", v) for k, v in classes.items())),
        "hung": hung,
        "open_at_fault": len(gaps),
        "max_stream_gap_s": round(max(gaps), 2) if gaps else None,
        "recovery_s": round(max(0.0, recovery), 2),
        "first_failure_s": round(min(failed_ends) - tl.fault_at, 2) if failed_ends else None,
        # One message per class, as the client read it.
        "examples": {failure_class(r) or "?": (r.error or "")[:300] for r in records if not r.ok},
    }


def verdict(client: dict[str, Any], book: dict[str, Any]) -> dict[str, bool]:
    acc, bill, res = book["accounting"], book["billing"], book["reservations"]
    return {
        "no_hung_request": client["hung"] == 0,
        "no_reservation_left": res["reserved_tokens_at_bound"] == 0 and res["concurrent_at_bound"] == 0,
        "one_row_per_attempt": acc["duplicate_rows"] == 0 and acc["missing_rows"] == 0,
        "answered_billed_as_delivered": bill["answered_mismatches"] == 0,
        "ledger_equals_accounting": bill["ledger_minus_accounting"] == 0,
    }


async def run_fault_async(cfg: ChaosConfig, fault: str) -> dict[str, Any]:
    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; known: {', '.join(FAULTS)}")
    cs = ChaosStack(cfg)
    tl = Timeline()
    # SIGTERM (timeout, a CI runner) cancels the run, so that the stack it started is stopped: its
    # processes run in sessions of their own and would outlive it.
    loop, task = asyncio.get_running_loop(), asyncio.current_task()
    assert task is not None
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        await asyncio.to_thread(cs.start)
        log.info("%s: stack up (namespace %s); load of %d streams", fault, cs.stack.namespace, cfg.streams)
        records = await load(cs, cfg, fault, tl)
        client = client_side(records, tl, cfg)
        log.info("%s: client %s", fault, json.dumps(client))
        book = await books(cs, cfg, records, tl)
        log.info("%s: books %s", fault, json.dumps(book))
        crashed = [p.name for p in cs.stack.procs if p.crashed()]
        return {
            "fault": fault,
            "what": FAULTS[fault].what,
            "client_sees": FAULTS[fault].client_sees,
            "target": tl.target,
            "timeline_s": {
                "fault_at": round(tl.fault_at, 2),
                "restored_at": round(tl.restored_at, 2),
                "load_stopped_at": round(tl.load_stopped_at, 2),
            },
            **({"events_stream": tl.events_stream} if tl.events_stream else {}),
            "client": client,
            "books": book,
            "crashed_processes": crashed,
            "verdict": verdict(client, book),
            "requests": [
                {
                    "sent_at": round(r.sent_at, 3),
                    "end_at": round(r.end_at or 0.0, 3),
                    "class": failure_class(r) or "ok",
                }
                for r in records
            ],
        }
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
        await asyncio.to_thread(cs.close)


def run_fault(cfg: ChaosConfig, fault: str) -> dict[str, Any]:
    return asyncio.run(run_fault_async(cfg, fault))


# -- report ------------------------------------------------------------------------------------
def markdown(doc: dict[str, Any]) -> str:
    c = doc["config"]
    lines = [
        "# Chaos suite: one fault at a time under a steady streaming load (simulated engines)",
        "",
        f"{c['streams']} client loops of streamed chat requests ({c['max_tokens']} tokens, ITL "
        f"{c['itl_ms']:.0f} ms) through a gateway with budget auth, the router service and accounting; "
        f"two workers of one pool. A killed process is started again after {c['down_s']:.0f} s; Redis "
        f"is frozen {c['redis_pause_s']:.0f} s, an engine {c['stall_s']:.0f} s. Hung: no end within "
        f"{c['hung_s']:.0f} s.",
        "",
        "| fault | requests | completed | failed (class: n) | hung | resumed | max gap s | recovery s | "
        "rows / attempts | billed = delivered | ledger - accounting | reservations at bound | verdict |",
        "|---|---:|---:|---|---:|---:|---:|---:|---|---|---:|---|---|",
    ]
    for f in doc["faults"]:
        cl, acc, bill, res = f["client"], f["books"]["accounting"], f["books"]["billing"], f["books"]["reservations"]
        failed = ", ".join(f"{k}: {n}" for k, n in cl["failed"].items()) or "0"
        ok = all(f["verdict"].values())
        bad = [k for k, v in f["verdict"].items() if not v]
        billed_ok = "yes" if bill["answered_mismatches"] == 0 else f"{bill['answered_mismatches']} differ"
        lines.append(
            f"| {f['fault']} | {cl['requests']} | {cl['completed']} | {failed} | {cl['hung']} | "
            f"{acc['resumed_attempts']} | {cl['max_stream_gap_s']} | {cl['recovery_s']} | "
            f"{acc['attempt_rows']} / {acc['attempts_in_events']} (dup {acc['duplicate_rows']}) | "
            f"{billed_ok} | "
            f"{bill['ledger_minus_accounting']} | {res['reserved_tokens_at_bound']} tok, "
            f"{res['concurrent_at_bound']} open | {'PASS' if ok else 'FAIL: ' + ', '.join(bad)} |"
        )
    lines += ["", "## What a client sees", ""]
    for f in doc["faults"]:
        lines.append(f"- **{f['fault']}** ({f['what']}): {f['client_sees']}")
    lines += [
        "",
        "Broken streams (failed after tokens reached the client), output tokens billed against chunks "
        "delivered (a chunk carries one token or more):",
        "",
    ]
    for f in doc["faults"]:
        b = f["books"]["billing"]
        lines.append(
            f"- {f['fault']}: {b['broken_streams_output_billed']} billed, "
            f"{b['broken_streams_chunks_delivered']} chunks delivered"
        )
    lines.append("")
    lines += bench_meta.metadata_section(doc["metadata"])
    return "\n".join(lines)


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    faults = doc["faults"]
    fig, axes = plt.subplots(len(faults), 1, figsize=(9, 1.9 * len(faults) + 0.6), squeeze=False)
    for ax, f in zip(axes[:, 0], faults, strict=True):
        ok = [(r["sent_at"], r["end_at"]) for r in f["requests"] if r["class"] == "ok"]
        bad = [(r["sent_at"], r["end_at"]) for r in f["requests"] if r["class"] != "ok"]
        if ok:
            ax.scatter(*zip(*ok, strict=True), s=6, c="tab:green", label="completed")
        if bad:
            ax.scatter(*zip(*bad, strict=True), s=10, c="tab:red", marker="x", label="failed")
        t = f["timeline_s"]
        ax.axvspan(t["fault_at"], max(t["restored_at"], t["fault_at"] + 0.1), color="orange", alpha=0.25)
        ax.set_ylabel("duration s", fontsize=7)
        ax.set_title(f"{f['fault']} (shaded: fault until restored)", fontsize=8)
        ax.tick_params(labelsize=7)
    axes[0, 0].legend(fontsize=7, loc="upper right")
    axes[-1, 0].set_xlabel("request sent at, s since the load started")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--faults", default=",".join(FAULTS), help="comma-separated, of: " + ", ".join(FAULTS))
    p.add_argument("--streams", type=int, default=ChaosConfig.streams)
    p.add_argument("--out", type=Path, default=ChaosConfig.out)
    p.add_argument("--dirty", action="store_true", help="run on a modified tree (the result says so)")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    faults = tuple(x.strip() for x in a.faults.split(",") if x.strip())
    unknown = [f for f in faults if f not in FAULTS]
    if unknown:
        p.error(f"unknown faults {unknown}; known: {', '.join(FAULTS)}")
    cfg = replace(ChaosConfig(), streams=a.streams, faults=faults, out=a.out, dirty=a.dirty)
    bench_meta.require_committed(cfg.dirty)
    started = dt.datetime.now(dt.UTC)
    t0 = time.monotonic()
    results = []
    for i, fault in enumerate(cfg.faults, 1):
        log.info("[%d/%d] %s", i, len(cfg.faults), fault)
        results.append(run_fault(cfg, fault))
        log.info("[%d/%d] %s: %s", i, len(cfg.faults), fault, results[-1]["verdict"])
    doc = {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()},
        "faults": results,
        "passed": all(all(f["verdict"].values()) for f in results),
        "metadata": bench_meta.metadata_block(
            started=started,
            duration_s=time.monotonic() - t0,
            engine="llmlab-engine-sim (vllm flavour), two engines, one worker each",
            model_id=MODEL,
            concurrency=f"{cfg.streams} closed-loop streams",
            warmup="none (the load runs before_s before the fault)",
            prompt_dataset="one fixed prompt with the request's index",
            input_length_distribution="fixed (one prompt)",
            output_length_distribution=f"fixed: {cfg.max_tokens} tokens",
            sampling_parameters={"max_tokens": cfg.max_tokens},
            command=" ".join([sys.executable, "-m", "llmlab_loadtest.chaos", *(argv or sys.argv[1:])]),
        ),
    }
    paths = bench_meta.write_outputs(doc, cfg.out, started, PREFIX, markdown, plot)
    log.info("wrote %s", paths["md"])
    sys.stdout.write(markdown(doc) + "\n")
    return 0 if doc["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
