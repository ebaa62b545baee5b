"""Relay benchmark: what the stack (gateway -> NATS JetStream -> worker) adds over calling the
engine directly.

    python -m llmlab_loadtest.relay_bench                      # levels 1,100,1000, 2 repeats (~5 min)
    python -m llmlab_loadtest.relay_bench --quick              # levels 1,100, 1 repeat, 64 tokens (~1 min)
    python -m llmlab_loadtest.relay_bench --levels 1000 --repeats 3

One engine simulator (vLLM flavour, TTFT 100 ms, ITL 50 ms, 256 output tokens) serves both paths:
the stack's worker points at it, and the "direct" runs hit it directly. For each concurrency level
a warm-up run per mode comes first (reported apart), then measured runs interleave direct, stack,
direct, stack ... The load client is :mod:`llmlab_loadtest.sse_client` in its own process. While a run
goes, psutil samples CPU seconds and RSS of the simulator, worker, gateway, nats-server and client
(and, in the full stack, budget, router, accounting and redis-server).

Writes ``results/relay/<UTC ts>/result.{json,md,png}`` and ``results/relay/latest/result.json``. The targets
(added TTFT p50 <= 5 ms and p99 <= 25 ms, >= 95 % of direct tokens/s at 1,000 streams) are
benchmark figures, not a test: MISS does not fail the command (exit status 0 unless the
benchmark itself broke).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import itertools
import json
import logging
import os
import platform
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
import psutil
from llmlab_common.messages import HEARTBEAT_MISSES
from llmlab_testkit.budget import BudgetAdmin
from llmlab_testkit.procs import ManagedProcess, Stack, unique_namespace, url

from llmlab_loadtest import promscrape
from llmlab_loadtest.bench_meta import (
    cpu_model,
    dirty_files,
    dist_version,
    git,
    metadata_cores,
    require_committed,
    write_outputs,
)
from llmlab_loadtest.profiles import py_spy
from llmlab_loadtest.profiles import summary as profile_summary
from llmlab_loadtest.settings_arg import parse_setting
from llmlab_loadtest.sse_client import percentile, raise_nofile_limit

log = logging.getLogger("relay_bench")

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
API_KEY = "sk-llmlab-dev"
POOL = "gpu-vllm"
# --workload -> results/<name>/<ts>/
WORKLOAD_NAMES = {
    "default": "relay",
    "gpu-like": "relay-gpu",
    "thousand": "relay-thousand",
    "capacity": "relay-capacity",
}
MODES = ("direct", "stack")
SERVICES = ("simulator", "worker", "gateway", "nats-server")
SATURATED_CORE = 0.85  # a single-threaded event loop at >= this share of one core is the bottleneck

# Targets (benchmark figures, compared and printed; never asserted).
TARGET_ADDED_TTFT_P50_MS = 5.0
TARGET_ADDED_TTFT_P99_MS = 25.0
TARGET_TOKENS_RATIO = 0.95
TARGET_TOKENS_LEVEL = 1000


# ---------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------
@dataclass
class BenchConfig:
    levels: list[int]
    repeats: int
    tokens: int
    warmup_tokens: int
    ttft_ms: float = 100.0
    itl_ms: float = 50.0
    # The simulator's tick: 1 ms (its default) spreads streams admitted at different times over
    # itl/tick phases; = itl_ms is a strict step loop, every running stream's token at one step, as
    # a GPU engine's continuous batching emits them.
    sim_tick_ms: float = 1.0
    max_num_seqs: int = 1100
    worker_max_concurrency: int = 1100
    worker_heartbeat_s: float = 1.0
    queue_timeout_s: float = 60.0
    sample_interval_s: float = 0.5
    settle_s: float = 1.0
    client_timeout_s: float = 300.0
    ramp_s: float = 0.0
    min_requests: int = 1
    min_per_stream: int = 1
    # Shared box: before each run wait up to quiet_wait_s for other processes to use < quiet_cores.
    quiet_wait_s: float = 60.0
    quiet_cores: float = 0.25
    out_dir: Path = Path("results")
    keep_raw: bool = False
    quick: bool = False
    # "relay": gateway (static key, embedded router), worker, simulator. "full": the default stack
    # a user runs: the gateway with budget auth and the router service, budget, router, accounting.
    stack: str = "relay"
    # "gpu-like" and "capacity": the data-plane issue's latency and per-core targets
    workload: str = "default"
    # Scale-out: processes of the gateway (on one port, SO_REUSEPORT) and of the worker (per engine).
    gateway_processes: int = 1
    router: str = "service"  # the full stack's gateway router mode (service or shared)
    # --setting: LLMLAB_* variables set for every service process of the stack (not the simulator)
    settings: dict[str, str] = field(default_factory=dict)
    worker_processes: int = 1
    nats_url: str = os.environ.get("LLMLAB_NATS_URL", "nats://127.0.0.1:4222")
    dirty: bool = False  # --dirty: measure a modified tree (the result says so)
    profile: bool = True  # one py-spy-profiled stack run per level after the measured ones
    # py-spy's rate: a short run of a light process (one stream, a few requests) holds the GIL for a few ms in
    # all, under one sample at 100 Hz on a fast host
    profile_hz: int = 100
    render: Path | None = None  # --render: only rewrite the reports of this saved run

    @property
    def name(self) -> str:
        """results/<name>/<UTC ts>/"""
        return WORKLOAD_NAMES[self.workload]


def rerender(path: Path) -> dict[str, Path]:
    """Re-derive targets and analysis of a saved run with this code and rewrite its reports."""
    doc = json.loads(path.read_text())
    comps = doc["summary"]["levels"]
    hb = float((doc["metadata"].get("worker") or {}).get("heartbeat_interval_s", 1.0))
    cores = metadata_cores(doc["metadata"]) or (psutil.cpu_count() or 2)
    doc["summary"]["targets"] = targets_for(str(doc["metadata"].get("workload", "default")), comps)
    doc["summary"]["analysis"] = analyse(comps, cores, hb)
    path.write_text(json.dumps(doc, indent=1))
    md, png = path.with_suffix(".md"), path.with_suffix(".png")
    md.write_text(render_markdown(doc))
    render_plot(doc, png)
    return {"json": path, "md": md, "png": png}  # rewritten in place: the latest pointer still holds


def parse_args(argv: Sequence[str] | None = None) -> BenchConfig:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--levels", help="comma-separated concurrency levels (default 1,100,1000; --quick 1,100)")
    p.add_argument("--repeats", type=int, help="measured runs per mode and level (default 2; --quick 1)")
    p.add_argument("--tokens", type=int, help="max_tokens = simulator --output-len (default 256; --quick 64)")
    p.add_argument("--warmup-tokens", type=int, help="tokens per request of the warm-up runs (default 32)")
    p.add_argument("--quick", action="store_true", help="levels 1,100; 1 repeat; 64 tokens (about a minute)")
    p.add_argument("--ttft-ms", type=float, help="simulator TTFT (default 100; gpu-like and capacity 50)")
    p.add_argument("--itl-ms", type=float, help="simulator ITL (default 50; gpu-like 20; capacity 1)")
    p.add_argument(
        "--sim-tick-ms",
        type=float,
        default=1.0,
        help="simulator tick (default 1 ms: streams started apart get their tokens at different moments); "
        "set it to the ITL for a strict step loop, every stream's token at one engine step as on a GPU",
    )
    p.add_argument(
        "--workload",
        choices=tuple(WORKLOAD_NAMES),
        default="default",
        help="gpu-like: TTFT 50 ms, ITL 20 ms (50 tokens/s per stream, as a GPU serves an 8B model), 64 tokens, "
        "the full stack, levels 1 and 100, 20 requests per run at 1 stream, 10 per stream at 100, the starts spread "
        "over one request's length (a steady state); written as results/relay-gpu-<ts>. "
        "thousand: 1,000 streams all at once at ITL 100 ms (10 tokens/s each), 64 tokens, the full stack; "
        "results/relay-thousand-<ts>. capacity: the relay's "
        "tokens/s per core: ITL 1 ms (1,000 tokens/s per stream), 512 tokens, 50 streams, the full stack, 1,000 "
        "requests per run; written as results/relay-capacity-<ts>",
    )
    p.add_argument(
        "--stack",
        choices=("relay", "full"),
        help="relay: gateway (static key, embedded router) + worker; full: + budget auth, router service, budget, "
        "accounting (default relay; gpu-like and capacity full)",
    )
    p.add_argument(
        "--router",
        choices=("service", "shared"),
        default="service",
        help="the full stack's gateway router mode: ask the router service (default) or decide in the gateway "
        "and share the decisions (the router service still runs and follows them)",
    )
    p.add_argument(
        "--gateway-processes",
        type=int,
        default=1,
        help="gateway processes on its one port (LLMLAB_GATEWAY_PROCESSES; SO_REUSEPORT); default 1",
    )
    p.add_argument(
        "--worker-processes",
        type=int,
        default=1,
        help="worker processes in front of the one simulator (LLMLAB_WORKER_PROCESSES); default 1",
    )
    p.add_argument(
        "--setting",
        action="append",
        default=[],
        type=parse_setting,
        metavar="LLMLAB_KEY=VALUE",
        help="a setting of every service process of the stack (repeatable; recorded in the result's metadata), "
        "e.g. LLMLAB_GATEWAY_ROUTE_AHEAD_MAX_ADMITTING=0",
    )
    p.add_argument("--out-dir", type=Path, default=Path("results"))
    p.add_argument("--keep-raw", action="store_true", help="keep every run's per-request client JSON")
    p.add_argument(
        "--worker-heartbeat-s",
        type=float,
        default=1.0,
        help="worker heartbeat interval (production default 1 s; the gateway drops a worker after 3 misses)",
    )
    p.add_argument(
        "--min-requests",
        type=int,
        help="each run sends at least this many requests: streams send ceil(N / level) requests one "
        "after another (default 1: one request per stream, so level 1 has one TTFT sample per run; gpu-like 20; "
        "capacity 1000)",
    )
    p.add_argument(
        "--ramp-s",
        type=float,
        help="spread each run's stream starts over this many seconds (default 0: all at once; gpu-like: one "
        "request's length, TTFT + (tokens - 1) x ITL, so requests arrive evenly from the start: a steady state)",
    )
    p.add_argument(
        "--min-per-stream",
        type=int,
        help="each stream sends at least this many requests in a measured run (default 1; gpu-like 10)",
    )
    p.add_argument(
        "--quiet-wait",
        type=float,
        help="before each run, wait up to this long (s) for other processes on the box to go quiet "
        "(default 60; --quick 0)",
    )
    p.add_argument("--quiet-cores", type=float, default=0.25, help="'quiet' = other processes use less than this")
    p.add_argument(
        "--sample-interval-s",
        type=float,
        default=0.5,
        help="CPU sampling interval of every process (default 0.5 s); 0.05 resolves a burst's stages in the "
        "timeline panel (the kernel counts CPU in 10 ms ticks: a 50 ms sample is 0.2 cores per tick)",
    )
    p.add_argument(
        "--render",
        type=Path,
        metavar="JSON",
        help="only re-derive targets/analysis and rewrite the .md/.png (and JSON) of a saved run",
    )
    p.add_argument(
        "--dirty", action="store_true", help="measure a modified tree (refused otherwise; the result says so)"
    )
    p.add_argument("--no-profile", action="store_true", help="skip the py-spy-profiled stack run of each level")
    p.add_argument("--profile-hz", type=int, default=100, help="py-spy's sampling rate in the profiled runs")
    p.add_argument("--log-level", default="INFO")
    a = p.parse_args(argv)
    logging.basicConfig(
        level=a.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s relay_bench %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
    )
    for noisy in ("httpx", "httpcore", "matplotlib", "llmlab_common.natsio"):
        logging.getLogger(noisy).setLevel(logging.WARNING if noisy != "llmlab_common.natsio" else logging.ERROR)
    cap = a.workload == "capacity"
    gpu = a.workload == "gpu-like"
    thousand = a.workload == "thousand"
    default_levels = "50" if cap else "1000" if thousand else ("1,100" if a.quick or gpu else "1,100,1000")
    levels = [int(x) for x in (a.levels or default_levels).split(",") if x.strip()]
    if not levels or min(levels) < 1:
        p.error("--levels needs positive integers")
    repeats = a.repeats if a.repeats is not None else (1 if a.quick else 2)
    tokens = a.tokens if a.tokens is not None else (512 if cap else 64 if a.quick or gpu or thousand else 256)
    ttft_ms = a.ttft_ms if a.ttft_ms is not None else (50.0 if gpu or cap or thousand else 100.0)
    itl_ms = a.itl_ms if a.itl_ms is not None else (1.0 if cap else 20.0 if gpu else 100.0 if thousand else 50.0)
    min_requests = a.min_requests if a.min_requests is not None else (1000 if cap else 20 if gpu else 1)
    min_per_stream = a.min_per_stream if a.min_per_stream is not None else (10 if gpu else 1)
    # gpu-like is the steady state of its streams (the issue names "all at once" for the 1,000 streams only):
    # starts spread over one request's length, so the run never sees the 100 arrivals of one instant
    ramp_s = a.ramp_s if a.ramp_s is not None else ((ttft_ms + (tokens - 1) * itl_ms) / 1000.0 if gpu else 0.0)
    warmup_tokens = a.warmup_tokens if a.warmup_tokens is not None else min(32 if not a.quick else 16, tokens)
    if repeats < 1 or tokens < 2 or warmup_tokens < 1:
        p.error("--repeats >= 1, --tokens >= 2 and --warmup-tokens >= 1")
    if a.gateway_processes < 1 or a.worker_processes < 1:
        p.error("--gateway-processes and --worker-processes need at least 1")
    if not 0.01 <= a.sample_interval_s <= 5.0:
        p.error("--sample-interval-s must be between 0.01 and 5")
    seqs = max(1100, max(levels))
    return BenchConfig(
        render=a.render,
        levels=levels,
        repeats=repeats,
        tokens=tokens,
        warmup_tokens=warmup_tokens,
        ttft_ms=ttft_ms,
        itl_ms=itl_ms,
        sim_tick_ms=a.sim_tick_ms,
        max_num_seqs=seqs,
        worker_max_concurrency=seqs,
        out_dir=a.out_dir,
        keep_raw=a.keep_raw,
        quick=a.quick,
        ramp_s=ramp_s,
        min_requests=max(1, min_requests),
        min_per_stream=max(1, min_per_stream),
        quiet_wait_s=a.quiet_wait if a.quiet_wait is not None else (0.0 if a.quick else 60.0),
        quiet_cores=a.quiet_cores,
        sample_interval_s=a.sample_interval_s,
        worker_heartbeat_s=a.worker_heartbeat_s,
        stack=a.stack or ("full" if gpu or cap or thousand else "relay"),
        dirty=a.dirty,
        profile=not a.no_profile,
        profile_hz=a.profile_hz,
        workload=a.workload,
        gateway_processes=a.gateway_processes,
        worker_processes=a.worker_processes,
        router=a.router,
        settings=dict(a.setting),
    )


# ---------------------------------------------------------------------------------------------
# Process sampling
# ---------------------------------------------------------------------------------------------
def _cpu(p: psutil.Process) -> float:
    """CPU seconds of a process and its live children (a service run with processes > 1 starts
    its copies as children: they count as that service)."""
    t = p.cpu_times()
    total = float(t.user + t.system)
    for child in p.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            ct = child.cpu_times()
            total += ct.user + ct.system
    return total


def _system_busy() -> tuple[float, float]:
    """(busy CPU seconds of the whole machine, all CPU seconds) since boot."""
    t = psutil.cpu_times()
    idle = t.idle + getattr(t, "iowait", 0.0)
    total = sum(t)
    return total - idle, total


@dataclass
class ProcStats:
    cpu_s: float = 0.0
    cpu_util_mean: float = 0.0  # cores, over the sampled window
    cpu_util_peak: float = 0.0  # highest single sample interval
    rss_peak_mb: float = 0.0
    samples: list[float] = field(default_factory=list)  # cores per interval

    def to_json(self) -> dict[str, Any]:
        return {
            "cpu_s": round(self.cpu_s, 3),
            "cpu_util_mean": round(self.cpu_util_mean, 3),
            "cpu_util_peak": round(self.cpu_util_peak, 3),
            "rss_peak_mb": round(self.rss_peak_mb, 1),
            "samples": [round(x, 3) for x in self.samples],
        }


class Sampler:
    """CPU seconds and RSS of named processes between ``start`` and ``stop``, sampled on ``tick``."""

    def __init__(self, procs: dict[str, psutil.Process]) -> None:
        self.procs = dict(procs)
        self.stats: dict[str, ProcStats] = {}
        self._last: dict[str, float] = {}
        self._first: dict[str, float] = {}
        self._t_last = 0.0
        self.t0 = 0.0
        self._sys0 = (0.0, 0.0)
        self.system: dict[str, float] = {}
        self.times: list[float] = []  # each tick's end, seconds after start (the samples' x axis)
        self.startup_heavy = {"client"}  # processes whose first sample is their start-up, not the load

    def add(self, name: str, proc: psutil.Process) -> None:
        self.procs[name] = proc
        with contextlib.suppress(psutil.Error):
            c = _cpu(proc)
            self._first[name] = self._last[name] = c
            self.stats.setdefault(name, ProcStats())

    def start(self) -> None:
        self.t0 = self._t_last = time.monotonic()
        self._sys0 = _system_busy()
        for name, p in self.procs.items():
            self.stats[name] = ProcStats()
            with contextlib.suppress(psutil.Error):
                self._first[name] = self._last[name] = _cpu(p)
                self.stats[name].rss_peak_mb = p.memory_info().rss / 2**20

    def tick(self) -> None:
        now = time.monotonic()
        dt_s = max(1e-6, now - self._t_last)
        self._t_last = now
        self.times.append(now - self.t0)
        for name, p in self.procs.items():
            st = self.stats.setdefault(name, ProcStats())
            try:
                c = _cpu(p)
                rss = p.memory_info().rss / 2**20
            except psutil.Error:
                continue  # exited (the client at the end of its run)
            if name not in self._first:
                self._first[name] = self._last[name] = c
            util = (c - self._last[name]) / dt_s
            self._last[name] = c
            st.samples.append(util)
            if not (name in self.startup_heavy and len(st.samples) == 1):  # interpreter start-up, imports
                st.cpu_util_peak = max(st.cpu_util_peak, util)
            st.rss_peak_mb = max(st.rss_peak_mb, rss)
            st.cpu_s = c - self._first[name]

    def stop(self) -> float:
        self.tick()
        wall = max(1e-6, time.monotonic() - self.t0)
        for st in self.stats.values():
            st.cpu_util_mean = st.cpu_s / wall
        busy1, total1 = _system_busy()
        ncpu = psutil.cpu_count() or 1
        busy = busy1 - self._sys0[0]
        self.system = {
            "wall_s": round(wall, 3),
            "busy_cpu_s": round(busy, 3),
            "busy_cores_mean": round(busy / wall, 3),
            "cores": ncpu,
            "util_of_machine": round((busy1 - self._sys0[0]) / max(1e-6, total1 - self._sys0[1]), 3),
        }
        return wall


def other_load(ours: Sequence[psutil.Process], seconds: float) -> float:
    """Cores used over ``seconds`` by every process except ``ours`` (and this one)."""
    mine = [*ours, psutil.Process()]

    def snap() -> tuple[float, float]:
        cpu = 0.0
        for p in mine:
            with contextlib.suppress(psutil.Error):
                cpu += _cpu(p)
        return _system_busy()[0], cpu

    t0, (b0, c0) = time.monotonic(), snap()
    time.sleep(seconds)
    b1, c1 = snap()
    return max(0.0, (b1 - b0) - (c1 - c0)) / max(1e-6, time.monotonic() - t0)


def url_port(server_url: str, default_port: int) -> int:
    """The port of ``nats://host:4222``, ``redis://host:6379/0`` (``default_port`` when it names none)."""
    hostport = server_url.split("//", 1)[-1].split("/", 1)[0].rsplit("@", 1)[-1]
    return int(hostport.rsplit(":", 1)[-1]) if ":" in hostport else default_port


