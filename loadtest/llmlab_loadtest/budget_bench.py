"""Budget benchmark: reserve + settle latency of the budget service at a fixed rate (default
5,000/s), against the real Redis and NATS of this machine (nothing simulated).

    python -m llmlab_loadtest.budget_bench                       # 10 s per run, 2 repeats (~1.5 min)
    python -m llmlab_loadtest.budget_bench --quick               # a few seconds per run (for the test)
    python -m llmlab_loadtest.budget_bench --rate 2000 --procs 4 --duration 20

Two layers, each measured ``--repeats`` times (spread reported), each run preceded by a warm-up
of ``--warmup`` seconds at the same rate that is reported apart:

1. **redis** — the Lua layer (``Ledger``), the target: p99 <= 2 ms per reserve and per settle.
   One *op* = one ``Ledger.reserve`` (reserve.lua) followed by one ``Ledger.close(..., "settled")``
   (settle.lua) of the same unique request id: ``--rate 5000`` means 5,000 reserves/s plus
   5,000 settles/s (10,000 Lua calls/s). A fresh key prefix ``bench_<hex>:bud``, a key record
   with ``revoked_at=""`` and huge limits on all 4 scopes (key, user, team, tenant), so nothing
   is refused and every limit check of the script runs.
2. **service** — one budget service process (``python -m llmlab_budget``); one *op* = one
   ``ReserveRequest`` sent with ``nc.request`` to ``Topology.budget_reserve_subject`` and its
   reply (authenticate + reserve). Run at ``--rate`` and at ``--service-low-rate``. Settlement in
   this layer goes through JetStream events: for a sample of the reserved requests the client
   publishes a completed ``AttemptEvent``; the settlement lag is the service's ``closed_at`` in the
   reservation record minus the publish time.

Load comes from ``--procs`` separate processes (multiprocessing), open-loop with bounded
concurrency: op *i* of a process is due at ``t0 + i / rate``; ``--concurrency`` lanes per process
take the next due op, so up to that many ops are in flight whatever the earlier ones do. A late
start is recorded as start lag, and ops not started 3 s after the schedule's end are dropped and
counted, so an overload shows as achieved < offered rate. Latency is ``perf_counter`` around
each awaited call, so it includes the client's connection-pool wait and event-loop delay: the
client processes' CPU is reported beside it.
CPU of Redis (``INFO cpu``), the budget service, nats-server and the whole machine is measured
over the measured window. Writes ``results/budget/<UTC ts>/result.{json,md,png}``. The target is a
benchmark figure, not a test: MISS does not fail the command.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import hashlib
import json
import logging
import multiprocessing as mp
import os
import shlex
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import numpy as np
import psutil
import redis as redis_sync
from llmlab_budget.directory import Directory
from llmlab_budget.layout import Layout
from llmlab_budget.ledger import Ledger
from llmlab_budget.model import Identity
from llmlab_budget.redis_pack import pack_in_c
from llmlab_budget.windows import Windows
from llmlab_common.catalog import SCOPES, LimitSet, PlanBudget, ScopeName, load_catalog
from llmlab_common.messages import AttemptEvent, ReserveReply, ReserveRequest, Usage
from llmlab_common.natsio import connect
from llmlab_common.settings import InfraSettings
from llmlab_common.subjects import Topology
from llmlab_testkit.procs import Stack
from redis.asyncio import BlockingConnectionPool, Redis

from llmlab_loadtest.bench_meta import dist_version, metadata_block, write_outputs

log = logging.getLogger("budget_bench")

TARGET_P99_MS = 2.0  # redis layer, per reserve and per settle
LABEL = "real Redis/NATS on this 2-core machine, not simulated"
LAYERS = ("redis", "service")
# Limits on every scope: large enough never to refuse, so every check of reserve.lua runs.
BIG_LIMITS: dict[str, int] = {
    "daily_tokens": 10**14,
    "monthly_tokens": 10**14,
    "max_input_tokens": 1_000_000,
    "max_output_tokens": 1_000_000,
    "rpm": 10**12,
    "tpm": 10**14,
    "max_concurrent": 10**9,
}
INPUT_TOKENS = 100
MAX_TOKENS = 256
OUTPUT_TOKENS = 200  # what the settle charges as output
REQUEST_TIMEOUT_S = 5.0
LATE_CUTOFF_S = 3.0  # ops not started this long after the schedule's end are dropped (counted)
SETTLE_SAMPLE_EVERY = 10  # service layer: one op in this many publishes a completed AttemptEvent


# ---------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------
@dataclass
class BenchConfig:
    rate: float
    duration: float
    procs: int
    repeats: int
    warmup: float
    out: Path
    quick: bool
    rates: list[float]  # --rate, then --low-rate: each layer runs at each
    quiet_wait: float = 30.0
    quiet_cores: float = 0.3
    redis_pool: int = 64
    lanes: int = 64
    redis_url: str = os.environ.get("LLMLAB_REDIS_URL", "redis://127.0.0.1:6379/0")
    nats_url: str = os.environ.get("LLMLAB_NATS_URL", "nats://127.0.0.1:4222")
    settle_sample_every: int = SETTLE_SAMPLE_EVERY
    command: str = ""


def parse_args(argv: Sequence[str] | None = None) -> BenchConfig:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", type=float, help="ops/s over all load processes (default 5000; --quick 1000)")
    p.add_argument("--duration", type=float, help="measured seconds per run (default 10; --quick 2)")
    p.add_argument("--procs", type=int, default=2, help="load processes (default 2)")
    p.add_argument("--repeats", type=int, default=2, help="measured runs per layer and rate (default 2)")
    p.add_argument("--warmup", type=float, help="warm-up seconds before each run, reported apart (default 2)")
    p.add_argument(
        "--low-rate",
        type=float,
        default=1000.0,
        help="both layers also run at this rate, where the box keeps up (default 1000; 0 = only --rate; "
        "--quick: only --rate)",
    )
    p.add_argument(
        "--quiet-wait",
        type=float,
        help="before each run wait up to this many s for other processes to use < --quiet-cores (default 5; --quick 3)",
    )
    p.add_argument("--quiet-cores", type=float, default=0.3)
    p.add_argument("--redis-pool", type=int, default=64, help="BlockingConnectionPool size per load process")
    p.add_argument(
        "--concurrency", type=int, default=64, help="ops in flight at most per load process (open-loop lanes)"
    )
    p.add_argument("--out", type=Path, default=Path("results"), help="output directory (default results/)")
    p.add_argument("--quick", action="store_true", help="rate 1000, 2 s runs, 0.5 s warm-up (for the test)")
    p.add_argument("--log-level", default="INFO")
    a = p.parse_args(argv)
    logging.basicConfig(
        level=a.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s budget_bench %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
    )
    for noisy in ("httpx", "httpcore", "matplotlib", "llmlab_common.natsio", "llmlab_testkit.procs"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    rate = a.rate if a.rate is not None else (1000.0 if a.quick else 5000.0)
    duration = a.duration if a.duration is not None else (2.0 if a.quick else 10.0)
    warmup = a.warmup if a.warmup is not None else (0.5 if a.quick else 2.0)
    if rate <= 0 or duration <= 0 or warmup < 0 or a.procs < 1 or a.repeats < 1:
        p.error("--rate/--duration/--procs/--repeats must be positive, --warmup >= 0")
    rates = [rate]
    if not a.quick and a.low_rate > 0 and a.low_rate != rate:
        rates.append(a.low_rate)
    rates.sort()  # the sustainable rate first: an overloaded run's backlog cannot spill into it
    argv_list = list(sys.argv[1:] if argv is None else argv)
    return BenchConfig(
        rate=rate,
        duration=duration,
        procs=a.procs,
        repeats=a.repeats,
        warmup=warmup,
        out=a.out,
        quick=a.quick,
        rates=rates,
        quiet_wait=a.quiet_wait if a.quiet_wait is not None else (3.0 if a.quick else 5.0),
        quiet_cores=a.quiet_cores,
        redis_pool=a.redis_pool,
        lanes=a.concurrency,
        command=shlex.join(["python", "-m", "llmlab_loadtest.budget_bench", *argv_list]),
    )


# ---------------------------------------------------------------------------------------------
# Load processes
# ---------------------------------------------------------------------------------------------
@dataclass
class WorkerSpec:
    """What one load process is told (picklable: processes are spawned)."""

    layer: str
    index: int
    rate: float  # this process's share of the ops/s
    warmup: float
    duration: float
    redis_url: str
    nats_url: str
    redis_pool: int
    lanes: int  # ops in flight at most (per process)
    run_tag: str  # unique per run: request ids never repeat
    # redis layer
    prefix: str = ""
    identity: dict[str, Any] = field(default_factory=dict)
    # service layer
    namespace: str = ""
    key_sha256: str = ""
    settle_sample_every: int = SETTLE_SAMPLE_EVERY


@dataclass
class OpRecord:
    lat_a: list[float] = field(default_factory=list)  # reserve (redis) / request->reply (service), ms
    lat_b: list[float] = field(default_factory=list)  # settle (redis), ms
    lag: list[float] = field(default_factory=list)  # start lag behind the open-loop schedule, ms
    ok: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    first_done: float = 0.0
    last_done: float = 0.0

    def error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1

    def done(self, t: float) -> None:
        self.ok += 1
        if not self.first_done:
            self.first_done = t
        self.last_done = max(self.last_done, t)


def _worker_main(spec: WorkerSpec, ready: Queue[Any], start: Event, t0_wall: Any, results: Queue[Any]) -> None:
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format=f"%(asctime)s budget_bench[{spec.layer}-{spec.index}] %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
    )
    logging.getLogger("llmlab_common.natsio").setLevel(logging.ERROR)  # "disconnected" on close
    try:
        out = asyncio.run(_worker(spec, ready, start, t0_wall))
    except Exception as exc:  # reported to the parent, which fails the run
        logging.getLogger("budget_bench").exception("load process failed")
        out = {"index": spec.index, "fatal": f"{type(exc).__name__}: {exc}"}
        with contextlib.suppress(Exception):
            ready.put(spec.index)
    results.put(out)


async def _worker(spec: WorkerSpec, ready: Queue[Any], start: Event, t0_wall: Any) -> dict[str, Any]:
    wlog = logging.getLogger("budget_bench")
    runner: _RedisLoad | _ServiceLoad
    if spec.layer == "redis":
        runner = await _RedisLoad.create(spec)
    else:
        runner = await _ServiceLoad.create(spec)
    try:
        ready.put(spec.index)
        if not await asyncio.to_thread(start.wait, 120):
            raise TimeoutError("no start signal")
        t0 = time.perf_counter() + (t0_wall.value - time.time())
        warm, meas = OpRecord(), OpRecord()
        n_warm = round(spec.warmup * spec.rate)
        n_total = n_warm + round(spec.duration * spec.rate)
        t_meas = t0 + n_warm / spec.rate
        t_end = t0 + n_total / spec.rate
        cutoff = t_end + LATE_CUTOFF_S
        cpu_start: tuple[os.times_result, float] | None = None
        next_i = 0

        async def mark_window() -> None:
            nonlocal cpu_start
            await asyncio.sleep(max(0.0, t_meas - time.perf_counter()))
            cpu_start = (os.times(), time.perf_counter())

        async def lane() -> None:
            # Open loop with bounded concurrency: a lane takes the next op of the schedule, waits
            # for its start time, runs it. Lanes that fall behind start ops late (start lag), and
            # ops not started by the cutoff are dropped (counted), so an overload ends on time.
            nonlocal next_i
            while next_i < n_total:
                i = next_i
                next_i += 1
                sched = t0 + i / spec.rate
                delay = sched - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                elif time.perf_counter() > cutoff:
                    (warm if i < n_warm else meas).error("not_started_by_cutoff")
                    continue
                rec = warm if i < n_warm else meas
                rec.lag.append((time.perf_counter() - sched) * 1000.0)
                await runner.op(i, rec)

        marker = asyncio.create_task(mark_window())
        await asyncio.gather(*(lane() for _ in range(spec.lanes)))
        now = time.perf_counter()
        await marker
        cpu_end = (os.times(), time.perf_counter())
        assert cpu_start is not None
        (c0, w0), (c1, w1) = cpu_start, cpu_end
        cpu_s = (c1.user + c1.system) - (c0.user + c0.system)
        wall = max(1e-9, w1 - w0)
        wlog.info(
            "%s done: %d ok, %d errors (measured), %.2f cores over %.1f s (schedule ended %.0f ms late)",
            spec.layer,
            meas.ok,
            sum(meas.errors.values()),
            cpu_s / wall,
            wall,
            max(0.0, now - t_end) * 1000,
        )
        return {
            "index": spec.index,
            "pid": os.getpid(),
            "rate": spec.rate,
            "t_measure_start": t_meas,
            "t_schedule_end": t_end,
            "measured": asdict(meas),
            "warmup": asdict(warm),
            "cpu_s": cpu_s,
            "cpu_wall_s": wall,
            "extra": runner.extra(),
        }
    finally:
        await runner.close()


class _RedisLoad:
    """Reserve then settle one unique request id per op, straight on the Lua ledger."""

    def __init__(self, spec: WorkerSpec) -> None:

        self.spec = spec
        pool = BlockingConnectionPool.from_url(spec.redis_url, max_connections=spec.redis_pool, timeout=10)
        # Packed in C as the service's own client packs them (llmlab_budget.app.open_redis).
        self.redis = Redis(connection_pool=pack_in_c(pool))
        self.ledger = Ledger(self.redis, Layout(spec.prefix), settled_ttl_s=3600)
        self.identity = Identity(**spec.identity)
        self.limits: dict[ScopeName, LimitSet] = {s: LimitSet.model_validate(BIG_LIMITS) for s in SCOPES}
        self.policy = PlanBudget()
        self.tz = ZoneInfo("UTC")

    @classmethod
    async def create(cls, spec: WorkerSpec) -> _RedisLoad:
        self = cls(spec)
        await self.redis.ping()
        # Load both scripts now (EVALSHA from the first op on, as in the service after its first call).
        await self.ledger._reserve.registered_client.script_load(self.ledger._reserve.script)
        await self.ledger._settle.registered_client.script_load(self.ledger._settle.script)
        return self

    async def op(self, i: int, rec: OpRecord) -> None:
        rid = f"{self.spec.run_tag}-{self.spec.index}-{i}"
        now = time.time()
        try:
            t1 = time.perf_counter()
            r = await self.ledger.reserve(
                rid,
                self.identity,
                self.limits,
                self.policy,
                input_tokens=INPUT_TOKENS,
                output_tokens=MAX_TOKENS,
                tools_exempt=0,
                now=now,
                windows=Windows.at(now, self.tz),
                hold_s=600,
            )
            t2 = time.perf_counter()
            if r.status != "ok":
                rec.error(f"reserve_{r.status}")
                return
            c = await self.ledger.close(
                rid, "settled", input_tokens=INPUT_TOKENS, output_tokens=OUTPUT_TOKENS, now=time.time()
            )
            t3 = time.perf_counter()
        except Exception as exc:
            rec.error(type(exc).__name__)
            return
        if c.status != "ok":
            rec.error(f"settle_{c.status}")
            return
        rec.lat_a.append((t2 - t1) * 1000.0)
        rec.lat_b.append((t3 - t2) * 1000.0)
        rec.done(t3)

    def extra(self) -> dict[str, Any]:
        return {}

    async def close(self) -> None:
        await self.redis.aclose()


class _ServiceLoad:
    """One ReserveRequest per op over NATS request/reply; a sample also publishes its settlement."""

    def __init__(self, spec: WorkerSpec) -> None:

        self.spec = spec
        self.topo = Topology(spec.namespace)
        self.subject = self.topo.budget_reserve_subject
        self.samples: list[tuple[str, float]] = []  # (request id, publish time) of settlement events
        self.nc: Any = None

    @classmethod
    async def create(cls, spec: WorkerSpec) -> _ServiceLoad:

        self = cls(spec)
        self.nc = await connect(spec.nats_url, f"budget-bench-{spec.index}")
        return self

    async def op(self, i: int, rec: OpRecord) -> None:

        rid = f"{self.spec.run_tag}-{self.spec.index}-{i}"
        now = time.time()
        data = ReserveRequest(
            request_id=rid,
            key_sha256=self.spec.key_sha256,
            model="bench-model",
            input_tokens=INPUT_TOKENS,
            requested_max_tokens=MAX_TOKENS,
            deadline=now + 600,
        ).model_dump_json(exclude_none=True)
        try:
            t1 = time.perf_counter()
            msg = await self.nc.request(self.subject, data.encode(), timeout=REQUEST_TIMEOUT_S)
            t2 = time.perf_counter()
        except Exception as exc:
            rec.error(type(exc).__name__)
            return
        reply = ReserveReply.model_validate_json(msg.data)
        if reply.error is not None or reply.principal is None:
            rec.error(f"reply_{reply.error.code or reply.error.type}" if reply.error else "reply_no_principal")
            return
        rec.lat_a.append((t2 - t1) * 1000.0)
        rec.done(t2)
        if i % self.spec.settle_sample_every == 0:
            ended = time.time()
            ev = AttemptEvent(
                request_id=rid,
                attempt=0,
                outcome="completed",
                source="worker",
                worker_id="bench",
                pool="bench",
                deployment="bench",
                model="bench-model",
                endpoint="chat",
                principal=reply.principal,
                finish_reason="stop",
                usage=Usage(prompt_tokens=INPUT_TOKENS, completion_tokens=OUTPUT_TOKENS, total_tokens=300),
                created_at=now,
                ended_at=ended,
            )
            # Core publish on the stream's subject: JetStream stores it; no ack round trip here.
            await self.nc.publish(self.topo.attempt_event_subject, ev.model_dump_json(exclude_none=True).encode())
            self.samples.append((rid, ended))

    def extra(self) -> dict[str, Any]:
        return {"settle_samples": self.samples}

    async def close(self) -> None:
        if self.nc is not None:
            with contextlib.suppress(Exception):
                await self.nc.flush(timeout=5)
            with contextlib.suppress(Exception):
                await self.nc.close()


# ---------------------------------------------------------------------------------------------
# Measurement helpers (parent)
# ---------------------------------------------------------------------------------------------
def pct(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return {"n": 0, "p50": None, "p95": None, "p99": None, "max": None, "mean": None}
    a = np.asarray(values, dtype=float)
    p50, p95, p99 = (float(x) for x in np.percentile(a, [50, 95, 99]))
    return {"n": int(a.size), "p50": p50, "p95": p95, "p99": p99, "max": float(a.max()), "mean": float(a.mean())}


def redis_stats(r: redis_sync.Redis) -> dict[str, float]:
    cpu: dict[str, Any] = r.info("cpu")
    cmd: dict[str, Any] = r.info("commandstats")
    ev = cmd.get("cmdstat_evalsha") or {}
    return {
        "cpu_s": float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]),
        "evalsha_calls": float(ev.get("calls", 0)),
        "evalsha_usec": float(ev.get("usec", 0)),
    }


def find_process(name: str) -> psutil.Process | None:
    for p in psutil.process_iter(["name"]):
        if p.info["name"] == name:
            return p
    return None


def proc_cpu(p: psutil.Process | None) -> float | None:
    if p is None:
        return None
    try:
        t = p.cpu_times()
    except psutil.Error:
        return None
    return float(t.user + t.system)


@dataclass
class Snapshot:
    wall: float
    redis: dict[str, float]
    machine_busy_s: float
    service_cpu_s: float | None
    nats_cpu_s: float | None


def machine_busy_s() -> float:
    t = psutil.cpu_times()
    return float(sum(t) - t.idle - getattr(t, "iowait", 0.0))


def snapshot(r: redis_sync.Redis, service: psutil.Process | None, nats: psutil.Process | None) -> Snapshot:
    return Snapshot(time.perf_counter(), redis_stats(r), machine_busy_s(), proc_cpu(service), proc_cpu(nats))


def sleep_until(t_perf: float) -> None:
    time.sleep(max(0.0, t_perf - time.perf_counter()))


# ---------------------------------------------------------------------------------------------
# The benchmark
# ---------------------------------------------------------------------------------------------
class Bench:
    def __init__(self, cfg: BenchConfig) -> None:
        self.cfg = cfg
        self.ctx = mp.get_context("spawn")
        self.r = redis_sync.Redis.from_url(cfg.redis_url)
        self.nats_proc = find_process("nats-server")
        self.runs: list[dict[str, Any]] = []
        self.service_info: dict[str, Any] = {}

    # -- one run: N load processes, warm-up then measured window -------------------------------
    def run(
        self,
        layer: str,
        rate: float,
        repeat: int,
        base: WorkerSpec,
        service: psutil.Process | None = None,
    ) -> dict[str, Any]:
        cfg = self.cfg
        ready: Queue[Any] = self.ctx.Queue()
        results: Queue[Any] = self.ctx.Queue()
        start = self.ctx.Event()
        t0_wall = self.ctx.Value("d", 0.0)
        tag = f"{layer[0]}{repeat}r{int(rate)}-{uuid.uuid4().hex[:8]}"
        quiet = self._wait_machine_quiet()
        procs = []
        for i in range(cfg.procs):
            spec = WorkerSpec(**{**asdict(base), "index": i, "rate": rate / cfg.procs, "run_tag": tag})
            p = self.ctx.Process(
                target=_worker_main, args=(spec, ready, start, t0_wall, results), name=f"bench-{layer}-{i}"
            )
            p.start()
            procs.append(p)
        try:
            for _ in procs:
                ready.get(timeout=60)
            lead = 0.3
            t0_wall.value = time.time() + lead
            t0 = time.perf_counter() + lead
            start.set()
            log.info(
                "%s layer, %.0f ops/s, repeat %d: %d process(es), %.1f s warm-up + %.1f s measured",
                layer,
                rate,
                repeat,
                cfg.procs,
                cfg.warmup,
                cfg.duration,
            )
            sleep_until(t0 + cfg.warmup)
            before = snapshot(self.r, service, self.nats_proc)
            sleep_until(t0 + cfg.warmup + cfg.duration)
            after = snapshot(self.r, service, self.nats_proc)
            outs = [results.get(timeout=REQUEST_TIMEOUT_S + 60) for _ in procs]
        finally:
            for p in procs:
                p.join(timeout=15)
                if p.is_alive():
                    log.warning("load process %s did not exit; terminating it", p.pid)
                    p.terminate()
                    p.join(5)
        fatal = [o["fatal"] for o in outs if "fatal" in o]
        if fatal:
            raise RuntimeError(f"load process failed: {fatal}")
        run = self._summarise(layer, rate, repeat, outs, before, after)
        run["before_run"] = quiet
        return run

    def _wait_machine_quiet(self) -> dict[str, Any]:
        """This box is shared: wait (bounded) until other processes leave the CPU mostly idle."""
        cfg = self.cfg
        deadline = time.monotonic() + cfg.quiet_wait
        busy = 0.0
        while True:
            b0, t0 = machine_busy_s(), time.perf_counter()
            time.sleep(0.5)
            busy = (machine_busy_s() - b0) / (time.perf_counter() - t0)
            if busy < cfg.quiet_cores:
                return {"quiet": True, "busy_cores": busy}
            if time.monotonic() >= deadline:
                log.warning(
                    "other processes keep %.2f cores busy after %.0f s of waiting: measuring anyway",
                    busy,
                    cfg.quiet_wait,
                )
                return {"quiet": False, "busy_cores": busy}

    def _summarise(
        self, layer: str, rate: float, repeat: int, outs: list[dict[str, Any]], before: Snapshot, after: Snapshot
    ) -> dict[str, Any]:
        cfg = self.cfg
        outs.sort(key=lambda o: o["index"])
        wall = after.wall - before.wall

        def merged(phase: str, key: str) -> list[float]:
            return [x for o in outs for x in o[phase][key]]

        def errors(phase: str) -> dict[str, int]:
            e: dict[str, int] = {}
            for o in outs:
                for k, v in o[phase]["errors"].items():
                    e[k] = e.get(k, 0) + v
            return e

        ok = sum(o["measured"]["ok"] for o in outs)
        scheduled = sum(round(cfg.duration * o["rate"]) for o in outs)
        # Achieved: completed measured ops over the time from the window's start to the last
        # completion (a client or server that falls behind stretches it).
        t_start = min(o["t_measure_start"] for o in outs)
        t_last = max((o["measured"]["last_done"] for o in outs if o["measured"]["ok"]), default=t_start)
        span = max(t_last - t_start, cfg.duration)
        a_name, b_name = ("reserve_ms", "settle_ms") if layer == "redis" else ("request_reply_ms", None)
        rd = {k: after.redis[k] - before.redis[k] for k in after.redis}
        run: dict[str, Any] = {
            "layer": layer,
            "rate_offered": rate,
            "repeat": repeat,
            "op": (
                "1 reserve.lua + 1 settle.lua call (Ledger.reserve, Ledger.close settled)"
                if layer == "redis"
                else "1 ReserveRequest -> ReserveReply over NATS request/reply"
            ),
            "ops_scheduled": scheduled,
            "ops_ok": ok,
            "errors": errors("measured"),
            "achieved_ops_per_s": ok / span,
            "completion_span_s": span,
            a_name: pct(merged("measured", "lat_a")),
            "start_lag_ms": pct(merged("measured", "lag")),
            "client_processes": [
                {
                    "index": o["index"],
                    "pid": o["pid"],
                    "ops_ok": o["measured"]["ok"],
                    "cpu_s": o["cpu_s"],
                    "cpu_cores": o["cpu_s"] / o["cpu_wall_s"],
                    "wall_s": o["cpu_wall_s"],
                }
                for o in outs
            ],
            "window_s": wall,
            "redis_cpu_cores": rd["cpu_s"] / wall,
            "redis_evalsha": {
                "calls_per_s": rd["evalsha_calls"] / wall,
                "server_usec_per_call_mean": (rd["evalsha_usec"] / rd["evalsha_calls"])
                if rd["evalsha_calls"]
                else None,
                "note": "INFO commandstats delta over the window: every client's EVALSHA on this Redis",
            },
            "machine_busy_cores": (after.machine_busy_s - before.machine_busy_s) / wall,
            "nats_server_cpu_cores": (
                (after.nats_cpu_s - before.nats_cpu_s) / wall
                if after.nats_cpu_s is not None and before.nats_cpu_s is not None
                else None
            ),
            "warmup": {
                "seconds": cfg.warmup,
                "ops_ok": sum(o["warmup"]["ok"] for o in outs),
                "errors": errors("warmup"),
                a_name: pct(merged("warmup", "lat_a")),
            },
        }
        if b_name:
            run[b_name] = pct(merged("measured", "lat_b"))
            run["warmup"][b_name] = pct(merged("warmup", "lat_b"))
        if after.service_cpu_s is not None and before.service_cpu_s is not None:
            run["service_cpu_cores"] = (after.service_cpu_s - before.service_cpu_s) / wall
        ours = (
            sum(p["cpu_cores"] for p in run["client_processes"])
            + run["redis_cpu_cores"]
            + (run.get("service_cpu_cores") or 0.0)
            + (run["nats_server_cpu_cores"] or 0.0)
        )
        # Everything else on the machine (other users of this shared box, this script's parent).
        run["other_load_cores"] = max(0.0, run["machine_busy_cores"] - ours)
        samples = [s for o in outs for s in o["extra"].get("settle_samples", [])]
        if samples:
            run["settlement"] = self._settlement_lag(samples)
        cl = ", ".join(f"{p['cpu_cores']:.2f}" for p in run["client_processes"])
        log.info(
            "  -> %.0f ops/s achieved (%d/%d ok, errors %s); %s p50 %.3f p99 %.3f ms%s; "
            "client cores [%s], redis %.2f, machine %.2f",
            run["achieved_ops_per_s"],
            ok,
            scheduled,
            run["errors"] or "none",
            a_name,
            run[a_name]["p50"] or float("nan"),
            run[a_name]["p99"] or float("nan"),
            f"; settle p50 {run[b_name]['p50'] or float('nan'):.3f} p99 {run[b_name]['p99'] or float('nan'):.3f} ms"
            if b_name
            else "",
            cl,
            run["redis_cpu_cores"],
            run["machine_busy_cores"],
        )
        return run

    def _settlement_lag(self, samples: list[tuple[str, float]]) -> dict[str, Any]:
        """closed_at (set by the service when it settles) minus the event's publish time."""

        layout = Layout.for_namespace(self.service_info["namespace"])
        deadline = time.monotonic() + 10
        lags: list[float] = []
        pending = list(samples)
        while pending and time.monotonic() < deadline:
            pipe = self.r.pipeline(transaction=False)
            for rid, _ in pending:
                pipe.hmget(layout.reservation(rid), "state", "closed_at")
            rows = pipe.execute()
            left = []
            for (rid, t_pub), (state, closed) in zip(pending, rows, strict=True):
                if state == b"settled" and closed:
                    lags.append((float(closed) - t_pub) * 1000.0)
                else:
                    left.append((rid, t_pub))
            pending = left
            if pending:
                time.sleep(0.2)
        out: dict[str, Any] = {
            "sampled": len(samples),
            "settled": len(lags),
            "unsettled_after_wait": len(pending),
            "lag_ms": pct(lags),
            "note": f"1 in {self.cfg.settle_sample_every} reserved requests publishes a completed AttemptEvent "
            "(core NATS publish into the events stream); lag = the reservation's closed_at (service clock) "
            "minus the publish time (client clock, same host)",
        }
        return out

    # -- layer 1 ------------------------------------------------------------------------------
    def redis_layer(self) -> None:
        cfg = self.cfg
        prefix = f"bench_{uuid.uuid4().hex[:12]}:bud"
        ident = {"tenant_id": "ten_bench", "team_id": "team_bench", "user_id": "usr_bench", "key_id": "key_bench"}

        layout = Layout(prefix)
        self.r.hset(layout.key(ident["key_id"]), mapping={"revoked_at": "", "tenant_id": ident["tenant_id"]})
        base = self._spec("redis", prefix=prefix, identity={**ident, "plan": "enterprise"})
        try:
            for rate in cfg.rates:
                for rep in range(1, cfg.repeats + 1):
                    self.runs.append(self.run("redis", rate, rep, base))
        finally:
            self._delete_prefix(f"{prefix}:*")

    def _spec(self, layer: str, **extra: Any) -> WorkerSpec:
        """A load process's orders for ``layer``; ``run`` fills in index, rate and run tag."""
        cfg = self.cfg
        return WorkerSpec(
            layer=layer,
            index=0,
            rate=0,
            warmup=cfg.warmup,
            duration=cfg.duration,
            redis_url=cfg.redis_url,
            nats_url=cfg.nats_url,
            redis_pool=cfg.redis_pool,
            lanes=cfg.lanes,
            run_tag="",
            **extra,
        )

    # -- layer 2 ------------------------------------------------------------------------------
    def service_layer(self) -> None:

        cfg = self.cfg
        ns = "bbench" + uuid.uuid4().hex[:8]
        stack = Stack(ns, nats_url=cfg.nats_url, redis_url=cfg.redis_url)
        self.service_info = {"namespace": ns}
        try:
            budget = stack.budget(env={"LLMLAB_LOG_JSON": "true", "LLMLAB_LOG_LEVEL": "WARNING"})
            self.service_info.update(pid=budget.pid, log=str(budget.log_path))
            key_sha = self._provision(ns, stack.base_env())
            svc = psutil.Process(budget.pid)
            base = self._spec("service", namespace=ns, key_sha256=key_sha, settle_sample_every=cfg.settle_sample_every)
            for rate in cfg.rates:
                for rep in range(1, cfg.repeats + 1):
                    self._wait_quiet(svc)
                    self.runs.append(self.run("service", rate, rep, base, service=svc))
            if not budget.alive():
                raise RuntimeError(f"budget service died:\n{budget.tail()}")
        finally:
            stack.close()  # its processes, then the namespace's streams and Redis keys

    def _provision(self, ns: str, env: dict[str, str]) -> str:
        """A key via the bootstrap CLI, then huge limits on its 4 scopes via the Directory."""
        with tempfile.TemporaryDirectory() as tmp:
            key_file = Path(tmp) / "api-key"
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "llmlab_budget.bootstrap",
                    "--tenant",
                    "bench",
                    "--plan",
                    "enterprise",
                    "--key-file",
                    str(key_file),
                ],
                env={**os.environ, **env},
                capture_output=True,
                text=True,
                timeout=60,
            )
            if proc.returncode != 0:
                raise RuntimeError(f"bootstrap failed: {proc.stderr[-2000:]}")
            api_key = key_file.read_text().strip()
        sha = hashlib.sha256(api_key.encode()).hexdigest()
        asyncio.run(self._overrides(ns, sha))
        return sha

    async def _overrides(self, ns: str, sha: str) -> None:

        redis = Redis.from_url(self.cfg.redis_url)
        try:
            d = Directory(redis, Layout.for_namespace(ns), load_catalog(InfraSettings().catalog_path))
            ident = await d.identity_for_key_hash(sha)
            if ident is None:
                raise RuntimeError("the bootstrapped key does not authenticate")
            for scope in SCOPES:
                await d.set_overrides(scope, ident.scope_id(scope), dict(BIG_LIMITS))
            self.service_info.update(identity=asdict(ident), limits_all_scopes=BIG_LIMITS)
        finally:
            await redis.aclose()

    def _wait_quiet(self, svc: psutil.Process, cores: float = 0.15, timeout: float = 15.0) -> None:
        """Before a run: the service has finished any backlog of the previous one."""
        deadline = time.monotonic() + timeout
        svc.cpu_percent(None)
        while time.monotonic() < deadline:
            time.sleep(0.5)
            if svc.cpu_percent(None) / 100.0 < cores:
                return
        log.warning("budget service still busy after %.0f s; starting anyway", timeout)

    def _delete_prefix(self, pattern: str) -> None:
        n = 0
        batch: list[bytes] = []
        for k in self.r.scan_iter(match=pattern, count=5000):
            batch.append(k)
            if len(batch) >= 5000:
                n += int(self.r.unlink(*batch))
                batch = []
        if batch:
            n += int(self.r.unlink(*batch))
        log.info("deleted %d Redis keys matching %s", n, pattern)

    def close(self) -> None:
        self.r.close()


