"""The autoscaling policy of ``infra/k8s/base/autoscaling.yaml``, for real on this machine: a small
controller that reads the same metric from a real Prometheus and applies the same rules as the
Kubernetes HPA that KEDA drives (target per worker, min/max, the scale-up and scale-down
behaviour), by starting worker processes and draining them (SIGTERM) against the engine
simulator, under a burst, a low load, a ramp and a low load again.

    python -m llmlab_lab.autoscale                    # make autoscale-demo -> results/autoscale/<UTC>/
    python -m llmlab_lab.autoscale --quick            # the CI-sized run (tests)

The policy's times are scaled by ``--time-scale`` (a 10-minute scale-down window is 30 s at 0.05)
and its target by the demo workers' slots (384 of 512 slots is 0.75 of each worker's). What a GPU
pod adds (minutes of model download and load before it is ready) is not here: a simulator worker is
ready in about a second. Simulated: the figures measure the control loop, not a GPU fleet.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import logging
import math
import secrets
import signal
import sys
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from llmlab_loadtest.bench_meta import metadata_block, metadata_section, write_outputs

from llmlab_lab.k8s import REPO

log = logging.getLogger("llmlab_lab.autoscale")

MANIFEST = REPO / "infra" / "k8s" / "base" / "autoscaling.yaml"
WORKERS_MANIFEST = REPO / "infra" / "k8s" / "base" / "workers.yaml"


@dataclass(frozen=True)
class Policy:
    """One ScaledObject's scaling rules (times in seconds)."""

    name: str
    query: str
    threshold: float  # the metric per replica the HPA aims at (AverageValue)
    min_replicas: int
    max_replicas: int
    polling_s: float
    up_stabilization_s: float
    up_pods: int
    up_period_s: float
    down_stabilization_s: float
    down_pods: int
    down_period_s: float

    def scaled(self, time_scale: float, threshold: float) -> Policy:
        t = time_scale
        return Policy(
            self.name,
            self.query,
            threshold,
            self.min_replicas,
            self.max_replicas,
            self.polling_s * t,
            self.up_stabilization_s * t,
            self.up_pods,
            self.up_period_s * t,
            self.down_stabilization_s * t,
            self.down_pods,
            self.down_period_s * t,
        )


def load_policy(name: str = "worker-vllm", path: Path = MANIFEST) -> Policy:
    """The policy of the ScaledObject ``name``: its Prometheus trigger and HPA behaviour."""
    so = next(d for d in yaml.safe_load_all(path.read_text()) if d and d["metadata"]["name"] == name)
    spec = so["spec"]
    trig = next(t for t in spec["triggers"] if t["type"] == "prometheus")
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    [up], [down] = behavior["scaleUp"]["policies"], behavior["scaleDown"]["policies"]
    if up["type"] != "Pods" or down["type"] != "Pods":
        raise ValueError(f"{name}: only Pods policies are modelled here")
    return Policy(
        name=name,
        query=trig["metadata"]["query"],
        threshold=float(trig["metadata"]["threshold"]),
        min_replicas=int(spec["minReplicaCount"]),
        max_replicas=int(spec["maxReplicaCount"]),
        polling_s=float(spec["pollingInterval"]),
        up_stabilization_s=float(behavior["scaleUp"]["stabilizationWindowSeconds"]),
        up_pods=int(up["value"]),
        up_period_s=float(up["periodSeconds"]),
        down_stabilization_s=float(behavior["scaleDown"]["stabilizationWindowSeconds"]),
        down_pods=int(down["value"]),
        down_period_s=float(down["periodSeconds"]),
    )


def worker_slots(path: Path = WORKERS_MANIFEST, name: str = "worker-vllm") -> int:
    """LLMLAB_WORKER_MAX_CONCURRENCY of the manifest's worker: what the threshold is a share of."""
    dep = next(d for d in yaml.safe_load_all(path.read_text()) if d and d["metadata"]["name"] == name)
    [worker] = dep["spec"]["template"]["spec"]["containers"]
    return int(next(e["value"] for e in worker["env"] if e["name"] == "LLMLAB_WORKER_MAX_CONCURRENCY"))