def find_server(program: str, server_url: str, default_port: int) -> psutil.Process | None:
    """The ``program`` process (nats-server, redis-server) that listens on ``server_url``'s port
    (several may run on a shared box)."""
    port = url_port(server_url, default_port)
    candidates = []
    for p in psutil.process_iter(["name", "cmdline"]):
        if program not in (p.info.get("name") or "") and not any(
            program in part for part in (p.info.get("cmdline") or [])[:1]
        ):
            continue
        candidates.append(p)
        with contextlib.suppress(psutil.Error):
            for c in p.net_connections(kind="tcp"):
                if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port:
                    return p
    for p in candidates:
        cmd = " ".join(p.info.get("cmdline") or [])
        if f"-p {port}" in cmd or f"--port {port}" in cmd or f":{port}" in cmd:
            return p
    return candidates[0] if len(candidates) == 1 else None


def find_nats_server(nats_url: str) -> psutil.Process | None:
    return find_server("nats-server", nats_url, 4222)


class Monitor:
    """Liveness evidence, in a background thread with its own event loop: when each worker
    heartbeat arrives on NATS (the gateway declares a worker lost after 3 missed intervals), and
    how long each service takes to answer ``GET /health`` (a direct read of its event-loop lag)."""

    def __init__(self, nats_url: str, namespace: str, health_urls: dict[str, str], every_s: float = 0.5) -> None:
        self.nats_url = nats_url
        self.namespace = namespace
        self.health_urls = health_urls
        self.every_s = every_s
        self.heartbeats: list[tuple[float, int]] = []  # (monotonic arrival, worker in_flight)
        self.health: list[tuple[float, str, float]] = []  # (monotonic sent, service, ms; inf = failed)
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._thread_main, name="relay-bench-monitor", daemon=True)
        self.error: str | None = None

    def start(self) -> None:
        self._thread.start()
        self._ready.wait(10)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)

    def _thread_main(self) -> None:
        try:
            asyncio.run(self._main())
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"
            log.warning("liveness monitor stopped: %s", self.error)
        finally:
            self._ready.set()

    async def _main(self) -> None:
        from llmlab_common.natsio import connect
        from llmlab_common.subjects import Topology

        nc = await connect(self.nats_url, "relay-bench-monitor")

        async def on_heartbeat(msg: Any) -> None:
            in_flight = -1
            with contextlib.suppress(ValueError, TypeError, AttributeError):
                in_flight = int(json.loads(msg.data).get("in_flight", -1))
            self.heartbeats.append((time.monotonic(), in_flight))

        await nc.subscribe(Topology(self.namespace).heartbeat_wildcard, cb=on_heartbeat)
        self._ready.set()
        try:
            async with httpx.AsyncClient() as h:
                while not self._stop.is_set():
                    await asyncio.gather(*(self._probe(h, n, u) for n, u in self.health_urls.items()))
                    await asyncio.sleep(self.every_s)
        finally:
            with contextlib.suppress(Exception):
                await nc.close()

    async def _probe(self, h: httpx.AsyncClient, name: str, base: str) -> None:
        t = time.monotonic()
        try:
            await h.get(base + "/health", timeout=15)
            self.health.append((t, name, (time.monotonic() - t) * 1000.0))
        except httpx.HTTPError:
            self.health.append((t, name, float("inf")))

    def window(self, t0: float, t1: float) -> dict[str, Any]:
        """Heartbeat gaps and /health latency between monotonic t0 and t1."""
        beats = [t for t, _ in self.heartbeats if t <= t1]
        before = [t for t in beats if t < t0]
        inside = [t for t in beats if t >= t0]
        points = ([before[-1]] if before else [t0]) + inside + [t1]
        gaps = [b - a for a, b in itertools.pairwise(points)]
        out: dict[str, Any] = {"heartbeats": len(inside), "heartbeat_gap_max_s": round(max(gaps), 3) if gaps else None}
        for name in self.health_urls:
            lat = [ms for t, n, ms in self.health if n == name and t0 <= t <= t1]
            finite = [x for x in lat if x != float("inf")]
            out[f"{name}_health_ms_max"] = round(max(finite), 1) if finite else None
            out[f"{name}_health_ms_p50"] = _r(percentile(finite, 50), 1) if finite else None
            out[f"{name}_health_failed"] = len(lat) - len(finite)
        return out