# ---------------------------------------------------------------------------------------------
# Summary and reports
# ---------------------------------------------------------------------------------------------
def _mean_spread(vals: list[float | None]) -> dict[str, Any]:
    v = [x for x in vals if x is not None]
    return {
        "runs": vals,
        "mean": (sum(v) / len(v)) if v else None,
        "spread": (max(v) - min(v)) if len(v) > 1 else None,
    }


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    groups: list[dict[str, Any]] = []
    keys = sorted({(r["layer"], r["rate_offered"]) for r in runs}, key=lambda k: (LAYERS.index(k[0]), -k[1]))
    for layer, rate in keys:
        rs = [r for r in runs if r["layer"] == layer and r["rate_offered"] == rate]
        calls = ("reserve_ms", "settle_ms") if layer == "redis" else ("request_reply_ms",)
        g: dict[str, Any] = {"layer": layer, "rate_offered": rate, "repeats": len(rs)}
        for c in calls:
            for q in ("p50", "p95", "p99", "max"):
                g[f"{c}_{q}"] = _mean_spread([r[c][q] for r in rs])
        g["achieved_ops_per_s"] = _mean_spread([r["achieved_ops_per_s"] for r in rs])
        g["client_cpu_cores_per_process"] = _mean_spread(
            [max(p["cpu_cores"] for p in r["client_processes"]) for r in rs]
        )
        g["redis_cpu_cores"] = _mean_spread([r["redis_cpu_cores"] for r in rs])
        g["machine_busy_cores"] = _mean_spread([r["machine_busy_cores"] for r in rs])
        g["other_load_cores"] = _mean_spread([r["other_load_cores"] for r in rs])
        if layer == "service":
            g["service_cpu_cores"] = _mean_spread([r.get("service_cpu_cores") for r in rs])
            g["settlement_lag_p99_ms"] = _mean_spread(
                [(r.get("settlement") or {}).get("lag_ms", {}).get("p99") for r in rs]
            )
        g["errors"] = sum(sum(r["errors"].values()) for r in rs)
        groups.append(g)
    targets = []
    for g in groups:
        if g["layer"] != "redis":
            continue
        for c in ("reserve_ms", "settle_ms"):
            worst = max((x for x in g[f"{c}_p99"]["runs"] if x is not None), default=None)
            achieved = g["achieved_ops_per_s"]["mean"] or 0.0
            at_rate = achieved >= 0.98 * g["rate_offered"]
            ok = worst is not None and worst <= TARGET_P99_MS and at_rate and g["errors"] == 0
            targets.append(
                {
                    "target": f"{c[:-3]} p99 <= {TARGET_P99_MS:g} ms at {g['rate_offered']:.0f} ops/s (Lua layer)",
                    "value_worst_repeat_ms": worst,
                    "result": "PASS" if ok else "MISS",
                    "note": "" if at_rate else f"rate not sustained: {achieved:.0f} ops/s achieved",
                }
            )
    return {"groups": groups, "targets": targets, "analysis": analyse(groups, runs)}