@dataclass
class Autoscaler:
    """The HPA's replica calculation with ``behavior`` (Kubernetes' autoscaling/v2 rules, for one
    AverageValue metric and one Pods policy each way):

    - recommendation = ceil(metric / threshold), within [min, max];
    - scale-up: the lowest recommendation of the up-stabilisation window (none: at once), and at
      most ``up_pods`` more than the replicas of ``up_period_s`` ago;
    - scale-down: the highest recommendation of the down-stabilisation window, and at most
      ``down_pods`` fewer than the replicas of ``down_period_s`` ago;
    - an unknown metric (Prometheus empty or down) changes nothing: the HPA does not scale down on
      missing metrics, and this one has no other to scale up on.
    """

    policy: Policy
    recommendations: deque[tuple[float, int]] = field(default_factory=deque)
    history: deque[tuple[float, int]] = field(default_factory=deque)  # (time, replicas) after each change

    def desired(self, now: float, metric: float | None, current: int) -> int:
        p = self.policy
        if not self.history:
            self.history.append((now - max(p.up_period_s, p.down_period_s) - 1, current))
        if metric is None:
            return current
        raw = max(p.min_replicas, min(p.max_replicas, math.ceil(metric / p.threshold) if metric > 0 else 0))
        self.recommendations.append((now, raw))
        keep = max(p.up_stabilization_s, p.down_stabilization_s)
        while self.recommendations and self.recommendations[0][0] < now - keep:
            self.recommendations.popleft()
        target = current
        if raw > current:
            window = [r for t, r in self.recommendations if t >= now - p.up_stabilization_s] or [raw]
            target = max(current, min(window))
            target = min(target, self._replicas_at(now - p.up_period_s) + p.up_pods)
        elif raw < current:
            window = [r for t, r in self.recommendations if t >= now - p.down_stabilization_s] or [raw]
            target = min(current, max(window))
            target = max(target, self._replicas_at(now - p.down_period_s) - p.down_pods)
        target = max(p.min_replicas, min(p.max_replicas, target))
        if target != current:
            self.history.append((now, target))
        return target

    def _replicas_at(self, when: float) -> int:
        """The replicas set at time ``when`` (the last change at or before it)."""
        at = self.history[0][1]
        for t, r in self.history:
            if t <= when:
                at = r
        return at


# -- the demo ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Phase:
    name: str
    seconds: float
    rate: float  # new requests per second (open loop: arrivals do not wait for answers)
    rate_end: float | None = None  # a ramp: the rate goes linearly from ``rate`` to this

    def rate_at(self, elapsed: float) -> float:
        if self.rate_end is None:
            return self.rate
        return self.rate + (self.rate_end - self.rate) * min(1.0, max(0.0, elapsed / self.seconds))

    def describe(self) -> str:
        rate = f"{self.rate}/s" if self.rate_end is None else f"{self.rate} -> {self.rate_end}/s"
        return f"{self.name} {rate} for {self.seconds:g}s"


@dataclass(frozen=True)
class DemoConfig:
    time_scale: float
    slots: int  # each demo worker's LLMLAB_WORKER_MAX_CONCURRENCY
    phases: tuple[Phase, ...]
    max_tokens: int = 150  # 3 s streams: a worker drained while the load goes on still holds some
    ttft_ms: float = 50.0
    itl_ms: float = 20.0
    quick: bool = False


FULL = DemoConfig(
    time_scale=0.05,
    slots=4,
    # A 30 s burst, a low load that lasts through the drains, a 45 s ramp back up, then low again.
    # (Until 2026-12-06 the backlog grew in the low phase beside free slots: every worker drove one
    # shared simulator, so all reported its running count and the router's ties went to one worker
    # id while its own queue grew. Each worker has its own engine now, and the router counts a
    # worker's own queue as its load.)
    phases=(
        Phase("warm", 5, 0.5),
        Phase("burst", 30, 5.0),
        Phase("low", 50, 2.0),
        Phase("ramp", 45, 0.5, rate_end=5.0),
        Phase("after", 50, 1.0),
    ),
)
QUICK = DemoConfig(
    time_scale=0.01,
    slots=4,
    phases=(
        Phase("warm", 2, 0.5),
        Phase("burst", 7, 8.0),
        Phase("low", 8, 2.5),
        Phase("ramp", 8, 0.5, rate_end=8.0),
        Phase("after", 8, 2.5),
    ),
    quick=True,
)


@dataclass
class Sample:
    t: float
    metric: float | None
    desired: int  # = the workers started and not told to stop (the controller applies it at once)
    ready: int  # of those, answering /ready


@dataclass
class WorkerLife:
    index: int
    started_at: float
    ready_at: float | None = None
    drain_at: float | None = None
    streams_at_drain: int = 0  # the worker's attempts in flight when it was told to drain
    exited_at: float | None = None
    exit_code: int | None = None