# ---------------------------------------------------------------------------------------------
# Runs
# ---------------------------------------------------------------------------------------------
@dataclass
class Run:
    level: int
    mode: str
    repeat: int  # 0 = warm-up
    tokens: int
    requests_per_stream: int = 1
    started_at: str = ""
    wall_s: float = 0.0
    client_rc: int | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    processes: dict[str, dict[str, Any]] = field(default_factory=dict)
    system: dict[str, Any] = field(default_factory=dict)
    log_warnings: dict[str, list[str]] = field(default_factory=dict)
    liveness: dict[str, Any] = field(default_factory=dict)
    breakdown: dict[str, float | None] = field(default_factory=dict)
    engine_tokens: int | None = None  # tokens the simulator generated during the run (its /sim/stats)
    error: str | None = None
    raw_path: str | None = None
    profiled: bool = False  # the py-spy run after the measured ones: not in the figures
    # Stack runs, from the services' metrics over the run: the worker's NATS queue wait histogram
    # (cumulative (le, count) buckets), the router service's timeouts/fallbacks seen by the
    # gateway, and the gateway's answers by HTTP status.
    queue_buckets: list[tuple[float, float]] = field(default_factory=list)
    loop_lag_buckets: list[tuple[float, float]] = field(default_factory=list)  # the worker's event loop
    router_fallbacks: dict[str, float] = field(default_factory=dict)
    statuses: dict[str, float] = field(default_factory=dict)
    # seconds in garbage collections over the run, per service, by generation ("0", "1", "2")
    gc_pause_s: dict[str, dict[str, float]] = field(default_factory=dict)
    sample_times_s: list[float] = field(default_factory=list)  # when each CPU sample of ``processes`` ended

    @property
    def warmup(self) -> bool:
        return self.repeat == 0

    def metric(self, name: str) -> float | None:
        s = self.summary
        try:
            value = {
                "ttft_p50_ms": lambda: s["ttft_ms"]["p50"],
                "ttft_p99_ms": lambda: s["ttft_ms"]["p99"],
                "itl_p99_ms": lambda: s["itl_ms"]["p99"],
                "tpot_p50_ms": lambda: s["tpot_ms"]["p50"],
                "e2e_p50_ms": lambda: s["e2e_ms"]["p50"],
                "tokens_per_s": lambda: s["output_tokens_per_s"],
                "tokens_per_chunk": lambda: s["tokens_per_chunk"],
                "ok": lambda: s["requests"]["ok"],
                "failed": lambda: s["requests"]["failed"],
            }[name]()
        except (KeyError, TypeError):
            return None
        return None if value is None else float(value)

    def to_json(self) -> dict[str, Any]:
        return {
            "level": self.level,
            "mode": self.mode,
            "repeat": self.repeat,
            "warmup": self.warmup,
            "tokens": self.tokens,
            "requests_per_stream": self.requests_per_stream,
            "started_at": self.started_at,
            "wall_s": round(self.wall_s, 3),
            "client_rc": self.client_rc,
            "error": self.error,
            "ttft_p50_ms": self.metric("ttft_p50_ms"),
            "ttft_p99_ms": self.metric("ttft_p99_ms"),
            "itl_p99_ms": self.metric("itl_p99_ms"),
            "tokens_per_s": self.metric("tokens_per_s"),
            "requests_ok": self.metric("ok"),
            "requests_failed": self.metric("failed"),
            "processes": self.processes,
            "system": self.system,
            "client_summary": self.summary,
            "engine_tokens": self.engine_tokens,
            "liveness": self.liveness,
            "ttft_breakdown_ms": self.breakdown,
            "log_warnings": self.log_warnings,
            "raw_path": self.raw_path,
            "profiled": self.profiled,
            "queue_buckets": [[le if le != float("inf") else "+Inf", n] for le, n in self.queue_buckets],
            "loop_lag_buckets": [[le if le != float("inf") else "+Inf", n] for le, n in self.loop_lag_buckets],
            "router_fallbacks": self.router_fallbacks,
            "gateway_statuses": self.statuses,
            "gc_pause_s": self.gc_pause_s,
            "sample_times_s": [round(t, 3) for t in self.sample_times_s],
        }


# Histograms the services export, whose means split the stack's TTFT into its legs.
BREAKDOWN_METRICS = {
    "gateway": {
        "gateway_accept_to_first_token_ms": "llmlab_gateway_ttft_seconds",
        # admission's legs, before the dispatch: the budget round trip, then the routing decision
        "admission_auth_reserve_ms": 'llmlab_gateway_admission_seconds{step="auth_reserve"}',
        "admission_route_ms": 'llmlab_gateway_admission_seconds{step="route"}',
    },
    "worker": {
        "nats_queue_ms": "llmlab_worker_nats_queue_seconds",
        # nats_queue's legs: stored in JetStream -> the worker's handler; the handler -> the attempt running
        "jetstream_wait_ms": "llmlab_worker_jetstream_wait_seconds",
        "worker_intake_ms": "llmlab_worker_intake_seconds",
        "engine_ttft_seen_by_worker_ms": "llmlab_worker_ttft_seconds",
    },
}


def wait_sim_idle(base: str, timeout: float = 60.0) -> bool:
    """Until the simulator at ``base`` runs nothing (a run's aborts and finishes have landed);
    False when it is still busy after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            s = httpx.get(base + "/sim/stats", timeout=2).json()
            if not (s.get("running") or s.get("waiting") or s.get("pending")):
                return True
        time.sleep(0.2)
    return False


def ttft_legs_line(level: int, b: Mapping[str, float | None]) -> str:
    """The stack's mean TTFT split into its legs. What the histograms do not cover is named as the
    remainder: the gateway's parsing and building of the request, and the first token's way back
    from the worker to the gateway (its NATS publish and the gateway's dispatch)."""

    def v(key: str) -> float:
        return b.get(key) or 0.0

    accept = v("gateway_accept_to_first_token_ms")
    legs = ("admission_auth_reserve_ms", "admission_route_ms", "nats_queue_ms", "engine_ttft_seen_by_worker_ms")
    measured = sum(v(k) for k in legs)
    return (
        f"{level} streams, stack TTFT legs (means, ms): client {v('client_ttft_mean_ms'):.0f} (direct "
        f"{v('direct_client_ttft_mean_ms'):.0f}) = HTTP into the gateway and back out "
        f"{v('client_ttft_mean_ms') - accept:.0f} + gateway accepted -> first token {accept:.0f}, of which "
        f"authentication and budget reserve {v('admission_auth_reserve_ms'):.0f}, the routing decision "
        f"{v('admission_route_ms'):.0f}, waiting in NATS (dispatch -> worker takes it) {v('nats_queue_ms'):.0f} "
        f"(of it: stored in JetStream -> the worker's handler {v('jetstream_wait_ms'):.0f}, the handler -> the "
        f"attempt running {v('worker_intake_ms'):.0f}; the rest is the gateway's publish), the engine call to its "
        f"first token {v('engine_ttft_seen_by_worker_ms'):.0f}, and not covered by those {accept - measured:.0f} "
        "(parsing, building the request, the first token's way back to the gateway)."
    )


def histogram_sums(scraped: promscrape.Scrape, names: Mapping[str, str]) -> dict[str, tuple[float, float]]:
    """Each selector's histogram ``_sum`` and ``_count`` in one scrape (``name{label="value"}`` reads that series)."""
    return {m: promscrape.sum_count(scraped, *promscrape.selector(m)) for m in names.values()}


def histogram_means_ms(
    before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]], names: dict[str, str]
) -> dict[str, float | None]:
    """Mean (ms) of each histogram over the observations made between two scrapes."""
    out: dict[str, float | None] = {}
    for label, metric in names.items():
        s0, c0 = before.get(metric, (0.0, 0.0))
        s1, c1 = after.get(metric, (0.0, 0.0))
        out[label] = round((s1 - s0) / (c1 - c0) * 1000.0, 2) if c1 > c0 else None
    return out


def _is_warning(line: str) -> bool:
    """A service log line at WARNING or above (JSON logs: ``"level": "warning"``; or plain text)."""
    low = line.lower()
    return (
        any(f'"level": "{lv}"' in low or f'"level":"{lv}"' in low for lv in ("warning", "error", "critical"))
        or "traceback" in low
        or " warning " in low
        or " error " in low
    )


class BenchStack(Stack):
    """The testkit's Stack with the services' logs at WARNING (INFO per request costs CPU)."""

    def base_env(self) -> dict[str, str]:
        return {**super().base_env(), "LLMLAB_LOG_LEVEL": "WARNING"}


