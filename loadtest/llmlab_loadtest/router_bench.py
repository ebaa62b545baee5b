"""Router benchmark: how long one routing decision takes, in-process (nothing simulated: real CPU
time of ``RouterCore.route`` on this machine).

    python -m llmlab_loadtest.router_bench                  # 2 runs x 48k decisions (~1 min on 2 shared cores)
    python -m llmlab_loadtest.router_bench --quick          # a few thousand decisions (for the test)

Part 1, **in-process** (:func:`bench_inprocess`): the catalog (``configs/catalog.yaml`` by default)
with ``--workers`` (64) synthetic workers spread over its pools, each with a heartbeat (random
running/waiting/KV use) and observed TTFT/ITL samples per deployment, so the windowed-p95 path runs.
One call = ``RouterCore.route(query)``: build the inputs (live state → views), the decision
(filters, scorers, picker), the state update (pending count, affinity table) and the decision
record; with the decision log writing JSON lines to a temp file, and without. Queries are built
beforehand (they arrive parsed); every policy of the catalog and both log modes are interleaved
call by call, so a drift of the machine hits all alike. Heartbeats are re-sent every 64 calls,
outside the timed call (as in the service, where they arrive between decisions). A warm-up apart;
the whole measurement runs ``--repeats`` (2) times and the spread is reported.
Target (issue 4): p99 <= 1 ms with 64 workers, per policy.

Part 2, **over NATS** (:func:`bench_nats`): a real router service process (``python -m
llmlab_router``, its own namespace on the local NATS) fed the same 64 workers' heartbeats over NATS;
this process asks it exactly as the gateway's ``RemoteRouter`` does (``nc.request`` on
``<ns>.router.route``, reply parsed), interleaved call by call with the same query decided
in-process here (the gateway's embedded mode). The added latency of the round trip is the
difference, per call pair. Router process CPU and this process's CPU are reported.

Writes ``results/router/<UTC ts>/result.{json,md,png}`` with the §12 metadata block.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import gc
import logging
import os
import random
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil
from llmlab_common.messages import EngineLoad, Heartbeat, RouteQuery, RouteReply
from llmlab_common.natsio import connect
from llmlab_common.settings import InfraSettings
from llmlab_common.subjects import Topology
from llmlab_routing.config import RouterCatalog, load_router_catalog
from llmlab_routing.core import RouterCore
from llmlab_routing.records import DecisionLog
from llmlab_routing.state import DeploymentStats
from llmlab_testkit.procs import drop_namespace

from llmlab_loadtest.bench_meta import metadata_block, write_outputs

log = logging.getLogger("router_bench")
TARGET_P99_MS = 1.0
LABEL = "MEASURED in-process on this CPU (no GPU, no network)"


# -- setup -----------------------------------------------------------------------------------------


def synthetic_state(core: RouterCore, workers: int, rng: random.Random, now: float) -> list[Heartbeat]:
    """``workers`` heartbeats spread over the catalog's pools, plus observed latency samples."""
    cat = core.current.catalog
    pools = sorted({d.pool for d in cat.deployments})
    hbs = []
    for i in range(workers):
        mc = 64
        running = rng.randint(0, mc)
        hbs.append(
            Heartbeat(
                worker_id=f"bench-w{i:03d}",
                pool=pools[i % len(pools)],
                engine="vllm",
                models=[],
                max_concurrency=mc,
                in_flight=running,
                ready=True,
                load=EngineLoad(running=running, waiting=rng.randint(0, 8), kv_cache_usage=round(rng.random(), 3)),
                interval_s=3600.0,  # never ages out during the run
                sent_at=time.time(),
            )
        )
    for hb in hbs:
        core.state.on_heartbeat(hb, now=now)
    for d in cat.deployments:
        st = core.state.stats.setdefault(d.id, DeploymentStats())
        for _ in range(200):
            st.ttft.add(now, rng.uniform(0.05, 0.8))
            st.itl.add(now, rng.uniform(0.005, 0.05))
            st.outcomes.append((now, rng.random() < 0.01))
    return hbs