def analyse(groups: list[dict[str, Any]], runs: list[dict[str, Any]]) -> list[str]:
    cores = psutil.cpu_count() or 2
    out: list[str] = []
    for g in groups:
        rate, ach = g["rate_offered"], g["achieved_ops_per_s"]["mean"] or 0.0
        busy = g["machine_busy_cores"]["mean"] or 0.0
        client = g["client_cpu_cores_per_process"]["mean"] or 0.0
        what = f"{g['layer']} layer at {rate:.0f} ops/s"
        if ach < 0.98 * rate:
            out.append(
                f"{what}: only {ach:.0f} ops/s achieved ({ach / rate:.0%}); the machine was {busy:.2f} of "
                f"{cores} cores busy, the busiest load process {client:.2f} cores"
                + (
                    f", the budget service {g['service_cpu_cores']['mean']:.2f} cores (one Python event loop)"
                    if g["layer"] == "service" and g["service_cpu_cores"]["mean"] is not None
                    else ""
                )
                + f", Redis {g['redis_cpu_cores']['mean']:.2f} cores (single-threaded), other processes on "
                f"this shared box {g['other_load_cores']['mean']:.2f} cores."
            )
        else:
            out.append(
                f"{what}: sustained ({ach:.0f} ops/s); machine {busy:.2f} of {cores} cores busy "
                f"(other processes {g['other_load_cores']['mean']:.2f})."
            )
        if busy >= 0.95 * cores:
            out.append(
                f"{what}: the machine's {cores} cores were saturated ({busy:.2f} busy): the load processes, Redis "
                "and the service waited for CPU, so the latencies include run-queue waits, not only service time."
            )
        if client >= 0.85:
            out.append(
                f"{what}: a load process used {client:.2f} cores: the client is (near) saturated, so its "
                "event-loop delay is part of the measured latency (an upper bound on the server's part)."
            )
    for r in runs:
        if r["layer"] == "redis" and r["redis_evalsha"]["server_usec_per_call_mean"] is not None:
            out.append(
                f"redis {r['rate_offered']:.0f} ops/s repeat {r['repeat']}: Redis itself spent "
                f"{r['redis_evalsha']['server_usec_per_call_mean']:.0f} µs "
                f"per EVALSHA on average (server side, INFO commandstats) against a client-observed reserve p50 of "
                f"{r['reserve_ms']['p50']:.3f} ms: the rest is the network stack, redis-py and the event loop."
            )
    return out