class Bench:
    def __init__(self, cfg: BenchConfig) -> None:
        self.cfg = cfg
        self.stack = BenchStack(namespace=unique_namespace(), nats_url=cfg.nats_url)
        self.sim: ManagedProcess | None = None
        self.worker: ManagedProcess | None = None
        self.gateway: ManagedProcess | None = None
        self.services: dict[str, psutil.Process] = {}
        self.client: subprocess.Popen[bytes] | None = None
        self.runs: list[Run] = []
        self.tmp = Path(tempfile.mkdtemp(prefix="relay-bench-"))
        self.t_start = time.monotonic()
        self._log_offsets: dict[str, int] = {}
        self.prompt_tokens: set[int] = set()
        self.api_key = API_KEY
        self.other_before = 0.0
        self.monitor: Monitor | None = None
        # The code under test is what is checked out when the services start (others may commit meanwhile).
        self.git_commit = git("rev-parse", "HEAD") or "unknown"
        self.git_dirty_files = dirty_files()

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        c = self.cfg
        log.info("namespace %s; starting simulator, worker, gateway", self.stack.namespace)
        self.sim = self.stack.sim(
            "vllm",
            MODEL,
            ttft_ms=c.ttft_ms,
            itl_ms=c.itl_ms,
            max_num_seqs=c.max_num_seqs,
            output_len=c.tokens,
            extra=["--tick-ms", f"{c.sim_tick_ms:g}"],
        )
        self.worker = self.stack.worker(
            "vllm",
            POOL,
            url(self.sim),
            max_concurrency=c.worker_max_concurrency,
            heartbeat_s=c.worker_heartbeat_s,
            env={"LLMLAB_WORKER_PROCESSES": str(c.worker_processes), **c.settings},
        )
        gw_env = {"LLMLAB_GATEWAY_PROCESSES": str(c.gateway_processes), **c.settings}
        extra: dict[str, ManagedProcess] = {}
        if c.stack == "full":
            # As a user runs it: every request authenticated and reserved by the budget service,
            # routed by the router service, accounted; the gateway's own queue timeout.
            extra = {"budget": self.stack.budget(env=c.settings), "router": self.stack.router(env=c.settings)}
            extra["accounting"] = self.stack.accounting(env=c.settings)
            admin = BudgetAdmin(url(extra["budget"]))
            limits = ("daily_tokens", "monthly_tokens", "rpm", "tpm", "max_concurrent")
            unlimited = dict.fromkeys(limits, "unlimited")
            scopes = {"key": unlimited, "user": unlimited, "team": unlimited}
            self.api_key = admin.provision("enterprise", scopes).api_key
            admin.close()
            self.gateway = self.stack.gateway(auth="budget", router=c.router, env=gw_env)
        else:
            self.gateway = self.stack.gateway(queue_timeout_s=c.queue_timeout_s, env=gw_env)
        self._wait_gateway_sees_worker()
        self.services = {
            "simulator": psutil.Process(self.sim.pid),
            "worker": psutil.Process(self.worker.pid),
            "gateway": psutil.Process(self.gateway.pid),
            **{name: psutil.Process(p.pid) for name, p in extra.items()},
        }
        nats = find_nats_server(c.nats_url)
        if nats is None:
            log.warning("nats-server process not found (remote or not visible): its CPU is not measured")
        else:
            self.services["nats-server"] = nats
        if c.stack == "full":  # the budget's store: its Lua scripts' CPU is the reservations' too
            redis = find_server("redis-server", self.stack.redis_url, 6379)
            if redis is None:
                log.warning("redis-server process not found (remote or not visible): its CPU is not measured")
            else:
                self.services["redis"] = redis
        log.info(
            "stack up: sim %s, worker %s, gateway %s, nats-server pid %s",
            url(self.sim),
            url(self.worker),
            url(self.gateway),
            nats.pid if nats else "n/a",
        )
        self.monitor = Monitor(
            c.nats_url,
            self.stack.namespace,
            {"worker": url(self.worker), "gateway": url(self.gateway), "simulator": url(self.sim)},
        )
        self.monitor.start()

    def _wait_gateway_sees_worker(self, timeout: float = 15.0) -> None:
        assert self.gateway is not None
        deadline = time.monotonic() + timeout
        # Each scrape reaches one gateway process (SO_REUSEPORT): ask until several in a row see every worker.
        needed, seen = 3 * self.cfg.gateway_processes, 0
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                text = httpx.get(url(self.gateway) + "/metrics", timeout=2, headers={"Connection": "close"}).text
                ok = any(
                    line.startswith("llmlab_gateway_live_workers{")
                    and f'pool="{POOL}"' in line
                    and float(line.rsplit(" ", 1)[-1]) >= self.cfg.worker_processes
                    for line in text.splitlines()
                )
                seen = seen + 1 if ok else 0
                if seen >= needed:
                    return
            time.sleep(0.2)
        raise TimeoutError("the gateway never saw the worker's heartbeat")

    def close(self) -> None:
        if self.monitor is not None:
            self.monitor.stop()
        if self.client is not None and self.client.poll() is None:
            self.client.kill()
            self.client.wait(10)
        failed = [p for p in self.stack.procs if p.crashed()]  # exited while nobody stopped it
        for p in failed:
            log.error("%s exited %s; log tail:\n%s", p.name, p.proc.returncode if p.proc else "?", p.tail())
        self.stack.close()  # processes, then the namespace's streams and Redis keys (a failure is logged)
        log.info("namespace %s closed", self.stack.namespace)
        if not self.cfg.keep_raw:
            shutil.rmtree(self.tmp, ignore_errors=True)

    # -- one run ---------------------------------------------------------------------------------
    def target_url(self, mode: str) -> str:
        assert self.sim is not None and self.gateway is not None
        return (url(self.sim) if mode == "direct" else url(self.gateway)) + "/v1/chat/completions"

    def wait_quiet(self) -> float:
        """On a shared box, wait (up to ``quiet_wait_s``) until processes other than ours use less
        than ``quiet_cores`` cores; returns the other load last seen (cores)."""
        c = self.cfg
        if c.quiet_wait_s <= 0:
            return other_load(list(self.services.values()), 0.3)
        deadline = time.monotonic() + c.quiet_wait_s
        waited = False
        while True:
            other = other_load(list(self.services.values()), 1.0)
            if other < c.quiet_cores or time.monotonic() >= deadline:
                break
            if not waited:
                log.info(
                    "other processes use %.2f cores; waiting up to %.0fs for the box to quiet down",
                    other,
                    c.quiet_wait_s,
                )
                waited = True
        if other >= c.quiet_cores and c.quiet_wait_s > 0:
            log.warning("the box is still busy (other processes use %.2f cores): this run's figures are noisy", other)
        return other

    def wait_idle(self, timeout: float = 60.0) -> None:
        """Until the simulator runs nothing (the previous run's aborts/finishes have landed)."""
        assert self.sim is not None
        if not wait_sim_idle(url(self.sim), timeout):
            log.warning("simulator still busy after %.0fs; starting the next run anyway", timeout)
        time.sleep(self.cfg.settle_s)
        self.other_before = self.wait_quiet()

    def run_once(self, level: int, mode: str, repeat: int, profile_dir: Path | None = None) -> Run:
        """One run; with ``profile_dir`` py-spy records the gateway and the worker meanwhile (the
        run is marked profiled and left out of the figures)."""
        c = self.cfg
        tokens = c.warmup_tokens if repeat == 0 else c.tokens
        per_stream = 1 if repeat == 0 else max(c.min_per_stream, -(-c.min_requests // level))  # ceil
        run = Run(level=level, mode=mode, repeat=repeat, tokens=tokens, requests_per_stream=per_stream)
        run.profiled = profile_dir is not None
        self.wait_idle()
        out = self.tmp / f"run-{level}-{mode}-{repeat}.json"
        cmd = [
            sys.executable,
            "-m",
            "llmlab_loadtest.sse_client",
            "--url",
            self.target_url(mode),
            "--model",
            MODEL,
            "--api-key",
            self.api_key,
            "--concurrency",
            str(level),
            "--requests-per-stream",
            str(per_stream),
            "--max-tokens",
            str(tokens),
            "--timeout",
            str(c.client_timeout_s),
            "--read-timeout",
            "90",
            "--out",
            str(out),
            "--log-level",
            "WARNING",
            "--label",
            f"{mode}-{level}-{repeat}",
            "--ramp",
            str(c.ramp_s),
        ]
        if not c.keep_raw:
            cmd.append("--summary-only")
        what = "profiled" if run.profiled else "warm-up" if repeat == 0 else f"repeat {repeat}/{c.repeats}"
        log.info(
            "level %d, %s, %s: %d streams x %d request(s) x %d tokens (bench elapsed %.0fs)",
            level,
            mode,
            what,
            level,
            per_stream,
            tokens,
            time.monotonic() - self.t_start,
        )
        log_marks = self._log_marks()
        assert self.gateway is not None and self.worker is not None
        # One scrape of each service before and after: the TTFT legs, queue wait, router
        # fallbacks and answers by status all come from them.
        scraped = (
            {"gateway": promscrape.scrape(url(self.gateway)), "worker": promscrape.scrape(url(self.worker))}
            if mode == "stack"
            else {}
        )
        generated0 = self._sim_generated()
        sampler = Sampler(self.services)
        sampler.start()
        run.started_at = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        self.client = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        with contextlib.suppress(psutil.Error):
            sampler.add("client", psutil.Process(self.client.pid))
        spies = (
            [
                py_spy(self.services[n].pid, profile_dir / f"{n}-{level}.txt", rate_hz=c.profile_hz)
                for n in ("gateway", "worker")
            ]
            if profile_dir is not None
            else []
        )
        deadline = time.monotonic() + c.client_timeout_s + 60
        next_report = time.monotonic() + 5.0
        while self.client.poll() is None:
            time.sleep(c.sample_interval_s)
            sampler.tick()
            now = time.monotonic()
            if now >= next_report:
                next_report = now + 5.0
                util = ", ".join(f"{n} {st.samples[-1]:.2f}" for n, st in sampler.stats.items() if st.samples)
                log.info("  level %d %s %s: %.0fs elapsed; cores now: %s", level, mode, what, now - sampler.t0, util)
            if now > deadline:
                log.error("client overran its own timeouts; killing it")
                self.client.kill()
        run.wall_s = sampler.stop()
        for spy in spies:  # py-spy writes its profile when interrupted
            spy.send_signal(signal.SIGINT)
            try:
                spy.wait(30)
            except subprocess.TimeoutExpired:
                spy.kill()
        if self.monitor is not None:
            run.liveness = self.monitor.window(sampler.t0, time.monotonic())
        run.client_rc = self.client.returncode
        stderr = (self.client.stderr.read() if self.client.stderr else b"").decode(errors="replace")
        self.client = None
        run.system = sampler.system
        run.processes = {n: st.to_json() for n, st in sampler.stats.items()}
        run.sample_times_s = sampler.times
        if out.exists():
            data = json.loads(out.read_text())
            run.summary = data["summary"]
            if c.keep_raw:
                run.raw_path = str(out)
            client = run.summary.get("client") or {}
            if "client" in run.processes and client.get("cpu_total_s") is not None:
                # The client reports its own CPU (getrusage): exact, where sampling misses its last moments.
                run.processes["client"]["cpu_s_self_reported"] = client["cpu_total_s"]
                run.processes["client"]["cpu_util_window"] = client.get("cpu_util")
                run.processes["client"]["rss_peak_mb"] = max(
                    run.processes["client"]["rss_peak_mb"], client.get("max_rss_mb") or 0.0
                )
            prompt = run.summary.get("prompt_tokens") or {}
            self.prompt_tokens.update(int(v) for v in prompt.values() if v is not None)
        else:
            run.error = f"client wrote no results (rc {run.client_rc}): {stderr[-1500:]}"
            log.error("%s", run.error)
        ours = sum((st.get("cpu_s_self_reported") or st["cpu_s"]) for st in run.processes.values())
        run.system["ours_cpu_s"] = round(ours, 3)
        run.system["other_cpu_s"] = round(max(0.0, run.system["busy_cpu_s"] - ours), 3)
        run.system["other_cores_before_run"] = round(self.other_before, 3)
        run.log_warnings = self._log_news(log_marks)
        generated1 = self._sim_generated()
        if generated0 is not None and generated1 is not None:
            run.engine_tokens = generated1 - generated0
        if mode == "stack":
            after = {"gateway": promscrape.scrape(url(self.gateway)), "worker": promscrape.scrape(url(self.worker))}
            for svc, names in BREAKDOWN_METRICS.items():
                run.breakdown.update(
                    histogram_means_ms(histogram_sums(scraped[svc], names), histogram_sums(after[svc], names), names)
                )
            gd = promscrape.delta(scraped["gateway"], after["gateway"])
            wd = promscrape.delta(scraped["worker"], after["worker"])
            run.queue_buckets = promscrape.buckets(wd, "llmlab_worker_nats_queue_seconds")
            run.loop_lag_buckets = promscrape.buckets(wd, "llmlab_worker_event_loop_lag_seconds")
            run.gc_pause_s = {
                svc: promscrape.by_label(d, "llmlab_process_gc_pause_seconds_sum", "generation")
                for svc, d in (("gateway", gd), ("worker", wd))
            }
            run.router_fallbacks = {
                k: n for k, n in promscrape.by_label(gd, "llmlab_gateway_router_fallbacks_total", "why").items() if n
            }
            run.statuses = {
                k: n for k, n in promscrape.by_label(gd, "llmlab_gateway_requests_total", "status").items() if n
            }
        self._log_run(run)
        self.runs.append(run)
        return run

    def _log_run(self, run: Run) -> None:
        s = run.summary
        if not s:
            return
        req = s["requests"]
        cpu = ", ".join(f"{n} {p['cpu_util_mean']:.2f}" for n, p in run.processes.items())
        log.info(
            "  -> ok %d/%d, TTFT p50 %s ms p99 %s ms, ITL p99 %s ms, %s tok/s; mean cores: %s; other load "
            "on the box %.2f cores",
            req["ok"],
            req["total"],
            s["ttft_ms"]["p50"],
            s["ttft_ms"]["p99"],
            s["itl_ms"]["p99"],
            s["output_tokens_per_s"],
            cpu,
            run.system.get("other_cpu_s", 0.0) / max(1e-6, run.wall_s),
        )
        if req["failed"]:
            log.warning("  -> %d failed: %s %s", req["failed"], s["errors"], s.get("error_samples"))
        for name, lines in run.log_warnings.items():
            log.warning("  -> %s logged warnings/errors, e.g. %s", name, lines[0])

    def _sim_generated(self) -> int | None:
        assert self.sim is not None
        try:
            return int(httpx.get(url(self.sim) + "/sim/stats", timeout=5).json()["generation_tokens"])
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return None

    def _log_marks(self) -> dict[str, int]:
        marks = {}
        for p in self.stack.procs:
            with contextlib.suppress(OSError):
                marks[p.name] = p.log_path.stat().st_size
        return marks

    def _log_news(self, marks: dict[str, int]) -> dict[str, list[str]]:
        """Warning/error lines each service logged during the run (up to 20 each)."""
        out: dict[str, list[str]] = {}
        for p in self.stack.procs:
            try:
                with p.log_path.open("rb") as f:
                    f.seek(marks.get(p.name, 0))
                    new = f.read(4 << 20).decode(errors="replace")
            except OSError:
                continue
            lines = [ln[:400] for ln in new.splitlines() if _is_warning(ln)]
            if lines:
                out[p.name] = lines[:20] + ([f"... {len(lines) - 20} more"] if len(lines) > 20 else [])
        return out

    # -- the whole benchmark --------------------------------------------------------------------
    def run_all(self) -> None:
        for level in self.cfg.levels:
            for mode in MODES:
                self.run_once(level, mode, 0)
            for r in range(1, self.cfg.repeats + 1):
                for mode in MODES:
                    self.run_once(level, mode, r)
            if self.cfg.profile:
                self.profile_dir.mkdir(exist_ok=True)
                self.run_once(level, "stack", self.cfg.repeats + 1, profile_dir=self.profile_dir)

    @property
    def profile_dir(self) -> Path:
        return self.tmp / "profiles"


# ---------------------------------------------------------------------------------------------
# Summary, targets, analysis (pure: unit-tested)
# ---------------------------------------------------------------------------------------------
def _mean(xs: Sequence[float]) -> float | None:
    return statistics.fmean(xs) if xs else None


def _r(x: float | None, nd: int = 2) -> float | None:
    return None if x is None else round(x, nd)


def compare_level(runs: Sequence[Run], level: int) -> dict[str, Any]:
    """Stack vs direct at one level over the measured (non-warm-up) runs. Repeats pair up in
    order (direct #i with stack #i: they ran back to back); ``spread`` is max - min over pairs."""
    meas = [r for r in runs if r.level == level and not r.warmup and not r.profiled]
    direct = sorted((r for r in meas if r.mode == "direct"), key=lambda r: r.repeat)
    stack = sorted((r for r in meas if r.mode == "stack"), key=lambda r: r.repeat)
    out: dict[str, Any] = {"level": level, "repeats": min(len(direct), len(stack))}
    for mode, rs in (("direct", direct), ("stack", stack)):
        out[mode] = {}
        for m in (
            "ttft_p50_ms",
            "ttft_p99_ms",
            "itl_p99_ms",
            "tpot_p50_ms",
            "tokens_per_s",
            "tokens_per_chunk",
            "ok",
            "failed",
        ):
            vals = [v for r in rs if (v := r.metric(m)) is not None]
            out[mode][m] = {"mean": _r(_mean(vals), 3), "runs": vals}
        out[mode]["requests"] = sum(r.level * r.requests_per_stream for r in rs)
    pairs = list(zip(direct, stack, strict=False))

    def paired(metric: str, op: str) -> dict[str, Any]:
        vals: list[float] = []
        for d, s in pairs:
            dv, sv = d.metric(metric), s.metric(metric)
            if dv is None or sv is None:
                continue
            if op == "diff":
                vals.append(sv - dv)
            elif dv > 0:
                vals.append(sv / dv)
        return {
            "mean": _r(_mean(vals), 4),
            "runs": [round(v, 4) for v in vals],
            "spread": round(max(vals) - min(vals), 4) if len(vals) > 1 else None,
        }

    out["added_ttft_p50_ms"] = paired("ttft_p50_ms", "diff")
    out["added_ttft_p99_ms"] = paired("ttft_p99_ms", "diff")
    out["itl_p99_ratio"] = paired("itl_p99_ms", "ratio")
    out["tokens_per_s_ratio"] = paired("tokens_per_s", "ratio")
    out["cpu_cores_mean"] = {mode: _cpu_means([r for r in meas if r.mode == mode]) for mode in MODES}
    out["cpu_us_per_token"] = {mode: _cpu_per_token([r for r in meas if r.mode == mode]) for mode in MODES}
    out["all_ok"] = all((r.metric("failed") or 0) == 0 and r.summary for r in meas)
    out["failures"] = {mode: _failures([r for r in meas if r.mode == mode]) for mode in MODES}
    out["liveness"] = {mode: _liveness([r for r in meas if r.mode == mode]) for mode in MODES}
    legs: dict[str, float | None] = {}
    for key in (*BREAKDOWN_METRICS["worker"], *BREAKDOWN_METRICS["gateway"]):
        vals = [float(v) for r in stack if (v := r.breakdown.get(key)) is not None]
        legs[key] = _r(_mean(vals), 2)

    def ttft_mean(rs: Sequence[Run]) -> float | None:
        return _r(_mean([float(v) for r in rs if (v := (r.summary.get("ttft_ms") or {}).get("mean")) is not None]), 2)

    out["dataplane"] = dataplane_figures(stack)
    legs["client_ttft_mean_ms"] = ttft_mean(stack)
    legs["direct_client_ttft_mean_ms"] = ttft_mean(direct)
    out["ttft_breakdown_ms"] = legs
    return out


def _added_buckets(runs_buckets: Iterable[list[tuple[float, float]]]) -> list[tuple[float, float]]:
    """One histogram's cumulative buckets over several runs, added bound by bound."""
    added: dict[float, float] = {}
    for buckets in runs_buckets:
        for le, n in buckets:
            added[le] = added.get(le, 0.0) + n
    return sorted(added.items())


def dataplane_figures(stack_runs: Sequence[Run]) -> dict[str, Any]:
    """Over a level's measured stack runs: the NATS queue wait and the worker's event-loop lag
    percentiles (their histogram buckets added, then PromQL's interpolation), router-service
    timeouts and fallbacks, and the requests the gateway refused (any answer but 200; their CPU is
    in the per-token figures, so a level with refusals misses its targets)."""
    fallbacks: dict[str, float] = {}
    refused = 0.0
    for r in stack_runs:
        for why, n in r.router_fallbacks.items():
            fallbacks[why] = fallbacks.get(why, 0.0) + n
        refused += sum(n for status, n in r.statuses.items() if status != "200")
    cum = _added_buckets(r.queue_buckets for r in stack_runs)
    return {
        "queue_wait_ms": promscrape.percentiles_ms(cum),
        "queue_wait_samples": int(cum[-1][1]) if cum else 0,
        "worker_loop_lag_ms": promscrape.percentiles_ms(_added_buckets(r.loop_lag_buckets for r in stack_runs)),
        "router_fallbacks": {k: int(v) for k, v in fallbacks.items()},
        "router_timeouts": int(sum(v for k, v in fallbacks.items() if "timeout" in k.lower())),
        "refused": int(refused),
        # garbage collection per run (mean): all generations, and the full (generation 2) ones
        "gc_pause_ms_per_run": {
            svc: {
                "all": _r(_mean([sum(r.gc_pause_s.get(svc, {}).values()) * 1000 for r in stack_runs]), 1),
                "full": _r(_mean([r.gc_pause_s.get(svc, {}).get("2", 0.0) * 1000 for r in stack_runs]), 1),
            }
            for svc in ("gateway", "worker")
        },
    }


def _gc_cell(gc_ms: Mapping[str, Mapping[str, float | None]] | None) -> str:
    """``gateway 12.0 (full 3.1), worker ...``; a dash for results older than the figure."""
    if not gc_ms:
        return "—"
    return ", ".join(f"{svc} {_fmt(v.get('all'))} (full {_fmt(v.get('full'))})" for svc, v in gc_ms.items())


def _fmt(x: Any, nd: int = 1) -> str:
    """A figure of the report: ``nd`` decimals, a dash for a missing one."""
    return "—" if x is None else f"{x:.{nd}f}" if isinstance(x, float | int) else str(x)


def _failures(runs: Sequence[Run]) -> dict[str, Any]:
    kinds: dict[str, int] = {}
    samples: list[str] = []
    for r in runs:
        if r.error:
            kinds["bench"] = kinds.get("bench", 0) + 1
            samples.append(r.error[:300])
        for k, n in (r.summary.get("errors") or {}).items():
            if n:
                kinds[k] = kinds.get(k, 0) + int(n)
        for msgs in (r.summary.get("error_samples") or {}).values():
            samples.extend(m for m in msgs if m not in samples)
    return {"failed": int(sum(r.metric("failed") or 0 for r in runs)), "by_kind": kinds, "samples": samples[:4]}


def _liveness(runs: Sequence[Run]) -> dict[str, float | None]:
    def worst(key: str) -> float | None:
        vals = [float(v) for r in runs if (v := r.liveness.get(key)) is not None]
        return max(vals) if vals else None

    return {
        k: worst(k)
        for k in ("heartbeat_gap_max_s", "worker_health_ms_max", "gateway_health_ms_max", "simulator_health_ms_max")
    }


def _cpu_means(runs: Sequence[Run]) -> dict[str, dict[str, float | None]]:
    names = sorted({n for r in runs for n in r.processes})
    out: dict[str, dict[str, float | None]] = {}
    for n in names:
        means = [r.processes[n]["cpu_util_mean"] for r in runs if n in r.processes]
        peaks = [r.processes[n]["cpu_util_peak"] for r in runs if n in r.processes]
        rss = [r.processes[n]["rss_peak_mb"] for r in runs if n in r.processes]
        if n == "client":  # self-reported CPU over the load window is exact
            win = [r.processes[n].get("cpu_util_window") for r in runs if n in r.processes]
            if all(w is not None for w in win) and win:
                means = [float(w) for w in win if w is not None]
        out[n] = {
            "mean": _r(_mean(means), 3),
            "peak": _r(max(peaks) if peaks else None, 3),
            "rss_peak_mb": _r(max(rss) if rss else None, 1),
        }
    out["machine_busy"] = {
        "mean": _r(_mean([r.system.get("busy_cores_mean", 0.0) for r in runs]), 3),
        "peak": None,
        "rss_peak_mb": None,
    }
    out["other_load"] = {
        "mean": _r(_mean([r.system.get("other_cpu_s", 0.0) / max(1e-6, r.wall_s) for r in runs]), 3),
        "peak": None,
        "rss_peak_mb": None,
    }
    return out


def _cpu_per_token(runs: Sequence[Run]) -> dict[str, float | None]:
    """CPU microseconds per token the engine generated in these runs (what the relay had to carry,
    delivered or not: a run whose streams broke still did that work); the delivered count when the
    simulator's counter is missing."""
    if runs and all(r.engine_tokens is not None for r in runs):
        tokens = sum(r.engine_tokens or 0 for r in runs)
    else:
        tokens = sum(r.summary.get("output_tokens", 0) for r in runs if r.summary)
    if not tokens:
        return {}
    names = sorted({n for r in runs for n in r.processes})
    return {
        n: round(
            sum(r.processes[n].get("cpu_s_self_reported") or r.processes[n]["cpu_s"] for r in runs if n in r.processes)
            / tokens
            * 1e6,
            2,
        )
        for n in names
    }


def evaluate_targets(comparisons: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """PASS/MISS per target. TTFT targets at every level; the tokens/s target at 1,000 streams
    (or, when 1,000 was not run, at the highest level, flagged as such)."""
    out: list[dict[str, Any]] = []
    for c in comparisons:
        for key, limit, label in (
            ("added_ttft_p50_ms", TARGET_ADDED_TTFT_P50_MS, "added TTFT p50"),
            ("added_ttft_p99_ms", TARGET_ADDED_TTFT_P99_MS, "added TTFT p99"),
        ):
            v = c[key]["mean"]
            out.append(
                {
                    "level": c["level"],
                    "target": f"{label} <= {limit:g} ms",
                    "value": v,
                    "unit": "ms",
                    "result": "n/a" if v is None else ("PASS" if v <= limit else "MISS"),
                    "all_requests_ok": c["all_ok"],
                }
            )
    if comparisons:
        at = next((c for c in comparisons if c["level"] == TARGET_TOKENS_LEVEL), None)
        note = ""
        if at is None:
            at = max(comparisons, key=lambda c: c["level"])
            note = f"target is defined at {TARGET_TOKENS_LEVEL} streams; evaluated at {at['level']}"
        v = at["tokens_per_s_ratio"]["mean"]
        out.append(
            {
                "level": at["level"],
                "target": f"tokens/s stack/direct >= {TARGET_TOKENS_RATIO:.0%}",
                "value": v,
                "unit": "ratio",
                "result": "n/a" if v is None else ("PASS" if v >= TARGET_TOKENS_RATIO else "MISS"),
                "all_requests_ok": at["all_ok"],
                "note": note,
            }
        )
    for t in out:
        if t["result"] == "PASS" and not t["all_requests_ok"]:
            t["result"] = "MISS"
            t["note"] = (t.get("note", "") + "; " if t.get("note") else "") + "requests failed at this level"
    return out


# The data-plane issue's targets for the gpu-like workload: (level, summary key, <= or >=, limit, label).
GPU_TARGETS: tuple[tuple[int, str, str, float, str], ...] = (
    (100, "added_ttft_p50_ms", "<=", 10.0, "added TTFT p50"),
    (100, "added_ttft_p99_ms", "<=", 40.0, "added TTFT p99"),
    (100, "tokens_per_s_ratio", ">=", 0.95, "tokens/s stack/direct"),
)
# 1,000 streams at 10 tokens/s each, all at once, router service and budget auth on. The queue wait
# and router timeouts are keys of the level's "dataplane" figures.
THOUSAND_TARGETS: tuple[tuple[int, str, str, float, str], ...] = (
    (1000, "tokens_per_s_ratio", ">=", 0.90, "tokens/s stack/direct"),
    (1000, "added_ttft_p99_ms", "<=", 1500.0, "added TTFT p99"),
    (1000, "queue_wait_p99_ms", "<=", 100.0, "NATS queue wait p99"),
    (1000, "router_timeouts", "<=", 0.0, "router-service timeouts"),
    (1000, "refused", "<=", 0.0, "refused requests"),
)
GPU_RELAY_US_PER_TOKEN = 60.0  # gateway + worker CPU per delivered token (the capacity workload's check)


def _level_value(c: dict[str, Any], key: str) -> float | None:
    dp = c.get("dataplane") or {}
    if key == "queue_wait_p99_ms":
        return (dp.get("queue_wait_ms") or {}).get("p99")
    if key in ("router_timeouts", "refused"):
        v = dp.get(key)
        return None if v is None else float(v)
    return c[key]["mean"]


def evaluate_gpu_targets(
    comparisons: Sequence[dict[str, Any]], table: Sequence[tuple[int, str, str, float, str]] = GPU_TARGETS
) -> list[dict[str, Any]]:
    """PASS/MISS per target of the gpu-like (or thousand) workload; a level with any failed request
    (a refusal included) misses every target at that level."""
    by_level = {c["level"]: c for c in comparisons}
    out: list[dict[str, Any]] = []
    for level, key, op, limit, label in table:
        c = by_level.get(level)
        if c is None:
            continue
        v = _level_value(c, key)
        ok = v is not None and (v <= limit if op == "<=" else v >= limit)
        unit = "ratio" if key == "tokens_per_s_ratio" else "ms" if key.endswith("_ms") else "count"
        out.append(
            {
                "level": level,
                "target": f"{label} {op} {limit:g}" + (" ms" if unit == "ms" else ""),
                "value": v,
                "unit": unit,
                "result": "n/a" if v is None else ("PASS" if ok else "MISS"),
                "all_requests_ok": c["all_ok"],
            }
        )
    return _failed_levels_miss(out)


def _relay_cpu_target(c: dict[str, Any]) -> dict[str, Any]:
    """Relay CPU per token (gateway + worker) at one level, against the data-plane target."""
    cpu = c["cpu_us_per_token"]["stack"]
    relay = None if cpu.get("gateway") is None or cpu.get("worker") is None else cpu["gateway"] + cpu["worker"]
    return {
        "level": c["level"],
        "target": f"relay CPU per token (gateway + worker) <= {GPU_RELAY_US_PER_TOKEN:g} us",
        "value": relay,
        "unit": "us",
        "result": "n/a" if relay is None else ("PASS" if relay <= GPU_RELAY_US_PER_TOKEN else "MISS"),
        "all_requests_ok": c["all_ok"],
    }


def _failed_levels_miss(out: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A level with any failed request (a refusal included) misses every target at that level."""
    for t in out:
        if t["result"] == "PASS" and not t["all_requests_ok"]:
            t["result"] = "MISS"
            t["note"] = "requests failed (or were refused) at this level"
    return out


CAPACITY_TOKENS_PER_CORE_S = 30_000.0  # one worker process, and one gateway process, per core


def evaluate_capacity_targets(comparisons: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The capacity workload's targets, at each level: tokens/s per core of one worker and of one
    gateway (tokens the engine generated per CPU-second of that process), and the relay's CPU per
    token (gateway + worker)."""
    out: list[dict[str, Any]] = []
    for c in comparisons:
        cpu = c["cpu_us_per_token"]["stack"]
        for proc in ("worker", "gateway"):
            us = cpu.get(proc)
            v = None if not us else round(1e6 / us)
            out.append(
                {
                    "level": c["level"],
                    "target": f"one {proc} process: tokens/s per core >= {CAPACITY_TOKENS_PER_CORE_S:,.0f}",
                    "value": v,
                    "unit": "tokens/s per core",
                    "result": "n/a" if v is None else ("PASS" if v >= CAPACITY_TOKENS_PER_CORE_S else "MISS"),
                    "all_requests_ok": c["all_ok"],
                }
            )
        out.append(_relay_cpu_target(c))
    return _failed_levels_miss(out)


def targets_for(workload: str, comparisons: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    if workload == "gpu-like":
        return evaluate_gpu_targets(comparisons)
    if workload == "thousand":
        return evaluate_gpu_targets(comparisons, THOUSAND_TARGETS)
    if workload == "capacity":
        return evaluate_capacity_targets(comparisons)
    return evaluate_targets(comparisons)


def analyse(comparisons: Sequence[dict[str, Any]], cores: int, heartbeat_s: float = 1.0) -> list[str]:
    """Plain-language 'what limits it', from the CPU figures."""
    lines: list[str] = []
    for c in comparisons:
        level = c["level"]
        for mode in MODES:
            cpu = c["cpu_cores_mean"].get(mode) or {}
            procs = {n: v for n, v in cpu.items() if n not in ("machine_busy", "other_load") and v["mean"] is not None}
            if not procs:
                continue
            ranked = sorted(procs.items(), key=lambda kv: -(kv[1]["mean"] or 0.0))
            busy = (cpu.get("machine_busy") or {}).get("mean") or 0.0
            other = (cpu.get("other_load") or {}).get("mean") or 0.0
            hot = [n for n, v in ranked if (v["mean"] or 0.0) >= SATURATED_CORE and n != "nats-server"]
            desc = ", ".join(f"{n} {v['mean']:.2f} (peak {v['peak']:.2f})" for n, v in ranked)
            verdict = []
            if hot:
                verdict.append(
                    f"{' and '.join(hot)} saturate{'s' if len(hot) == 1 else ''} a core (single-threaded event loop)"
                )
            if busy >= 0.9 * cores:
                verdict.append(f"the machine is out of CPU ({busy:.2f} of {cores} cores busy)")
            if other >= 0.3:
                verdict.append(f"other processes on the box used {other:.2f} cores meanwhile (noise)")
            lines.append(
                f"{level} streams, {mode}: mean cores {desc}; machine {busy:.2f}/{cores}. "
                + ("; ".join(verdict) + "." if verdict else "No process is near a full core.")
            )
        b = c.get("ttft_breakdown_ms") or {}
        if b.get("gateway_accept_to_first_token_ms") is not None and b.get("client_ttft_mean_ms") is not None:
            lines.append(ttft_legs_line(level, b))
        fail = c["failures"]["stack"]
        live = c["liveness"]["stack"]
        gap = live.get("heartbeat_gap_max_s")
        if fail["failed"]:
            kinds = ", ".join(f"{k} x{n}" for k, n in fail["by_kind"].items())
            lines.append(
                f"{level} streams, stack: {fail['failed']} of {c['stack']['requests']} requests FAILED "
                f"({kinds}); e.g. {fail['samples'][0] if fail['samples'] else 'n/a'}"
            )
        if gap is not None and gap > HEARTBEAT_MISSES * heartbeat_s:
            lost = any("worker_lost" in m for m in fail["samples"])
            lines.append(
                f"{level} streams, stack: worker heartbeats arrived up to {gap:.1f} s apart (the gateway declares a "
                f"worker lost after {HEARTBEAT_MISSES} x {heartbeat_s:g} s without one) and the worker answered "
                f"/health in up to {(live.get('worker_health_ms_max') or 0) / 1000:.1f} s, the gateway in up to "
                f"{(live.get('gateway_health_ms_max') or 0) / 1000:.1f} s: their event loops lag under this load, "
                + (
                    "and the gateway cut the streams of a worker that was still streaming (worker_lost)."
                    if lost
                    else "past the gateway's heartbeat window; no stream was cut."
                )
            )
        elif live.get("worker_health_ms_max") and (live["worker_health_ms_max"] or 0) > 250:
            lines.append(
                f"{level} streams, stack: worker event-loop lag up to {live['worker_health_ms_max']:.0f} ms "
                f"(/health latency), gateway up to {live.get('gateway_health_ms_max') or 0:.0f} ms."
            )
    lines.extend(_budget_lines(comparisons, cores))
    return lines


def _budget_lines(comparisons: Sequence[dict[str, Any]], cores: int) -> list[str]:
    """CPU budget at the highest level's direct token rate: the relay's cost per token the engine
    generated at that level (per-token cost falls with load: event loops and the worker's
    coalescing batch more), plus what the simulator and the client need at that rate (direct runs)."""
    if not comparisons:
        return []
    top = max(comparisons, key=lambda c: c["level"])
    per_tok = top["cpu_us_per_token"].get("stack") or {}
    relay = {n: per_tok[n] for n in ("gateway", "worker", "nats-server") if n in per_tok}
    if not relay:
        return []
    total = sum(relay.values())
    tps = top["direct"]["tokens_per_s"]["mean"] or 0.0
    direct_tok = top["cpu_us_per_token"].get("direct") or {}
    sim = direct_tok.get("simulator", 0.0) * tps / 1e6
    client = direct_tok.get("client", 0.0) * tps / 1e6
    need = total * tps / 1e6
    return [
        f"Relay CPU per token carried at {top['level']} streams: "
        + ", ".join(f"{n} {v:.0f} us" for n, v in relay.items())
        + f" = {total:.0f} us/token. At the direct rate of {top['level']} streams ({tps:.0f} tok/s) the relay "
        f"needs {need:.2f} cores, plus the simulator {sim:.2f} and the client {client:.2f}: "
        f"{need + sim + client:.2f} cores wanted on a {cores}-core box"
        + (
            " -> CPU-bound by construction; the relay must get cheaper per token (or the box bigger)."
            if need + sim + client > cores
            else "."
        )
    ]


# ---------------------------------------------------------------------------------------------
# Metadata and outputs
# ---------------------------------------------------------------------------------------------
def _nats_version(proc: psutil.Process | None) -> str:
    exe = None
    with contextlib.suppress(psutil.Error):
        exe = proc.exe() if proc else None
    exe = exe or shutil.which("nats-server")
    if not exe:
        return "unknown"
    try:
        return subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=5).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def metadata(cfg: BenchConfig, bench: Bench, started: dt.datetime, duration_s: float) -> dict[str, Any]:
    commit, dirty_files = bench.git_commit, bench.git_dirty_files
    prompt_tokens = sorted(bench.prompt_tokens)
    return {
        "date": started.isoformat(timespec="seconds"),
        "git_commit": commit,
        "git_dirty": bool(dirty_files),
        "git_dirty_files": len(dirty_files),
        "model_id": MODEL,
        "model_revision": "n/a (simulator: no weights are loaded; the name is only served)",
        "engine": "engine-sim (vllm flavour)",
        "engine_version": f"llmlab-engine-sim {dist_version('llmlab-engine-sim')} (this repository's working tree)",
        "container_image": "n/a (processes run on the host from the repository venv)",
        "gpu": "none (simulated)",
        "gpu_count": 0,
        "driver": "n/a (no GPU)",
        "cuda_or_rocm": "n/a (no GPU)",
        "cpu": cpu_model(),
        "ram": f"{psutil.virtual_memory().total / 2**30:.1f} GiB",
        "prompt_dataset": "none: synthetic, one user message (a fixed sentence + the request index)",
        "input_length_distribution": (
            f"fixed: {prompt_tokens[0]} prompt tokens (as counted by the simulator)"
            if len(prompt_tokens) == 1
            else f"fixed sentence; simulator counted {prompt_tokens[0]}-{prompt_tokens[-1]} prompt tokens"
            if prompt_tokens
            else "fixed: one short sentence (~15 tokens; counts in each run's usage)"
        ),
        "output_length_distribution": (
            f"fixed: {cfg.tokens} tokens (max_tokens {cfg.tokens} = simulator "
            f"--output-len {cfg.tokens}); warm-up runs {cfg.warmup_tokens}"
        ),
        "concurrency": cfg.levels,
        "warmup": (
            f"one run per mode per level before its measured runs, same concurrency, {cfg.warmup_tokens} "
            "tokens per request; reported apart (runs with repeat 0), not in the figures"
        ),
        "duration": (
            f"{duration_s:.0f} s for the whole benchmark; per run each stream sends "
            f"max({cfg.min_per_stream}, ceil({cfg.min_requests} / level)) request(s) back to back, streams start "
            + (f"over {cfg.ramp_s:g} s" if cfg.ramp_s > 0 else "all at once")
            + "; window = first send to last byte (per-run client_summary.window_s)"
        ),
        "sampling_parameters": {
            "max_tokens": cfg.tokens,
            "stream": True,
            "stream_options.include_usage": True,
            "temperature": "not sent (engine default; the simulator ignores sampling)",
        },
        "simulated": True,
        "simulated_note": (
            "All figures come from the engine simulator (fixed TTFT/ITL timing on the CPU), not a "
            "GPU: they measure the relay's overhead, not model serving performance."
        ),
        "simulator": {
            "ttft_ms": cfg.ttft_ms,
            "itl_ms": cfg.itl_ms,
            "tick_ms": cfg.sim_tick_ms,
            "max_num_seqs": cfg.max_num_seqs,
            "output_len": cfg.tokens,
            "flavor": "vllm",
        },
        "worker": {
            "max_concurrency": cfg.worker_max_concurrency,
            "heartbeat_interval_s": cfg.worker_heartbeat_s,
            "coalesce_ms": "default (10)",
            "processes": cfg.worker_processes,
        },
        "gateway_processes": cfg.gateway_processes,
        "settings": cfg.settings,
        "sample_interval_s": cfg.sample_interval_s,
        "gateway": (
            {"queue_timeout_s": cfg.queue_timeout_s, "auth": "static", "router": "embedded"}
            if cfg.stack == "relay"
            else {"queue_timeout_s": "default", "auth": "budget", "router": cfg.router}
        ),
        "workload": cfg.workload,
        "stack": (
            "gateway (static key, embedded router), worker, simulator"
            if cfg.stack == "relay"
            else f"the default stack: gateway (budget auth, router {cfg.router}), worker, budget, router, accounting, "
            "simulator"
        ),
        "repeats": cfg.repeats,
        "quick": cfg.quick,
        "namespace": bench.stack.namespace,
        "nats_url": cfg.nats_url,
        "nats_server_version": _nats_version(bench.services.get("nats-server")),
        "python": platform.python_version(),
        "aiohttp": dist_version("aiohttp"),
        "platform": platform.platform(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "open_files_limit": raise_nofile_limit(),
        "service_logs": {p.name: str(p.log_path) for p in bench.stack.procs},
        "command_line": shlex.join([sys.executable, *sys.argv]),
    }


def render_markdown(doc: dict[str, Any]) -> str:
    meta, comps, targets = doc["metadata"], doc["summary"]["levels"], doc["summary"]["targets"]

    f = _fmt

    def runs_of(d: dict[str, Any], nd: int = 1) -> str:
        return "[" + ", ".join(f(v, nd) for v in d["runs"]) + "]"

    tick = meta["simulator"].get("tick_ms", 1.0)  # results before the option ran on the simulator's 1 ms
    interval = float(meta.get("sample_interval_s", 0.5))  # the fixed interval before the option
    out = [
        f"# Relay benchmark {meta['date']}",
        "",
        f"> {meta['simulated_note']}",
        "",
        f"Command: `{meta['command_line']}`  ",
        f"Commit `{meta['git_commit'][:12]}`{' (dirty working tree)' if meta['git_dirty'] else ''}; "
        f"{meta['cpu']}; {meta['ram']} RAM; simulator TTFT {meta['simulator']['ttft_ms']:g} ms, "
        f"ITL {meta['simulator']['itl_ms']:g} ms, tick {tick:g} ms"
        f"{' (a strict step loop)' if tick >= meta['simulator']['itl_ms'] else ''}, "
        f"{meta['simulator']['output_len']} output tokens; {meta['repeats']} measured run(s) per mode and level.  ",
        f"Run length: {meta['duration']}."
        + (
            " The stack's services ran with " + ", ".join(f"`{k}={v}`" for k, v in meta["settings"].items()) + "."
            if meta.get("settings")
            else ""
        ),
        "",
        "## Stack vs direct",
        "",
        "| streams | added TTFT p50 (ms) | added TTFT p99 (ms) | ITL p99 ratio | tokens/s ratio | per repeat "
        "(stack − direct, stack / direct) | requests ok (direct, stack) |",
        "|---:|---:|---:|---:|---:|---|---|",
    ]
    for c in comps:
        d_ok, s_ok = c["direct"]["ok"]["runs"], c["stack"]["ok"]["runs"]
        out.append(
            f"| {c['level']} | {f(c['added_ttft_p50_ms']['mean'])} | {f(c['added_ttft_p99_ms']['mean'])} | "
            f"{f(c['itl_p99_ratio']['mean'], 3)} | {f(c['tokens_per_s_ratio']['mean'], 3)} | "
            f"p50 {runs_of(c['added_ttft_p50_ms'])}; p99 {runs_of(c['added_ttft_p99_ms'])}; "
            f"tok/s {runs_of(c['tokens_per_s_ratio'], 3)} | {int(sum(d_ok))}/{c['direct']['requests']}, "
            f"{int(sum(s_ok))}/{c['stack']['requests']} |"
        )
    out += [
        "",
        "## Absolute figures (mean of the measured runs)",
        "",
        "| streams | mode | TTFT p50 (ms) | TTFT p99 (ms) | ITL p99 (ms) | TPOT p50 (ms) | tokens/s | tokens/chunk "
        "| failed |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in comps:
        for mode in MODES:
            m = c[mode]
            out.append(
                f"| {c['level']} | {mode} | {f(m['ttft_p50_ms']['mean'])} | {f(m['ttft_p99_ms']['mean'])} | "
                f"{f(m['itl_p99_ms']['mean'])} | {f(m['tpot_p50_ms']['mean'], 2)} | "
                f"{f(m['tokens_per_s']['mean'], 0)} | {f(m['tokens_per_chunk']['mean'], 2)} | "
                f"{f(sum(m['failed']['runs']), 0)} |"
            )
    out += ["", "## Targets", "", "| streams | target | value | result | note |", "|---:|---|---:|---|---|"]
    for t in targets:
        val = f(t["value"], 0 if t["unit"] == "tokens/s per core" else 3)
        out.append(f"| {t['level']} | {t['target']} | {val} | **{t['result']}** | {t.get('note', '')} |")
    out += [
        "",
        "## Data plane (stack runs, from the services' metrics)",
        "",
        "NATS queue wait: the worker's dispatch-to-take histogram over the measured runs (PromQL interpolation "
        "inside a bucket). Refused: answers other than 200; their CPU is inside the CPU figures below. "
        "GC: milliseconds per run in the cyclic garbage collector (`llmlab_process_gc_pause_seconds`), "
        "all generations (of them full collections), each a stop of that process's event loop.",
        "",
        "| streams | queue wait p50 / p95 / p99 (ms) | samples | worker event-loop lag p50 / p99 (ms) | "
        "router timeouts | router fallbacks | refused | CPU µs per engine token (gateway, worker) | "
        "GC ms per run: gateway, worker |",
        "|---:|---|---:|---|---:|---|---:|---|---|",
    ]
    for c in comps:
        dp = c.get("dataplane") or {}
        q = dp.get("queue_wait_ms") or {}
        lag = dp.get("worker_loop_lag_ms") or {}
        cpu = c["cpu_us_per_token"]["stack"]
        out.append(
            f"| {c['level']} | {f(q.get('p50'))} / {f(q.get('p95'))} / {f(q.get('p99'))} | "
            f"{dp.get('queue_wait_samples', '—')} | {f(lag.get('p50'))} / {f(lag.get('p99'))} | "
            f"{dp.get('router_timeouts', '—')} | "
            f"{json.dumps(dp.get('router_fallbacks', {}))} | {dp.get('refused', '—')} | "
            f"{f(cpu.get('gateway'))}, {f(cpu.get('worker'))} | {_gc_cell(dp.get('gc_pause_ms_per_run'))} |"
        )
    profiles = doc.get("profiles") or {}
    if profiles:
        out += [
            "",
            "## Profiles (py-spy, GIL-held samples, the profiled stack run of each level; raw in `profiles/`)",
            "",
        ]
        for name, ps in profiles.items():
            out.append(
                f"- **{name}** ({ps['samples']} samples): "
                + ", ".join(f"{k} {v:.0f}%" for k, v in ps["by_package"].items())
                + "; top leaves: "
                + "; ".join(f"`{k}` {v:.0f}%" for k, v in list(ps["top_leaves"].items())[:5])
            )
    out += [
        "",
        f"## CPU (mean cores over the run; peak = highest {interval:g} s sample) and peak RSS",
        "",
        "| streams | mode | " + " | ".join(("client", *SERVICES)) + " | machine busy | other load |",
        "|---:|---|" + "---:|" * (len(SERVICES) + 3),
    ]
    for c in comps:
        for mode in MODES:
            cpu = c["cpu_cores_mean"][mode]
            cells = []
            for n in ("client", *SERVICES):
                v = cpu.get(n)
                cells.append("—" if not v else f"{f(v['mean'], 2)} (pk {f(v['peak'], 2)}, {f(v['rss_peak_mb'], 0)} MB)")
            out.append(
                f"| {c['level']} | {mode} | "
                + " | ".join(cells)
                + f" | {f(cpu['machine_busy']['mean'], 2)} | {f(cpu['other_load']['mean'], 2)} |"
            )
    shown = timeline_runs(doc)
    if shown:
        out += [
            "",
            f"Over time: the plot's bottom row, cores per process in {interval:g} s samples of the first measured "
            f"run of each mode at {shown[0]['level']} streams.",
        ]
    out += ["", "## What limits it", ""] + [f"- {ln}" for ln in doc["summary"]["analysis"]]
    warm = [r for r in doc["runs"] if r["warmup"]]
    if warm:
        out += [
            "",
            "## Warm-up runs (not in the figures)",
            "",
            "| streams | mode | tokens | TTFT p50 (ms) | TTFT p99 (ms) | ok | failed |",
            "|---:|---|---:|---:|---:|---:|---:|",
        ]
        for r in warm:
            out.append(
                f"| {r['level']} | {r['mode']} | {r['tokens']} | {f(r['ttft_p50_ms'])} | "
                f"{f(r['ttft_p99_ms'])} | {f(r['requests_ok'], 0)} | {f(r['requests_failed'], 0)} |"
            )
    out += ["", "## Metadata", "", "| field | value |", "|---|---|"]
    for k, v in meta.items():
        if k in ("service_logs",):
            continue
        out.append(f"| {k} | {json.dumps(v) if isinstance(v, dict | list) else v} |")
    return "\n".join(out) + "\n"


def timeline_runs(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The first measured run of each mode at the highest level, when it has its samples' times
    (results from before the option have none): the timeline panels' runs, direct first."""
    measured = [r for r in doc.get("runs", []) if not r.get("warmup") and not r.get("profiled")]
    if not measured:
        return []
    top = max(r["level"] for r in measured)
    out = []
    for mode in MODES:
        run = next((r for r in measured if r["level"] == top and r["mode"] == mode), None)
        if run is not None and run.get("sample_times_s"):
            out.append(run)
    return out


def _timeline(ax: Any, run: dict[str, Any], cores: int) -> None:
    """Cores per process over one run, stacked: sample i covers (t[i-1], t[i]]. Every process of the
    run, the full stack's budget, router and accounting too, in the CPU bars' order first."""
    times = run["sample_times_s"]
    first = ["client", *SERVICES]
    names = [n for n in first if n in run["processes"]] + sorted(set(run["processes"]) - set(first))
    series = []
    for n in names:
        v = list(run["processes"][n].get("samples") or [])
        series.append((v + [0.0] * len(times))[: len(times)])  # the client's end early: zeros after
    ax.stackplot(times, *series, labels=list(names), step="pre")
    ax.axhline(cores, color="red", linestyle="--", linewidth=1)
    ax.set_xlim(0, times[-1])
    ax.set_ylim(0, cores + 0.5)  # one scale for both modes' panels (a sample over the cores is the 10 ms ticks)
    ax.set_xlabel("seconds since the run started")
    ax.set_ylabel("cores")
    ax.set_title(f"{run['level']} streams, {run['mode']} (repeat {run['repeat']}): CPU over time", fontsize=9)


def render_plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    comps = doc["summary"]["levels"]
    if not comps:
        return
    labels = [str(c["level"]) for c in comps]
    xs = list(range(len(comps)))
    w = 0.38
    # The run's own machine (a re-render elsewhere draws the cores the run had)
    cores = metadata_cores(doc["metadata"]) or (psutil.cpu_count() or 2)
    shown = timeline_runs(doc)
    rows = 3 if shown else 2
    fig, grid = plt.subplots(rows, 2, figsize=(12, 4.25 * rows))
    axes = grid[:2]
    colors = {"direct": "#4C72B0", "stack": "#DD8452"}

    def bars(ax: Any, metric: str, title: str, ylabel: str) -> None:
        for i, mode in enumerate(MODES):
            means = [c[mode][metric]["mean"] or 0.0 for c in comps]
            lo = [m - min(c[mode][metric]["runs"] or [m]) for m, c in zip(means, comps, strict=True)]
            hi = [max(c[mode][metric]["runs"] or [m]) - m for m, c in zip(means, comps, strict=True)]
            pos = [x + (i - 0.5) * w for x in xs]
            ax.bar(pos, means, w, yerr=[lo, hi], capsize=3, label=mode, color=colors[mode])
            for p, m, c in zip(pos, means, comps, strict=True):
                failed = int(sum(c[mode]["failed"]["runs"]))
                text = f"{m:.0f}" + (f"\n{failed}/{c[mode]['requests']} failed" if failed else "")
                ax.annotate(
                    text,
                    (p, max(m, 1.0)),
                    ha="center",
                    va="bottom",
                    fontsize=7,
                    xytext=(0, 2),
                    textcoords="offset points",
                    color="red" if failed else "black",
                )
        ax.set_yscale("log")
        ax.set_xticks(xs, labels)
        ax.set_xlabel("concurrent streams")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.legend()

    bars(axes[0][0], "ttft_p50_ms", "TTFT p50 of successful requests (whiskers: min-max of repeats)", "ms (log)")
    bars(axes[0][1], "ttft_p99_ms", "TTFT p99 of successful requests", "ms (log)")
    bars(axes[1][0], "tokens_per_s", "Delivered output tokens/s", "tokens/s (log)")
    ax = axes[1][1]
    names = ["client", *SERVICES]
    bottoms = [0.0] * (2 * len(comps))
    pos = [x + (i - 0.5) * w for x in xs for i in range(2)]
    for n in names:
        vals = [((c["cpu_cores_mean"][mode].get(n) or {}).get("mean") or 0.0) for c in comps for mode in MODES]
        ax.bar(pos, vals, w * 0.95, bottom=bottoms, label=n)
        bottoms = [b + v for b, v in zip(bottoms, vals, strict=True)]
    ax.axhline(cores, color="red", linestyle="--", linewidth=1, label=f"{cores} cores")
    ax.set_xticks(pos, [f"{c['level']}\n{mode}" for c in comps for mode in MODES], fontsize=7)
    ax.set_ylabel("mean cores")
    ax.set_title("CPU by process (left bar direct, right bar stack)")
    ax.legend(fontsize=7, ncol=2)
    for i, run in enumerate(shown):
        _timeline(grid[2][i], run, cores)
    if shown:
        grid[2][len(shown) - 1].legend(fontsize=7, ncol=2, loc="upper right")  # the stack's run when shown
    if len(shown) == 1:
        grid[2][1].axis("off")
    meta = doc["metadata"]
    fig.suptitle(
        f"Relay benchmark {meta['date']} — simulated engine (no GPU), commit {meta['git_commit'][:10]}", fontsize=11
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def build_document(cfg: BenchConfig, bench: Bench, started: dt.datetime, duration_s: float) -> dict[str, Any]:
    comps = [compare_level(bench.runs, lv) for lv in cfg.levels if any(r.level == lv for r in bench.runs)]
    cores = psutil.cpu_count() or 2
    return {
        "metadata": metadata(cfg, bench, started, duration_s),
        "summary": {
            "levels": comps,
            "targets": targets_for(cfg.workload, comps),
            "analysis": analyse(comps, cores, cfg.worker_heartbeat_s),
        },
        "runs": [r.to_json() for r in bench.runs],
        "profiles": {p.stem: profile_summary(p) for p in sorted(bench.profile_dir.glob("*.txt")) if p.stat().st_size},
    }


def report_lines(doc: dict[str, Any], paths: dict[str, Path]) -> list[str]:
    """The human-readable end-of-run report."""

    def v(c: dict[str, Any], key: str, nd: int) -> str:
        m, sp = c[key]["mean"], c[key]["spread"]
        return ("—" if m is None else f"{m:.{nd}f}") + ("" if sp is None else f"±{sp / 2:.{nd}f}")

    out = [
        "",
        "Relay benchmark (simulated engine, no GPU): stack vs direct (mean ± half the spread of repeats)",
        f"{'streams':>8} {'+TTFT p50 ms':>14} {'+TTFT p99 ms':>14} {'ITL p99 x':>11} {'tok/s x':>12}"
        "  ok (direct, stack)",
    ]
    for c in doc["summary"]["levels"]:
        ok = (
            f"{int(sum(c['direct']['ok']['runs']))}/{c['direct']['requests']}, "
            f"{int(sum(c['stack']['ok']['runs']))}/{c['stack']['requests']}"
        )
        out.append(
            f"{c['level']:>8} {v(c, 'added_ttft_p50_ms', 1):>14} {v(c, 'added_ttft_p99_ms', 1):>14} "
            f"{v(c, 'itl_p99_ratio', 2):>11} {v(c, 'tokens_per_s_ratio', 3):>12}  {ok}"
        )
    out += ["", "Targets:"]
    for t in doc["summary"]["targets"]:
        nd = 0 if t["unit"] == "tokens/s per core" else 3
        val = "—" if t["value"] is None else f"{t['value']:.{nd}f}"
        note = f"  ({t['note']})" if t.get("note") else ""
        out.append(f"  {t['result']:<4} {t['level']:>5} streams: {t['target']}: {val}{note}")
    out += ["", "What limits it:"] + [f"  - {line}" for line in doc["summary"]["analysis"]]
    out += ["", "Wrote " + ", ".join(str(x) for x in paths.values())]
    return out


def _sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse_args(argv)
    if cfg.render is not None:
        paths = rerender(cfg.render)
        for line in report_lines(json.loads(paths["json"].read_text()), paths):
            print(line)  # noqa: T201
        return 0
    soft = raise_nofile_limit(max(cfg.levels) * 3 + 256)  # inherited by the services we spawn
    log.info(
        "open-files limit %d; levels %s, %d repeat(s), %d tokens, warm-up %d tokens",
        soft,
        cfg.levels,
        cfg.repeats,
        cfg.tokens,
        cfg.warmup_tokens,
    )
    require_committed(cfg.dirty)
    signal.signal(signal.SIGTERM, _sigterm)
    started = dt.datetime.now(dt.UTC)
    bench = Bench(cfg)
    try:
        bench.start()
        bench.run_all()
        duration = time.monotonic() - bench.t_start
        doc = build_document(cfg, bench, started, duration)
        paths = write_outputs(doc, cfg.out_dir, started, cfg.name, render_markdown, render_plot)
        if doc["profiles"]:
            shutil.copytree(bench.profile_dir, paths["json"].parent / "profiles", dirs_exist_ok=True)
    except KeyboardInterrupt:
        log.warning("interrupted: stopping the processes and deleting the namespace's streams")
        return 130
    finally:
        bench.close()
    for line in report_lines(doc, paths):
        print(line)  # noqa: T201
    log.info("done in %.0fs", time.monotonic() - bench.t_start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