def make_queries(n: int, policies: Sequence[str], rng: random.Random, groups: int = 32) -> list[RouteQuery]:
    """Mixed requests; one in two shares one of ``groups`` system prompts (prefix affinity at work)."""
    out = []
    for i in range(n):
        shared = rng.random() < 0.5
        key = f"g{rng.randrange(groups)}" if shared else f"u{i}"
        out.append(
            RouteQuery(
                request_id=f"b{i}",
                model="auto",
                plan=rng.choice(["free", "pro", "enterprise"]),
                prompt_tokens=rng.choice([40, 200, 800, 1500, 3000]),
                max_output_tokens=rng.choice([32, 128, 256, 512]),
                difficulty=round(rng.random(), 2),
                slo_class=rng.choice([None, "interactive", "batch"]),
                policy=policies[i % len(policies)],
                prefix_hashes=[f"{key}/{k}" for k in range(8 if shared else rng.randint(0, 8))],
            )
        )
    return out


# -- part 1: in-process --------------------------------------------------------------------------------


def _q(values: Sequence[float], q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))] if v else float("nan")


def run_inprocess_once(
    rc: RouterCatalog,
    *,
    workers: int,
    calls: int,
    warmup: int,
    seed: int,
    log_dir: Path,
    modes: Sequence[str] = ("no-log", "log"),
) -> dict[str, Any]:
    """One measurement: ``warmup`` calls, then ``calls`` timed calls, policies and log modes interleaved."""
    rng = random.Random(seed)
    core = RouterCore(rc, seed_source=lambda: rng.getrandbits(32))
    hbs = synthetic_state(core, workers, rng, time.monotonic())
    policies = sorted(rc.routing.policies)
    queries = make_queries(calls + warmup, policies, rng)
    # Without "log" no writer thread exists at all: the decision alone, no GIL shared with it.
    dlog = DecisionLog(log_dir / f"decisions-{seed}.jsonl") if "log" in modes else None
    gc.freeze()  # as the service does after start-up: set-up objects out of the collector's way
    samples: dict[tuple[str, str], list[float]] = {(p, m): [] for p in policies for m in modes}
    # On-CPU time of the call too: on a shared machine the wall-clock tail is mostly preemption.
    cpu_samples: dict[tuple[str, str], list[float]] = {k: [] for k in samples}
    errors = 0
    proc = psutil.Process()
    cpu0 = proc.cpu_times()
    w0 = time.perf_counter()
    perf, on_cpu = time.perf_counter_ns, time.thread_time_ns
    for i, q in enumerate(queries):
        if i % 64 == 0:  # fresh heartbeats (not timed): pending counts reset as in the service
            for hb in hbs:
                core.state.on_heartbeat(hb)
        mode = modes[(i // len(policies)) % len(modes)]
        core.log = dlog if mode == "log" else None
        c0, t0 = on_cpu(), perf()
        reply, _, _ = core.route(q)
        dt_ns, dc_ns = perf() - t0, on_cpu() - c0
        if reply.error is not None:
            errors += 1
        if i >= warmup:
            samples[(q.policy or "", mode)].append(dt_ns / 1e6)
            cpu_samples[(q.policy or "", mode)].append(dc_ns / 1e6)
    wall = time.perf_counter() - w0
    cpu1 = proc.cpu_times()
    if dlog is not None:
        dlog.close()
    log_bytes = sum(p.stat().st_size for p in log_dir.glob(f"decisions-{seed}.jsonl*"))
    rows = []
    for (p, m), v in samples.items():
        c = cpu_samples[(p, m)]
        rows.append(
            {
                "policy": p,
                "mode": m,
                "n": len(v),
                "p50_ms": round(_q(v, 0.50), 4),
                "p95_ms": round(_q(v, 0.95), 4),
                "p99_ms": round(_q(v, 0.99), 4),
                "max_ms": round(max(v), 4) if v else None,
                "mean_ms": round(sum(v) / len(v), 4) if v else None,
                "cpu_p50_ms": round(_q(c, 0.50), 4),
                "cpu_p99_ms": round(_q(c, 0.99), 4),
            }
        )
    return {
        "seed": seed,
        "calls_measured": sum(len(v) for v in samples.values()),
        "warmup_calls": warmup,
        "refused_replies": errors,
        "wall_s": round(wall, 3),
        "cpu_s": round((cpu1.user - cpu0.user) + (cpu1.system - cpu0.system), 3),
        "decision_log_bytes_per_record": round(log_bytes / max(1, (calls + warmup) // len(modes))),
        "rows": rows,
    }


def bench_inprocess(
    rc: RouterCatalog,
    *,
    workers: int,
    calls: int,
    warmup: int,
    repeats: int,
    seed: int,
    modes: Sequence[str] = ("no-log", "log"),
) -> dict[str, Any]:
    runs = []
    with tempfile.TemporaryDirectory(prefix="router-bench-") as tmp:
        for r in range(repeats):
            gc.collect()
            log.info("in-process run %d/%d: %d workers, %d calls (+%d warm-up)", r + 1, repeats, workers, calls, warmup)
            runs.append(
                run_inprocess_once(
                    rc, workers=workers, calls=calls, warmup=warmup, seed=seed + r, log_dir=Path(tmp), modes=modes
                )
            )
    summary = []
    for row in runs[0]["rows"]:
        key = (row["policy"], row["mode"])
        per = [next(x for x in run["rows"] if (x["policy"], x["mode"]) == key) for run in runs]
        s: dict[str, Any] = {"policy": key[0], "mode": key[1], "n_per_run": [x["n"] for x in per]}
        for k in ("p50_ms", "p95_ms", "p99_ms", "cpu_p50_ms", "cpu_p99_ms"):
            vals = [x[k] for x in per]
            s[k] = {"runs": vals, "worst": max(vals), "spread": round(max(vals) - min(vals), 4)}
        s["meets_target"] = s["p99_ms"]["worst"] <= TARGET_P99_MS
        s["meets_target_on_cpu"] = s["cpu_p99_ms"]["worst"] <= TARGET_P99_MS
        summary.append(s)
    return {
        "workers": workers,
        "deployments": [d.id for d in rc.catalog.deployments],
        "pools": sorted({d.pool for d in rc.catalog.deployments}),
        "target_p99_ms": TARGET_P99_MS,
        "runs": runs,
        "summary": summary,
        "meets_target_all": all(s["meets_target"] for s in summary),
    }


# -- part 2: gateway -> router round trip over NATS -----------------------------------------------------


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start_router(rc: RouterCatalog, nats_url: str, tmp: Path, seed: int) -> tuple[subprocess.Popen[bytes], int, str]:
    ns = f"rb{random.Random().getrandbits(32):08x}"
    port = _free_port()
    env = {
        **os.environ,
        "LLMLAB_NAMESPACE": ns,
        "LLMLAB_NATS_URL": nats_url,
        "LLMLAB_CATALOG_PATH": str(rc.source),
        "LLMLAB_LOG_LEVEL": "WARNING",
        "LLMLAB_ROUTER_PORT": str(port),
        "LLMLAB_ROUTER_DISCOVERY_GRACE_S": "0",
        "LLMLAB_ROUTER_DECISION_LOG": str(tmp / f"nats-decisions-{seed}.jsonl"),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmlab_router"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    return proc, port, ns


async def _nats_once(
    rc: RouterCatalog,
    *,
    workers: int,
    calls: int,
    warmup: int,
    seed: int,
    nats_url: str,
    proc: subprocess.Popen[bytes],
    port: int,
    ns: str,
) -> dict[str, Any]:
    import httpx

    topo = Topology(ns)
    nc = await connect(nats_url, "router-bench")
    try:
        async with httpx.AsyncClient() as h:
            for _ in range(300):
                try:
                    if (await h.get(f"http://127.0.0.1:{port}/ready", timeout=1)).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.1)
            else:
                raise RuntimeError("router service did not become ready")
        rng = random.Random(seed)
        local = RouterCore(rc, seed_source=lambda: rng.getrandbits(32))
        hbs = synthetic_state(local, workers, rng, time.monotonic())
        for hb in hbs:
            hb.interval_s = 600.0  # alive for the whole run on both sides
            local.state.on_heartbeat(hb)
            await nc.publish(topo.heartbeat_subject(hb.pool, hb.worker_id), hb.model_dump_json().encode())
        await nc.flush()
        await asyncio.sleep(0.5)  # the service has them
        queries = make_queries(calls + warmup, sorted(rc.routing.policies), rng)
        router_ps = psutil.Process(proc.pid)
        me = psutil.Process()
        rcpu0, mcpu0 = router_ps.cpu_times(), me.cpu_times()
        rtt: list[float] = []
        embedded: list[float] = []
        errors = 0
        perf = time.perf_counter_ns
        subject = topo.router_route_subject
        for i, q in enumerate(queries):
            payload = q.model_dump_json(exclude_none=True).encode()
            t0 = perf()
            msg = await nc.request(subject, payload, timeout=5)
            reply = RouteReply.model_validate_json(msg.data)
            t1 = perf()
            local.route(q)
            t2 = perf()
            errors += reply.error is not None
            if i >= warmup:
                rtt.append((t1 - t0) / 1e6)
                embedded.append((t2 - t1) / 1e6)
        rcpu1, mcpu1 = router_ps.cpu_times(), me.cpu_times()
    finally:
        js = nc.jetstream()
        for stream in (topo.requests_stream, topo.events_stream):
            with contextlib.suppress(Exception):
                await js.delete_stream(stream)
        await nc.close()
    added = [a - b for a, b in zip(rtt, embedded, strict=True)]

    def stats(v: list[float]) -> dict[str, float]:
        return {f"p{int(k * 100)}_ms": round(_q(v, k), 4) for k in (0.5, 0.95, 0.99)}

    return {
        "seed": seed,
        "calls_measured": len(rtt),
        "warmup_calls": warmup,
        "refused_replies": errors,
        "round_trip": stats(rtt),
        "embedded": stats(embedded),
        "added_by_nats": stats(added),
        "router_cpu_s": round((rcpu1.user - rcpu0.user) + (rcpu1.system - rcpu0.system), 3),
        "client_cpu_s": round((mcpu1.user - mcpu0.user) + (mcpu1.system - mcpu0.system), 3),
    }


def bench_nats(
    rc: RouterCatalog, *, workers: int, calls: int, warmup: int, repeats: int, seed: int, nats_url: str
) -> dict[str, Any]:
    runs = []
    with tempfile.TemporaryDirectory(prefix="router-bench-nats-") as tmp:
        for r in range(repeats):
            log.info("NATS run %d/%d: %d sequential round trips (+%d warm-up)", r + 1, repeats, calls, warmup)
            proc, port, ns = _start_router(rc, nats_url, Path(tmp), seed + r)
            try:
                runs.append(
                    asyncio.run(
                        _nats_once(
                            rc,
                            workers=workers,
                            calls=calls,
                            warmup=warmup,
                            seed=seed + r,
                            nats_url=nats_url,
                            proc=proc,
                            port=port,
                            ns=ns,
                        )
                    )
                )
            finally:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                # The router service made its dead-letter stream: no run leaves it on the shared server.
                drop_namespace(ns, nats_url, InfraSettings().redis_url)
    summary = {}
    for part in ("round_trip", "embedded", "added_by_nats"):
        summary[part] = {
            k: {"runs": [run[part][k] for run in runs], "worst": max(run[part][k] for run in runs)}
            for k in runs[0][part]
        }
    return {"workers": workers, "concurrency": 1, "runs": runs, "summary": summary}


# -- output ------------------------------------------------------------------------------------------


def render_markdown(doc: dict[str, Any]) -> str:
    meta, ip = doc["meta"], doc["inprocess"]
    lines = [
        f"# Router decision latency — {LABEL}",
        "",
        f"`{meta['command_line']}` — {meta['date']}, commit {meta['git_commit'][:10]}"
        f"{' (dirty tree)' if meta['git_dirty'] else ''}, {meta['cpu']}",
        "",
        f"## In-process: `RouterCore.route`, {ip['workers']} workers over {len(ip['pools'])} pools, "
        f"{len(ip['deployments'])} deployments",
        "",
        f"Target: p99 <= {ip['target_p99_ms']} ms per policy. {len(ip['runs'])} runs; "
        "each cell: worst run (spread between runs), milliseconds.",
        "",
        "| policy | decision log | p50 | p95 | p99 | p99 per run | target (wall p99) | on-CPU p50 | on-CPU p99 |",
        "|---|---|---:|---:|---:|---|---|---:|---:|",
    ]
    for s in ip["summary"]:
        cells = [f"{s[k]['worst']:.3f} ({s[k]['spread']:.3f})" for k in ("p50_ms", "p95_ms", "p99_ms")]
        cpu = [f"{s[k]['worst']:.3f} ({s[k]['spread']:.3f})" for k in ("cpu_p50_ms", "cpu_p99_ms")]
        lines.append(
            f"| {s['policy']} | {s['mode']} | "
            + " | ".join(cells)
            + " | "
            + ", ".join(f"{x:.3f}" for x in s["p99_ms"]["runs"])
            + f" | {'MET' if s['meets_target'] else 'MISS'} | "
            + " | ".join(cpu)
            + " |"
        )
    lines += [
        "",
        "| run | calls measured | wall s | CPU s (this process) | decision-log bytes/record |",
        "|---|---:|---:|---:|---:|",
    ]
    for i, r in enumerate(ip["runs"], 1):
        lines.append(
            f"| {i} | {r['calls_measured']} | {r['wall_s']} | {r['cpu_s']} | {r['decision_log_bytes_per_record']} |"
        )
    lines += [
        "",
        "One call = inputs from live state + decision + state update + decision record (+ one JSON line "
        "queued for the log's writer thread when the log is on; the JSON encoding and the write happen "
        "off the decision path). Heartbeats (re-sent every 64 calls) and "
        "query parsing are outside the timed call. Single-threaded; the load generator is this same "
        "process (its CPU time is the table's CPU s). The machine is shared (loadavg in the metadata): "
        "wall-clock time includes preemption by other processes; on-CPU time (thread CPU clock) does not.",
    ]
    nb = doc.get("nats")
    if nb:
        lines += [
            "",
            f"## Gateway → router round trip over NATS ({nb['workers']} workers, sequential calls)",
            "",
            "Each call pair: the query sent to a router service process over the local NATS and its reply "
            "parsed (service mode), then the same query decided in this process (embedded mode). "
            "Milliseconds, worst run (each run's value).",
            "",
            "| | p50 | p95 | p99 |",
            "|---|---:|---:|---:|",
        ]
        for part, label in (
            ("round_trip", "service mode: request/reply over NATS"),
            ("embedded", "embedded mode: in-process decision"),
            ("added_by_nats", "added by the round trip (pairwise difference)"),
        ):
            row = nb["summary"][part]
            cells = [
                f"{row[k]['worst']:.3f} ({', '.join(f'{x:.3f}' for x in row[k]['runs'])})"
                for k in ("p50_ms", "p95_ms", "p99_ms")
            ]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines += [
            "",
            "| run | calls | router process CPU s | client CPU s | refused |",
            "|---|---:|---:|---:|---:|",
        ]
        for i, r in enumerate(nb["runs"], 1):
            lines.append(
                f"| {i} | {r['calls_measured']} | {r['router_cpu_s']} | {r['client_cpu_s']} | {r['refused_replies']} |"
            )
    return "\n".join(lines) + "\n"


def render_plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ip = doc["inprocess"]
    policies = sorted({s["policy"] for s in ip["summary"]})
    modes = [m for m in ("no-log", "log") if any(s["mode"] == m for s in ip["summary"])]
    fig, axes = plt.subplots(1, len(modes), figsize=(6.5 * len(modes), 4.5), sharey=True, squeeze=False)
    for ax, mode in zip(axes[0], modes, strict=True):
        rows = {s["policy"]: s for s in ip["summary"] if s["mode"] == mode}
        x = range(len(policies))
        for off, k in ((-0.25, "p50_ms"), (0.0, "p95_ms"), (0.25, "p99_ms")):
            ax.bar([i + off for i in x], [rows[p][k]["worst"] for p in policies], width=0.25, label=k[:-3])
        ax.axhline(ip["target_p99_ms"], color="red", linestyle="--", label="p99 target")
        ax.set_xticks(list(x), policies, rotation=30)
        ax.set_title(f"decision log: {mode}")
        ax.set_ylabel("ms per RouterCore.route (worst of runs)")
        ax.legend(fontsize=8)
    fig.suptitle(f"Router decision latency, {ip['workers']} workers — {LABEL}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--catalog", default=str(InfraSettings().catalog_path))
    p.add_argument("--workers", type=int, default=64)
    p.add_argument("--calls", type=int, default=48_000, help="timed calls per run (all policies, both log modes)")
    p.add_argument(
        "--modes",
        default="no-log,log",
        help="decision-log modes interleaved: no-log,log (default) or no-log alone (no writer thread at all)",
    )
    p.add_argument("--warmup", type=int, default=2_000)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--nats-calls", type=int, default=3_000, help="round trips per run over NATS (0: skip part 2)")
    p.add_argument("--nats-url", default=os.environ.get("LLMLAB_NATS_URL", "nats://127.0.0.1:4222"))
    p.add_argument("--quick", action="store_true", help="1,200 calls, 1 run, 200 round trips (for the test)")
    p.add_argument("--out", type=Path, default=Path("results"))
    a = p.parse_args(argv)
    if a.quick:
        a.calls, a.warmup, a.repeats, a.nats_calls = 1_200, 120, 1, 200
    return a


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("llmlab_routing").setLevel(logging.WARNING)  # no per-decision log line
    args = parse_args(argv)
    # As the router service runs (llmlab_router.__main__): a short GIL switch interval, so a
    # decision waits at most that long for the decision log's writer thread.
    from llmlab_router.settings import RouterSettings

    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(RouterSettings().gil_switch_interval_s)
    command = "python -m llmlab_loadtest.router_bench " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])
    )
    started = dt.datetime.now(dt.UTC)
    t0 = time.monotonic()
    load0 = os.getloadavg()
    rc = load_router_catalog(args.catalog)
    inprocess = bench_inprocess(
        rc,
        workers=args.workers,
        calls=args.calls,
        warmup=args.warmup,
        repeats=args.repeats,
        seed=args.seed,
        modes=tuple(m.strip() for m in args.modes.split(",") if m.strip()),
    )
    meta = metadata_block(
        started=started,
        duration_s=time.monotonic() - t0,
        engine="n/a (router decision only; no engine involved)",
        model_id="n/a (catalog deployments: " + ", ".join(inprocess["deployments"]) + ")",
        concurrency="1 (single-threaded calls back to back)",
        warmup=f"{args.warmup} calls per run, not measured",
        prompt_dataset="synthetic RouteQuery set (router_bench.make_queries; sizes only, no prompts)",
        input_length_distribution="prompt_tokens uniform over {40, 200, 800, 1500, 3000}",
        output_length_distribution="max_output_tokens uniform over {32, 128, 256, 512}",
        sampling_parameters="n/a",
        command=command,
        simulated=False,
        gpu="none (not needed: CPU-only measurement)",
        catalog=args.catalog,
        catalog_version=rc.version,
        loadavg_before=[round(x, 2) for x in load0],
        gil_switch_interval_s=RouterSettings().gil_switch_interval_s,
        loadavg_after=[round(x, 2) for x in os.getloadavg()],
    )
    doc: dict[str, Any] = {"meta": meta, "inprocess": inprocess}
    if args.nats_calls > 0:
        doc["nats"] = bench_nats(
            rc,
            workers=args.workers,
            calls=args.nats_calls,
            warmup=max(50, args.nats_calls // 10),
            repeats=args.repeats,
            seed=args.seed,
            nats_url=args.nats_url,
        )
        for part, row in doc["nats"]["summary"].items():
            log.info("NATS %-14s p50 %.3f p99 %.3f ms", part, row["p50_ms"]["worst"], row["p99_ms"]["worst"])
    paths = write_outputs(doc, args.out, started, "router", render_markdown, render_plot)
    for s in inprocess["summary"]:
        log.info(
            "%-16s %-6s p50 %.3f p95 %.3f p99 %.3f ms (spread %.3f) %s; on-CPU p50 %.3f p99 %.3f",
            s["policy"],
            s["mode"],
            s["p50_ms"]["worst"],
            s["p95_ms"]["worst"],
            s["p99_ms"]["worst"],
            s["p99_ms"]["spread"],
            "MET" if s["meets_target"] else "MISS",
            s["cpu_p50_ms"]["worst"],
            s["cpu_p99_ms"]["worst"],
        )
    log.info("wrote %s", ", ".join(str(p) for p in paths.values()))
    sys.setswitchinterval(switch_interval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