async def run_demo(cfg: DemoConfig, command: str) -> dict[str, Any]:
    """Start the stack, drive the load through the gateway and scale the workers; the result."""
    from llmlab_loadtest.sse_client import RequestRecord, stream_request
    from llmlab_testkit.procs import Stack
    from llmlab_testkit.prom import start_prometheus

    base = load_policy()
    policy = base.scaled(cfg.time_scale, threshold=base.threshold / worker_slots() * cfg.slots)
    scaler = Autoscaler(policy)
    namespace = f"as{int(time.time()) % 10**6}"
    stack = Stack(namespace)
    prom = None
    workers: list[tuple[WorkerLife, Any]] = []
    samples: list[Sample] = []
    records: list[RequestRecord] = []
    phase_starts: list[float] = []  # seconds since t0 at which each phase began
    engines: dict[int, Any] = {}  # worker index -> its simulator process
    t0 = time.monotonic()
    try:
        router = stack.router(env={"LLMLAB_ROUTER_QUEUE_PROBE_S": str(max(0.2, policy.polling_s / 2))})
        gateway = stack.gateway(
            auth="static",
            router="service",
            queue_timeout_s=120,
            env={"LLMLAB_GATEWAY_ADMISSION": "false", "LLMLAB_GATEWAY_DRAIN_TIMEOUT_S": "60"},
        )
        interval = max(0.25, policy.polling_s)
        prom = start_prometheus({"router": [f"127.0.0.1:{router.port}"]}, interval_s=interval)  # type: ignore[attr-defined]

        def start_worker() -> None:
            life = WorkerLife(len(workers), time.monotonic() - t0)
            # One engine per worker, as one engine per GPU pod: workers behind one shared engine all
            # report its running count, and the router cannot tell them apart by load.
            sim = stack.sim(
                ttft_ms=cfg.ttft_ms, itl_ms=cfg.itl_ms, max_num_seqs=64, output_len=cfg.max_tokens, wait=False
            )
            engines[life.index] = sim
            proc = stack.worker(
                "vllm",
                "gpu-vllm",
                f"http://127.0.0.1:{sim.port}",  # type: ignore[attr-defined]
                max_concurrency=cfg.slots,
                heartbeat_s=0.5,
                # Random ids, as pod names are: the router breaks ties by id, and ids that grew with
                # the start order would keep the newest worker (the one scale-down drains) idle.
                worker_id=f"as-{secrets.token_hex(3)}",
                wait=False,
                env={"LLMLAB_WORKER_DRAIN_TIMEOUT_S": "120"},
            )
            workers.append((life, proc))
            log.info("t=%5.1fs  worker %d started", life.started_at, life.index)

        async def drain_busiest() -> None:
            # The worker holding the most streams (ties: the newest). A ReplicaSet would take the
            # newest, often idle at low load; the busiest makes every drain a test of losing nothing.
            active = [w for w in workers if w[0].drain_at is None]
            counts = [int(n) for n in await asyncio.gather(*(_in_flight(proc) for _, proc in active))]
            k = max(range(len(active)), key=lambda i: (counts[i], i))
            life, proc = active[k]
            life.drain_at = time.monotonic() - t0
            life.streams_at_drain = counts[k]
            proc.proc.send_signal(signal.SIGTERM)  # drains: stops pulling, finishes its streams
            log.info("t=%5.1fs  worker %d draining (%d streams in flight)", life.drain_at, life.index, counts[k])

        for _ in range(policy.min_replicas):
            start_worker()
        for _, proc in workers:
            proc.wait_ready(30)
        prom.wait_scraped(["router"])
        url = f"http://127.0.0.1:{gateway.port}/v1/chat/completions"  # type: ignore[attr-defined]
        headers = {"Authorization": "Bearer sk-llmlab-dev", "Content-Type": "application/json"}
        stop = asyncio.Event()

        async def control() -> None:
            while not stop.is_set():
                now = time.monotonic() - t0
                for life, proc in workers:
                    if life.ready_at is None and life.drain_at is None and await _ready(proc):
                        life.ready_at = now
                        log.info("t=%5.1fs  worker %d ready", now, life.index)
                    if life.drain_at is not None and life.exited_at is None and proc.proc.poll() is not None:
                        life.exited_at, life.exit_code = now, proc.proc.returncode
                        proc.stopped = True  # exited on its own after the drain: not a crash
                        log.info("t=%5.1fs  worker %d exited (%s)", now, life.index, life.exit_code)
                        await asyncio.to_thread(engines[life.index].stop, 5)  # its pod is gone
                try:
                    metric = await asyncio.to_thread(prom.value, policy.query)
                except Exception as exc:
                    log.warning("metric unavailable: %s", exc)
                    metric = None
                active = [w for w in workers if w[0].drain_at is None]
                want = scaler.desired(now, metric, len(active))
                for _ in range(want - len(active)):
                    start_worker()
                for _ in range(len(active) - want):
                    await drain_busiest()
                ready = sum(1 for life, _ in workers if life.ready_at is not None and life.drain_at is None)
                samples.append(Sample(round(now, 3), metric, want, ready))
                await asyncio.sleep(policy.polling_s)

        async def load(session: aiohttp.ClientSession) -> None:
            tasks: list[asyncio.Task[None]] = []
            index = 0
            for ph in cfg.phases:
                end = time.monotonic() + ph.seconds
                phase_starts.append(time.monotonic() - t0)
                log.info("t=%5.1fs  phase %s", time.monotonic() - t0, ph.describe())
                while time.monotonic() < end:
                    rate = ph.rate_at(ph.seconds - (end - time.monotonic()))
                    if rate > 0:
                        rec = RequestRecord(index=index, stream=0, sent_at=0.0)
                        body = {
                            "model": "meta-llama/Llama-3.1-8B-Instruct",
                            "messages": [{"role": "user", "content": f"autoscale demo {index}"}],
                            "max_tokens": cfg.max_tokens,
                            "stream": True,
                            "stream_options": {"include_usage": True},
                        }
                        records.append(rec)
                        tasks.append(asyncio.create_task(stream_request(session, url, body, rec, t0, 300, headers)))
                        index += 1
                        await asyncio.sleep(1 / rate)
                    else:
                        await asyncio.sleep(min(0.5, max(0.0, end - time.monotonic())))
            await asyncio.gather(*tasks)

        async def main() -> None:
            ctl = asyncio.create_task(control())
            conn = aiohttp.TCPConnector(limit=0)
            async with aiohttp.ClientSession(connector=conn) as session:
                await load(session)
            # Idle: the controller goes on until the pool is back at its minimum and every drained
            # worker has exited (at most the time the policy needs from the maximum, plus a margin).
            bound = time.monotonic() + policy.down_stabilization_s + policy.max_replicas * policy.down_period_s + 10
            log.info("t=%5.1fs  load done: idle until the minimum is back", time.monotonic() - t0)
            while time.monotonic() < bound:
                active = [w for w in workers if w[0].drain_at is None]
                if len(active) <= policy.min_replicas and all(
                    w[0].exited_at is not None for w in workers if w[0].drain_at
                ):
                    break
                await asyncio.sleep(policy.polling_s)
            stop.set()
            await ctl

        await main()
        duration = time.monotonic() - t0
    finally:
        if prom is not None:
            prom.stop()
        stack.close()
    return analyse(cfg, policy, samples, [w[0] for w in workers], records, phase_starts, duration, command)