def build_document(cfg: BenchConfig, bench: Bench, started: dt.datetime, duration_s: float) -> dict[str, Any]:
    r = bench.r
    server: dict[str, Any] = r.info("server")
    nats_version = "unknown"
    with contextlib.suppress(Exception):
        nats_version = subprocess.run(
            ["nats-server", "--version"], capture_output=True, text=True, timeout=5
        ).stdout.strip()
    meta = metadata_block(
        started=started,
        duration_s=duration_s,
        engine="n/a (no inference engine: the budget service's Redis/Lua ledger and NATS reserve path)",
        model_id="n/a (no model is involved)",
        concurrency=(
            f"open loop at a fixed rate from {cfg.procs} load process(es), at most {cfg.lanes} ops in flight per "
            f"process (late starts recorded as start lag; ops not started {LATE_CUTOFF_S:g} s after the schedule's "
            f"end dropped and counted); Redis BlockingConnectionPool of {cfg.redis_pool} per process (redis layer)"
        ),
        warmup=f"{cfg.warmup:g} s at the run's rate before every measured run, reported apart",
        prompt_dataset="n/a (no prompts: synthetic reservations)",
        input_length_distribution=f"constant {INPUT_TOKENS} input tokens per reservation",
        output_length_distribution=(
            f"max_tokens {MAX_TOKENS} requested; settled with {OUTPUT_TOKENS} output tokens (redis layer and "
            "the sampled service-layer settlement events)"
        ),
        sampling_parameters="n/a (no generation)",
        command=cfg.command,
        simulated=False,
        model_revision="n/a (no model)",
        engine_version="n/a (no engine)",
        gpu="n/a (CPU-only benchmark; no GPU involved)",
        label=LABEL,
        simulated_note="not simulated: " + LABEL,
        redis_version=server.get("redis_version", "unknown"),
        nats_server_version=nats_version or "unknown",
        redis_py_version=dist_version("redis"),
        nats_py_version=dist_version("nats-py"),
        load_processes=cfg.procs,
        rate_ops_per_s=cfg.rate,
        rates_ops_per_s=cfg.rates,
        measured_duration_per_run=f"{cfg.duration:g} s",
        repeats=cfg.repeats,
        quick=cfg.quick,
        op_definition={
            "redis": "1 op = 1 Ledger.reserve (reserve.lua) + 1 Ledger.close settled (settle.lua) of a unique "
            "request id; rate 5000 = 5,000 reserves/s + 5,000 settles/s",
            "service": "1 op = 1 ReserveRequest over NATS request/reply to the budget service (auth + reserve.lua)",
        },
        limits="huge limits on all 4 scopes (key, user, team, tenant): " + json.dumps(BIG_LIMITS),
        budget_service=bench.service_info,
        target=f"redis layer p99 <= {TARGET_P99_MS:g} ms per reserve and per settle",
    )
    return {"metadata": meta, "summary": summarise(bench.runs), "runs": bench.runs}