async def _in_flight(proc: Any) -> float:
    """The worker's attempts in flight, from its own metrics (0 when it does not answer), without
    holding up the control loop as a blocking scrape would."""
    from llmlab_common.metrics import parse_prometheus_text
    from llmlab_testkit.procs import url

    try:
        async with (
            aiohttp.ClientSession() as s,
            s.get(url(proc) + "/metrics", timeout=aiohttp.ClientTimeout(total=2)) as r,
        ):
            text = await r.text()
    except (aiohttp.ClientError, TimeoutError) as exc:
        log.warning("in-flight count of %s unavailable: %s", proc.name, exc)
        return 0.0
    return parse_prometheus_text(text).get("llmlab_worker_in_flight_requests", 0.0)


async def _ready(proc: Any) -> bool:
    try:
        async with aiohttp.ClientSession() as s, s.get(proc.ready_url, timeout=aiohttp.ClientTimeout(total=1)) as r:
            return r.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False


def analyse(
    cfg: DemoConfig,
    policy: Policy,
    samples: list[Sample],
    workers: list[WorkerLife],
    records: list[Any],
    phase_starts: list[float],
    duration: float,
    command: str,
) -> dict[str, Any]:
    from llmlab_loadtest.sse_client import distribution_ms

    burst_start = phase_starts[1]
    ok = [r for r in records if r.ok and r.output_tokens == cfg.max_tokens]
    failed = [r for r in records if not r.ok]
    cut = [r for r in records if r.ok and r.output_tokens != cfg.max_tokens]
    peak = max(s.desired for s in samples)
    first_up = next((s.t for s in samples if s.desired > policy.min_replicas), None)
    peak_ready = next((s.t for s in samples if s.ready >= peak), None)
    drained = [w for w in workers if w.drain_at is not None]
    phases_at = []
    for i, (ph, at) in enumerate(zip(cfg.phases, phase_starts, strict=True)):
        until = phase_starts[i + 1] if i + 1 < len(phase_starts) else math.inf
        inside = [x.desired for x in samples if at <= x.t < until]
        phases_at.append(
            {
                "name": ph.name,
                "start_s": round(at, 1),
                "seconds": ph.seconds,
                "rate": ph.rate,
                "rate_end": ph.rate_end,
                # The workers the controller wanted as the phase began, and the most during it.
                "workers_at_start": inside[0] if inside else None,
                "workers_max": max(inside) if inside else None,
            }
        )
    final = samples[-1].desired if samples else None
    doc = {
        "label": "SIMULATED (engine simulator; the control loop is real, the GPUs are not)",
        "policy": asdict(policy),
        "time_scale": cfg.time_scale,
        "worker_slots": cfg.slots,
        "phases": phases_at,
        "summary": {
            "requests": len(records),
            "ok_full_length": len(ok),
            "failed": len(failed),
            "cut_short": len(cut),
            "failed_errors": sorted({f"{r.error_kind}: {(r.error or '')[:120]}" for r in failed})[:10],
            "replicas_min_max_final": [policy.min_replicas, peak, final],
            "first_scale_up_after_burst_s": None if first_up is None else round(first_up - burst_start, 2),
            "peak_ready_after_burst_s": None if peak_ready is None else round(peak_ready - burst_start, 2),
            "worker_start_to_ready_s": distribution_ms(
                [w.ready_at - w.started_at for w in workers if w.ready_at is not None]
            ),
            "workers_started": len(workers),
            "drained_workers": len(drained),
            # -15: uvicorn re-raises the SIGTERM once the drain is done (llmlab_common.runtime); -9 a kill.
            "drained_exit_codes": sorted({w.exit_code for w in drained if w.exit_code is not None}),
            "drained_with_streams": sum(1 for w in drained if w.streams_at_drain),
            "drained_not_exited": sum(1 for w in drained if w.exited_at is None),
            "ttft_ms": distribution_ms([r.ttft for r in ok if r.ttft is not None]),
            "max_metric": max((s.metric for s in samples if s.metric is not None), default=None),
        },
        "samples": [asdict(s) for s in samples],
        "workers": [asdict(w) for w in workers],
        "requests": [
            {"sent_at": round(r.sent_at, 3), "ttft_s": r.ttft, "ok": r.ok, "tokens": r.output_tokens} for r in records
        ],
        "meta": metadata_block(
            started=dt.datetime.now(dt.UTC) - dt.timedelta(seconds=duration),
            duration_s=duration,
            engine="one llmlab engine simulator (vLLM flavour) per worker-vllm process, behind gateway -> NATS",
            model_id="meta-llama/Llama-3.1-8B-Instruct (served name only)",
            concurrency="open loop: " + ", ".join(p.describe() for p in cfg.phases),
            warmup=f"the first phase ({cfg.phases[0].name})",
            prompt_dataset="one short chat message per request",
            input_length_distribution="~10 tokens",
            output_length_distribution=f"exactly {cfg.max_tokens} tokens (simulator)",
            sampling_parameters={"max_tokens": cfg.max_tokens, "ttft_ms": cfg.ttft_ms, "itl_ms": cfg.itl_ms},
            command=command,
        ),
    }
    return doc