def _f(x: Any, nd: int = 3) -> str:
    return "—" if x is None else f"{x:.{nd}f}" if isinstance(x, float | int) else str(x)


def render_markdown(doc: dict[str, Any]) -> str:
    meta, summ = doc["metadata"], doc["summary"]
    out = [
        f"# Budget benchmark {meta['date']}",
        "",
        f"> {LABEL}. Open-loop load from {meta['load_processes']} separate process(es); latency is "
        "`perf_counter` around each awaited call (client-observed).",
        "",
        f"Command: `{meta['command_line']}`  ",
        f"Commit `{meta['git_commit'][:12]}`{' (dirty working tree)' if meta['git_dirty'] else ''}; "
        f"{meta['cpu']}; {meta['ram']} RAM; Redis {meta['redis_version']}; {meta['nats_server_version']}; "
        f"{meta['measured_duration_per_run']} measured per run after {meta['warmup']}; "
        f"{meta['repeats']} repeat(s) per layer and rate.",
        "",
        "What an op is: **redis** — " + meta["op_definition"]["redis"] + "; **service** — "
        f"{meta['op_definition']['service']}.",
        "",
        "## Per run",
        "",
        "| layer | offered ops/s | repeat | achieved ops/s | ok / scheduled | errors | call | p50 ms | p95 ms | "
        "p99 ms | max ms | start lag p99 ms | client cores per process | Redis cores | service cores | "
        "nats cores | other load cores | machine busy cores |",
        "|---|---:|---:|---:|---|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in doc["runs"]:
        calls = ("reserve_ms", "settle_ms") if r["layer"] == "redis" else ("request_reply_ms",)
        for j, c in enumerate(calls):
            s = r[c]
            head = (
                f"| {r['layer']} | {r['rate_offered']:.0f} | {r['repeat']} | {r['achieved_ops_per_s']:.0f} | "
                f"{r['ops_ok']}/{r['ops_scheduled']} | {json.dumps(r['errors']) if r['errors'] else '0'} "
                if j == 0
                else "| | | | | | "
            )
            tail = (
                f"| {_f(r['start_lag_ms']['p99'], 2)} | "
                + ", ".join(f"{p['cpu_cores']:.2f}" for p in r["client_processes"])
                + f" | {_f(r['redis_cpu_cores'], 2)} | {_f(r.get('service_cpu_cores'), 2)} | "
                f"{_f(r['nats_server_cpu_cores'], 2)} | {_f(r['other_load_cores'], 2)} | "
                f"{_f(r['machine_busy_cores'], 2)} |"
                if j == 0
                else "| | | | | | | |"
            )
            out.append(
                head + f"| {c[:-3]} | {_f(s['p50'])} | {_f(s['p95'])} | {_f(s['p99'])} | {_f(s['max'], 2)} " + tail
            )
    out += [
        "",
        "## Mean of repeats (spread = max − min over repeats)",
        "",
        "| layer | offered ops/s | achieved ops/s | call | p50 ms (spread) | p99 ms (spread) | busiest client "
        "process cores |",
        "|---|---:|---:|---|---:|---:|---:|",
    ]
    for g in summ["groups"]:
        calls = ("reserve_ms", "settle_ms") if g["layer"] == "redis" else ("request_reply_ms",)
        for c in calls:
            p50, p99 = g[f"{c}_p50"], g[f"{c}_p99"]
            out.append(
                f"| {g['layer']} | {g['rate_offered']:.0f} | {_f(g['achieved_ops_per_s']['mean'], 0)} | {c[:-3]} | "
                f"{_f(p50['mean'])} ({_f(p50['spread'])}) | {_f(p99['mean'])} ({_f(p99['spread'])}) | "
                f"{_f(g['client_cpu_cores_per_process']['mean'], 2)} |"
            )
    sett = [r for r in doc["runs"] if r.get("settlement")]
    if sett:
        out += [
            "",
            "## Settlement lag over JetStream (service layer, sampled)",
            "",
            sett[0]["settlement"]["note"] + ".",
            "",
            "| offered ops/s | repeat | sampled | settled | p50 ms | p99 ms | max ms |",
            "|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in sett:
            s = r["settlement"]
            out.append(
                f"| {r['rate_offered']:.0f} | {r['repeat']} | {s['sampled']} | {s['settled']} | "
                f"{_f(s['lag_ms']['p50'], 1)} | {_f(s['lag_ms']['p99'], 1)} | {_f(s['lag_ms']['max'], 1)} |"
            )
    out += ["", "## Target", "", "| target | worst repeat p99 ms | result | note |", "|---|---:|---|---|"]
    for t in summ["targets"]:
        out.append(f"| {t['target']} | {_f(t['value_worst_repeat_ms'])} | **{t['result']}** | {t['note']} |")
    out += ["", "## What limits it", ""] + [f"- {line}" for line in summ["analysis"]]
    out += [
        "",
        "## Warm-up runs (not in the figures)",
        "",
        "| layer | offered ops/s | repeat | seconds | ok | errors | first call p50 ms | p99 ms |",
        "|---|---:|---:|---:|---:|---|---:|---:|",
    ]
    for r in doc["runs"]:
        w = r["warmup"]
        c = "reserve_ms" if r["layer"] == "redis" else "request_reply_ms"
        out.append(
            f"| {r['layer']} | {r['rate_offered']:.0f} | {r['repeat']} | {w['seconds']:g} | {w['ops_ok']} | "
            f"{json.dumps(w['errors']) if w['errors'] else '0'} | {_f(w[c]['p50'])} | {_f(w[c]['p99'])} |"
        )
    out += ["", "## Metadata", "", "| field | value |", "|---|---|"]
    for k, v in meta.items():
        out.append(f"| {k} | {json.dumps(v) if isinstance(v, dict | list) else v} |")
    return "\n".join(out) + "\n"


def render_plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = doc["runs"]
    bars: list[tuple[str, dict[str, Any]]] = []
    for r in runs:
        calls = ("reserve_ms", "settle_ms") if r["layer"] == "redis" else ("request_reply_ms",)
        for c in calls:
            name = {"reserve_ms": "reserve", "settle_ms": "settle", "request_reply_ms": "req→reply"}[c]
            bars.append((f"{r['layer']} {r['rate_offered']:.0f}/s\n{name} #{r['repeat']}", r[c]))
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(15, 6), gridspec_kw={"width_ratios": [2.2, 1]})
    xs = np.arange(len(bars))
    w = 0.27
    for k, (q, color) in enumerate((("p50", "#4C72B0"), ("p95", "#55A868"), ("p99", "#DD8452"))):
        vals = [b[1][q] or 0.0 for b in bars]
        ax.bar(xs + (k - 1) * w, vals, w, label=q, color=color)
        if q == "p99":
            for x, v in zip(xs, vals, strict=True):
                ax.annotate(f"{v:.2f}", (x + w, max(v, 1e-3)), ha="center", va="bottom", fontsize=6)
    ax.axhline(TARGET_P99_MS, color="red", linestyle="--", linewidth=1, label=f"target p99 {TARGET_P99_MS:g} ms (Lua)")
    ax.set_yscale("log")
    ax.set_xticks(xs, [b[0] for b in bars], fontsize=7)
    ax.set_ylabel("latency ms (log)")
    ax.set_title("Client-observed latency per call, per layer, rate and repeat")
    ax.legend(fontsize=8)
    labels = [f"{r['layer'][:3]} {r['rate_offered']:.0f}\n#{r['repeat']}" for r in runs]
    pos = np.arange(len(runs))
    bottom = np.zeros(len(runs))
    n_clients = max(len(r["client_processes"]) for r in runs)
    parts: list[tuple[str, list[float]]] = [
        (
            f"client {i}",
            [r["client_processes"][i]["cpu_cores"] if i < len(r["client_processes"]) else 0.0 for r in runs],
        )
        for i in range(n_clients)
    ]
    parts += [
        ("redis-server", [r["redis_cpu_cores"] for r in runs]),
        ("budget service", [r.get("service_cpu_cores") or 0.0 for r in runs]),
        ("nats-server", [r["nats_server_cpu_cores"] or 0.0 for r in runs]),
        ("other processes", [r["other_load_cores"] for r in runs]),
    ]
    for name, vals in parts:
        ax2.bar(pos, vals, 0.6, bottom=bottom, label=name)
        bottom += np.asarray(vals)
    ax2.plot(pos, [r["machine_busy_cores"] for r in runs], "k_", markersize=20, label="machine busy")
    cores = psutil.cpu_count() or 2
    ax2.axhline(cores, color="red", linestyle="--", linewidth=1, label=f"{cores} cores")
    ax2.set_xticks(pos, labels, fontsize=7)
    ax2.set_ylabel("cores (mean over the measured window)")
    ax2.set_title("CPU by process")
    ax2.legend(fontsize=7)
    meta = doc["metadata"]
    fig.suptitle(f"Budget benchmark {meta['date']} — {LABEL}, commit {meta['git_commit'][:10]}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report_lines(doc: dict[str, Any], paths: dict[str, Path]) -> list[str]:
    out = ["", f"Budget benchmark ({LABEL}): mean of repeats (spread)"]
    out.append(
        f"{'layer':<8} {'offered/s':>9} {'achieved/s':>10} {'call':<14} {'p50 ms':>16} {'p99 ms':>16} client cores"
    )
    for g in doc["summary"]["groups"]:
        calls = ("reserve_ms", "settle_ms") if g["layer"] == "redis" else ("request_reply_ms",)
        for c in calls:
            p50, p99 = g[f"{c}_p50"], g[f"{c}_p99"]
            out.append(
                f"{g['layer']:<8} {g['rate_offered']:>9.0f} {g['achieved_ops_per_s']['mean'] or 0:>10.0f} "
                f"{c[:-3]:<14} {_f(p50['mean']) + ' (' + _f(p50['spread']) + ')':>16} "
                f"{_f(p99['mean']) + ' (' + _f(p99['spread']) + ')':>16} "
                f"{_f(g['client_cpu_cores_per_process']['mean'], 2)}"
            )
    out += ["", "Target:"]
    for t in doc["summary"]["targets"]:
        note = f"  ({t['note']})" if t["note"] else ""
        out.append(f"  {t['result']:<4} {t['target']}: worst repeat {_f(t['value_worst_repeat_ms'])} ms{note}")
    out += ["", "What limits it:"] + [f"  - {line}" for line in doc["summary"]["analysis"]]
    out += ["", "Wrote " + ", ".join(str(x) for x in paths.values())]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse_args(argv)
    started = dt.datetime.now(dt.UTC)
    t_start = time.monotonic()
    bench = Bench(cfg)
    try:
        bench.redis_layer()
        bench.service_layer()
        doc = build_document(cfg, bench, started, time.monotonic() - t_start)
    except KeyboardInterrupt:
        log.warning("interrupted (the service was stopped and the namespace's keys and streams deleted)")
        return 130
    finally:
        bench.close()
    paths = write_outputs(doc, cfg.out, started, "budget", render_markdown, render_plot)
    for line in report_lines(doc, paths):
        print(line)  # noqa: T201
    log.info("done in %.0f s", time.monotonic() - t_start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