def markdown(doc: dict[str, Any]) -> str:
    s, p = doc["summary"], doc["policy"]
    start_ready, ttft = s["worker_start_to_ready_s"], s["ttft_ms"]
    rows = [
        ("requests", f"{s['requests']} ({s['ok_full_length']} complete, {s['failed']} failed, {s['cut_short']} cut)"),
        ("workers min / peak / final", " / ".join(map(str, s["replicas_min_max_final"]))),
        ("first scale-up after the burst began", f"{s['first_scale_up_after_burst_s']} s"),
        ("all peak workers ready after the burst began", f"{s['peak_ready_after_burst_s']} s"),
        ("worker start to ready (p50 / p95)", f"{start_ready['p50']} / {start_ready['p95']} ms"),
        (
            "workers started / drained / exit codes / not exited",
            f"{s['workers_started']} / {s['drained_workers']} / {s['drained_exit_codes']} / {s['drained_not_exited']}",
        ),
        ("TTFT p50 / p95 / p99", f"{ttft['p50']} / {ttft['p95']} / {ttft['p99']} ms"),
        ("highest backlog (queued + running)", str(s["max_metric"])),
    ]
    lines = [
        "# Autoscaling demo: the KEDA policy of infra/k8s, run for real against the simulator",
        "",
        f"**{doc['label']}.** A controller read `{p['query']}` from Prometheus every",
        f"{p['polling_s']:.2f} s and set the worker count as the HPA would: target {p['threshold']:g} per",
        f"worker (384/512 of its {doc['worker_slots']} slots); min {p['min_replicas']}, max {p['max_replicas']};",
        f"up at most {p['up_pods']} per {p['up_period_s']:.1f} s; down after {p['down_stabilization_s']:.1f} s",
        f"of stabilisation, {p['down_pods']} per {p['down_period_s']:.1f} s (the manifest's times x",
        f"{doc['time_scale']}). Workers leave by draining (SIGTERM).",
        "",
        "| figure | value |",
        "| --- | --- |",
        *(f"| {k} | {v} |" for k, v in rows),
        "",
        "| phase | starts at | requests/s | workers wanted as it began | most wanted during it |",
        "| --- | --- | --- | --- | --- |",
        *(
            f"| {ph['name']} | {ph['start_s']} s | {ph['rate']}"
            + (f" -> {ph['rate_end']}" if ph.get("rate_end") is not None else "")
            + f" for {ph['seconds']:g} s | {ph.get('workers_at_start')} | {ph.get('workers_max')} |"
            for ph in doc["phases"]
        ),
        "",
        "What a GPU pod adds is not here: minutes of model download and load before it is ready (a",
        "simulator worker is ready in about a second), which the scale-up limit of 2 pods a minute is for.",
        "",
        "![backlog, workers and TTFT](result.png)",
        "",
    ]
    return "\n".join(lines + metadata_section(doc["meta"]))


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sm = doc["samples"]
    t = [x["t"] for x in sm]
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    a1.plot(t, [x["metric"] if x["metric"] is not None else float("nan") for x in sm], label="backlog (Prometheus)")
    a1.axhline(doc["policy"]["threshold"], color="grey", ls=":", label="target per worker")
    a1b = a1.twinx()
    a1b.step(t, [x["desired"] for x in sm], where="post", color="tab:red", label="workers (desired)")
    a1b.step(t, [x["ready"] for x in sm], where="post", color="tab:green", ls="--", label="workers ready")
    a1.set_ylabel("requests queued + running")
    a1b.set_ylabel("workers")
    h1, l1 = a1.get_legend_handles_labels()
    h2, l2 = a1b.get_legend_handles_labels()
    a1.legend(h1 + h2, l1 + l2, loc="upper right")
    for ph in doc["phases"]:
        a1.axvline(ph["start_s"], color="k", lw=0.5)
        a1.text(ph["start_s"], a1.get_ylim()[1] * 0.95, ph["name"], fontsize=8)
    rq = [r for r in doc["requests"] if r["ttft_s"] is not None]
    a2.scatter([r["sent_at"] for r in rq], [r["ttft_s"] * 1000 for r in rq], s=6)
    a2.set_ylabel("TTFT (ms)")
    a2.set_xlabel("seconds since start")
    fig.suptitle("Autoscaling on queue depth (simulated engines, real control loop)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m llmlab_lab.autoscale", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the CI-sized run (about 50 s)")
    ap.add_argument("--out", type=Path, default=REPO / "results")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per readiness poll otherwise
    cfg = QUICK if a.quick else FULL
    command = "python -m llmlab_lab.autoscale" + (" --quick" if a.quick else "")
    started = dt.datetime.now(dt.UTC)
    doc = asyncio.run(run_demo(cfg, command))
    paths = write_outputs(doc, a.out, started, "autoscale", markdown, plot)
    log.info("%s", json.dumps(doc["summary"], indent=1))
    log.info("wrote %s", paths["md"])
    s = doc["summary"]
    good = s["failed"] == 0 and s["cut_short"] == 0 and s["replicas_min_max_final"][1] > 1
    good = good and s["replicas_min_max_final"][2] == doc["policy"]["min_replicas"] and s["drained_not_exited"] == 0
    good = good and set(s["drained_exit_codes"]) <= {0, -15}
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
