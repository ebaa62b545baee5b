"""The twin's replay command line: virtual time through N twins, real time against any
OpenAI-compatible endpoint, and the replay-speed and real-time-lag measurements.

Virtual (every figure is **simulated**)::

    python -m llmlab_lab.twin_replay virtual --trace t.jsonl --model Llama-3.1-8B \\
        --device H100-SXM --workers 2 --dispatch least-loaded --out results/twin-replay

Real time (measured; the same trace's arrival times, streamed chat completions over aiohttp,
SSE parsing from :mod:`llmlab_loadtest.sse_client`)::

    python -m llmlab_lab.twin_replay realtime --trace t.jsonl --base-url http://127.0.0.1:8001/v1 \\
        --model meta-llama/Llama-3.1-8B-Instruct --api-key sk-... --out results/replay-rt

The replay itself (and its summary) is the twin library's :mod:`llmlab_twin.replay`.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import numpy as np
import psutil
from llmlab_common import rules
from llmlab_loadtest import bench_meta
from llmlab_loadtest import sse_client as sc
from llmlab_twin import trace as tracemod
from llmlab_twin.replay import (
    PICKERS,
    Slo,
    build_setup,
    cost_model_for,
    load_slo_classes,
    markdown,
    quantiles,
    records,
    replay_trace,
)
from llmlab_twin.sched import make_cost_model
from llmlab_twin.trace import Trace, TraceRequest

log = logging.getLogger(__name__)


_WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet")


def prompt_text(r: TraceRequest) -> str:
    """A prompt of about ``prompt_tokens`` words: the group's shared prefix first (identical for
    every request of the group), then words unique to the request."""
    parts: list[str] = []
    shared = min(r.prefix_tokens, r.prompt_tokens) if r.prefix_group else 0
    if shared:
        g = r.prefix_group
        parts.extend(f"{g}-{_WORDS[i % 10]}{i}" for i in range(shared))
    parts.extend(f"{r.id}-{_WORDS[i % 10]}" for i in range(max(1, r.prompt_tokens - shared)))
    return " ".join(parts)


async def run_realtime(
    trace: Trace,
    *,
    base_url: str,
    model: str,
    api_key: str | None = None,
    ignore_eos: bool = True,
    time_scale: float = 1.0,
    timeout_s: float = 600.0,
    max_requests: int | None = None,
) -> tuple[list[dict[str, Any]], float, Any]:
    """Send every request at its arrival time (x ``time_scale``); returns per-request records,
    the wall time, and the client's CPU usage."""
    url = base_url.rstrip("/") + "/chat/completions"
    headers = {"content-type": "application/json"}
    if api_key:
        headers["authorization"] = f"Bearer {api_key}"
    reqs = trace.requests[:max_requests] if max_requests else trace.requests
    out: list[dict[str, Any]] = []

    async def one(session: aiohttp.ClientSession, r: TraceRequest, t_run0: float) -> None:
        delay = t_run0 + r.t * time_scale - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        body: dict[str, Any] = {
            "model": model,
            "messages": [{"role": "user", "content": prompt_text(r)}],
            "max_tokens": r.output_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            "priority": r.priority,
        }
        if ignore_eos:
            body["ignore_eos"] = True
        rec = sc.RequestRecord(index=len(out), stream=0, sent_at=0.0)
        await sc.stream_request(session, url, body, rec, t_run0, timeout_s, headers)
        out.append(
            {
                "id": r.id,
                "tenant": r.tenant,
                "priority": r.priority,
                "slo_class": r.slo_class,
                "intended_at": round(r.t * time_scale, 6),
                "sent_at": round(rec.sent_at, 6),
                "ok": rec.ok,
                "status": rec.status,
                "error_kind": rec.error_kind,
                "ttft_s": rec.ttft,
                "tpot_s": rec.tpot(),
                "e2e_s": rec.e2e,
                "itls_s": [round(x, 6) for x in rec.itls()],
                "prompt_tokens": (rec.usage or {}).get("prompt_tokens"),
                "output_tokens": rec.output_tokens,
            }
        )

    conn = aiohttp.TCPConnector(limit=0)
    w0 = time.perf_counter()
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=None)) as session:
        t_run0 = time.perf_counter()
        await asyncio.gather(*(one(session, r, t_run0) for r in reqs))
    return out, time.perf_counter() - w0, sc.client_usage()


def summarize_realtime(rows: Sequence[dict[str, Any]], wall_s: float, slo: dict[str, Slo]) -> dict[str, Any]:
    def arr(key: str) -> np.ndarray:
        return np.asarray([r[key] for r in rows if r.get(key) is not None and r["ok"]], dtype=float)

    itls = np.asarray([x for r in rows if r["ok"] for x in r["itls_s"]], dtype=float)
    met_by: dict[str, list[int]] = {}
    met = 0
    for r in rows:
        lim = slo.get(r["slo_class"])
        ok = bool(r["ok"])
        if lim is not None:  # the client sees no queue apart from TTFT: queue_s is not judged
            ok = rules.slo_verdict(lim, answered=ok, ttft_s=r["ttft_s"], tpot_s=r["tpot_s"], e2e_s=r["e2e_s"]).met
        m = met_by.setdefault(r["slo_class"], [0, 0])
        m[1] += 1
        if ok:
            m[0] += 1
            met += 1
    out_tokens = sum(r["output_tokens"] or 0 for r in rows if r["ok"])
    return {
        "simulated": False,
        "requests": len(rows),
        "ok": sum(1 for r in rows if r["ok"]),
        "errors": {
            k: sum(1 for r in rows if r["error_kind"] == k) for k in ("timeout", "http", "connection", "stream")
        },
        "wall_s": round(wall_s, 3),
        "goodput_rps": round(met / wall_s, 6) if wall_s else None,
        "slo_attainment": round(met / len(rows), 6) if rows else None,
        "slo_attainment_by_class": {
            k: {"met": v[0], "total": v[1], "attainment": round(v[0] / v[1], 6)} for k, v in sorted(met_by.items())
        },
        "ttft_s": quantiles(arr("ttft_s")),
        "tpot_s": quantiles(arr("tpot_s")),
        "e2e_s": quantiles(arr("e2e_s")),
        "itl_s": quantiles(itls),
        "send_lag_s": quantiles(np.asarray([r["sent_at"] - r["intended_at"] for r in rows], dtype=float)),
        "output_tokens_per_s": round(out_tokens / wall_s, 3) if wall_s else None,
    }


# -- CLI -----------------------------------------------------------------------------------------------------


def _write(out: str | None, summary: dict[str, Any], md: str, rows: list[dict[str, Any]] | None) -> None:
    if not out:
        sys.stdout.write(md)
        return
    base = Path(out)
    base.parent.mkdir(parents=True, exist_ok=True)
    Path(str(base) + ".json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    Path(str(base) + ".md").write_text(md)
    if rows is not None:
        with open(str(base) + ".requests.jsonl", "w") as f:
            for row in rows:
                f.write(json.dumps(row, separators=(",", ":")) + "\n")
    sys.stdout.write(md)
    sys.stdout.write(f"\nwrote {base}.json, {base}.md" + (f", {base}.requests.jsonl\n" if rows is not None else "\n"))


def _metadata(args: argparse.Namespace, started: dt.datetime, duration: float, trace: Trace, simulated: bool) -> Any:
    p = trace.header.get("params", {})
    return bench_meta.metadata_block(
        started=started,
        duration_s=duration,
        engine="llmlab engine twin (virtual time)" if simulated else "endpoint under test",
        model_id=args.model,
        concurrency="open loop: trace arrival times",
        warmup="none (virtual time has no warm-up effects)" if simulated else "none",
        prompt_dataset=f"synthetic trace {args.trace} (seed {trace.header.get('seed')}, mix {p.get('mix')})",
        input_length_distribution=json.dumps(p.get("classes")),
        output_length_distribution=json.dumps(p.get("classes")),
        sampling_parameters="ignore_eos=true, max_tokens=trace output_tokens",
        command=" ".join([sys.executable, "-m", "llmlab_lab.twin_replay", *sys.argv[1:]]),
        simulated=simulated,
    )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m llmlab_lab.twin_replay")
    sub = p.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("virtual", help="replay through N simulated engines in virtual time")
    v.add_argument("--trace", required=True)
    v.add_argument("--model", default="Llama-3.1-8B")
    v.add_argument("--device", default="H100-SXM")
    v.add_argument("--dtype", default="bf16")
    v.add_argument("--workers", type=int, default=1)
    v.add_argument("--dispatch", default="least-loaded", choices=sorted(PICKERS))
    v.add_argument("--cost-model", default="roofline", choices=["roofline", "linear"])
    v.add_argument(
        "--engine",
        choices=["vllm", "sglang"],
        help="apply the engine's calibrated per-step overhead (hardware.yaml engines); default: the device fit",
    )
    v.add_argument("--max-num-seqs", type=int, default=256)
    v.add_argument("--max-num-batched-tokens", type=int, default=8192)
    v.add_argument("--block-size", type=int, default=16)
    v.add_argument("--num-gpu-blocks", type=int, help="default: from the KV calculator")
    v.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    v.add_argument("--no-prefix-caching", dest="prefix_caching", action="store_false")
    v.add_argument("--prefix-style", default="vllm", choices=["vllm", "sglang"])
    v.add_argument("--eviction-policy", default="lru")
    v.add_argument("--usd-per-hour", type=float, help="per worker; default: catalog/hardware.yaml")
    v.add_argument("--catalog", help="catalog with slo_classes (default configs/catalog.yaml)")
    v.add_argument("--records", action="store_true", help="also write per-request records (.requests.jsonl)")
    v.add_argument("--out", help="output path prefix (writes .json and .md)")
    r = sub.add_parser("realtime", help="replay against an OpenAI-compatible endpoint in real time")
    r.add_argument("--trace", required=True)
    r.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8001/v1")
    r.add_argument("--model", required=True)
    r.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"))
    r.add_argument("--time-scale", type=float, default=1.0, help="multiply arrival times")
    r.add_argument("--max-requests", type=int)
    r.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false")
    r.add_argument("--catalog")
    r.add_argument("--out")
    sp = sub.add_parser("speed", help="wall time of the 1-hour x 20 req/s virtual replay (results/twin-replay-speed)")
    sp.add_argument("--rate", type=float, default=20.0)
    sp.add_argument("--duration", type=float, default=3600.0)
    sp.add_argument("--workers", type=int, default=3)
    sp.add_argument("--runs", type=int, default=2)
    sp.add_argument("--out", default=str(Path("results") / "twin-replay-speed"))
    lg = sub.add_parser(
        "lag", help="real-time twin server: intended vs actual token emission (results/twin-realtime-lag)"
    )
    lg.add_argument("--streams", type=int, default=1000)
    lg.add_argument("--step-ms", type=float, default=50.0)
    lg.add_argument("--max-tokens", type=int, default=256)
    lg.add_argument("--runs", type=int, default=2)
    lg.add_argument("--out", default=str(Path("results") / "twin-realtime-lag"))
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.cmd == "speed":
        return _speed(args)
    if args.cmd == "lag":
        return _lag(args)
    trace = tracemod.load(args.trace)
    slo = load_slo_classes(args.catalog)
    started = dt.datetime.now(dt.UTC)
    if args.cmd == "virtual":
        setup = build_setup(
            model=args.model,
            device=args.device,
            dtype=args.dtype,
            workers=args.workers,
            dispatch=args.dispatch,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            block_size=args.block_size,
            num_gpu_blocks=args.num_gpu_blocks,
            gpu_memory_utilization=args.gpu_memory_utilization,
            prefix_caching=args.prefix_caching,
            prefix_style=args.prefix_style,
            eviction_policy=args.eviction_policy,
            usd_per_hour=args.usd_per_hour,
        )
        cost = cost_model_for(args.cost_model, args.model, args.device, args.dtype, args.engine)
        summary, seqs, wall = replay_trace(trace, setup, cost, slo=slo)
        summary["metadata"] = _metadata(args, started, wall, trace, simulated=True)
        _write(args.out, summary, markdown(summary), records(seqs) if args.records else None)
        return 0
    rows, wall, usage = asyncio.run(
        run_realtime(
            trace,
            base_url=args.base_url,
            model=args.model,
            api_key=args.api_key,
            ignore_eos=args.ignore_eos,
            time_scale=args.time_scale,
            max_requests=args.max_requests,
        )
    )
    summary = summarize_realtime(rows, wall, slo)
    summary["client"] = {"cpu_s": usage.cpu_s, "max_rss_mb": usage.max_rss_mb, "cpu_util": usage.cpu_s / wall}
    summary["trace"] = trace.header
    summary["metadata"] = _metadata(args, started, wall, trace, simulated=False)
    md = [
        "# Real-time trace replay (measured, not simulated)",
        "",
        f"{summary['ok']}/{summary['requests']} ok, goodput {summary['goodput_rps']} req/s, "
        f"SLO attainment {summary['slo_attainment']}, TTFT p95 {summary['ttft_s']['p95']} s, "
        f"ITL p95 {summary['itl_s']['p95']} s, client CPU {summary['client']['cpu_util']:.2f} cores",
        "",
    ]
    _write(args.out, summary, "\n".join(md), rows)
    return 0


def _speed(args: argparse.Namespace) -> int:
    """Generate the seeded 1-hour trace, replay it ``--runs`` times, report wall time and spread."""
    started = dt.datetime.now(dt.UTC)
    trace = tracemod.generate(rate=args.rate, duration=args.duration, seed=1, shared_share=0.3)
    setup = build_setup(model="Llama-3.1-8B", device="H100-SXM", workers=args.workers)
    cost = make_cost_model("Llama-3.1-8B", "H100-SXM")
    runs = []
    summary: dict[str, Any] = {}
    for _ in range(args.runs):
        summary, _, wall = replay_trace(trace, setup, cost)
        runs.append(round(wall, 3))
    info = tracemod.describe(trace)
    out = {
        "simulated": True,
        "what": "wall time of a virtual-time replay (the figures inside are simulated)",
        "requests": info["requests"],
        "prompt_tokens": info["prompt_tokens"],
        "output_tokens": info["output_tokens"],
        "steps": summary["steps"],
        "workers": args.workers,
        "wall_s_runs": runs,
        "wall_s_spread": round(max(runs) - min(runs), 3),
        "target_wall_s": 60,
        "meets_target": max(runs) < 60,
        "steps_per_s": round(summary["steps"] / min(runs), 1),
        "simulated_summary": {
            k: summary[k]
            for k in (
                "goodput_rps",
                "slo_attainment",
                "ttft_s",
                "itl_s",
                "prefix_cache_hit_rate",
                "preemptions",
                "cost_per_1m_tokens_usd",
                "gpu_busy_fraction",
            )
        },
        "metadata": bench_meta.metadata_block(
            started=started,
            duration_s=sum(runs),
            engine="llmlab engine twin (virtual time)",
            model_id="Llama-3.1-8B on H100-SXM (roofline cost model)",
            concurrency="open loop, trace arrivals (poisson 20 req/s)",
            warmup="none: the two runs are reported apart",
            prompt_dataset="synthetic: tutorial-8.3 mix, 30% shared prefixes (4 groups x 512 tokens), seed 1",
            input_length_distribution="§8.3: 50% 64-256, 30% 256-1024, 15% 4K-16K, 5% 256-1K (+512 if shared)",
            output_length_distribution="§8.3: 32-128, 128-512, 128-512, 1K-4K",
            sampling_parameters="n/a (virtual time)",
            command=" ".join(["python -m llmlab_lab.twin_replay", *sys.argv[1:]]),
            simulated=True,
        ),
    }
    Path(args.out + ".json").parent.mkdir(parents=True, exist_ok=True)
    Path(args.out + ".json").write_text(json.dumps(out, indent=2, default=str) + "\n")
    sys.stdout.write(json.dumps({k: out[k] for k in ("requests", "steps", "wall_s_runs", "meets_target")}) + "\n")
    return 0


def _lag(args: argparse.Namespace) -> int:
    """Serve the twin in real time with every step pinned to ``--step-ms``, drive ``--streams``
    concurrent streams with the SSE load client (:mod:`llmlab_loadtest.sse_client`) in its own
    process, and compare intended with actual token emission: server side (step end vs the wall
    time its tokens were pushed) and client side (chunk gaps vs the pinned step)."""
    started = dt.datetime.now(dt.UTC)
    py = sys.executable
    runs: list[dict[str, Any]] = []
    for run in range(args.runs):
        sock_port = _free_port()
        server = subprocess.Popen(
            [py, "-m", "llmlab_engine_sim", "--port", str(sock_port), "--mode", "twin", "--fixed-step-ms",
             str(args.step_ms), "--max-num-seqs", str(args.streams + 24), "--num-gpu-blocks", "200000",
             "--output-len", str(args.max_tokens), "--max-model-len", "8192"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            base = f"http://127.0.0.1:{sock_port}"
            for _ in range(300):
                try:
                    if httpx.get(base + "/health", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)
            client_out = Path(args.out + f".client-run{run + 1}.json")
            cmd = [py, "-m", "llmlab_loadtest.sse_client", "--url", base + "/v1/chat/completions",
                   "--model", "meta-llama/Llama-3.1-8B-Instruct", "--concurrency", str(args.streams),
                   "--requests-per-stream", "1", "--max-tokens", str(args.max_tokens),
                   "--out", str(client_out)]  # fmt: skip
            t0 = time.perf_counter()
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            wall = time.perf_counter() - t0
            stats = httpx.get(base + "/sim/stats", timeout=10).json()
            cpu = _proc_cpu_s(server.pid)
        finally:
            server.terminate()
            server.wait(30)
        client = json.loads(client_out.read_text())
        gaps = np.asarray([x for r in client.get("requests", []) for x in _itls(r)], dtype=float)
        dev = np.abs(gaps - args.step_ms / 1000.0) if gaps.size else gaps
        runs.append(
            {
                "server_lag_ms": stats["twin"]["lag_ms"],
                "client_itl_ms": quantiles(gaps * 1000.0),
                "client_itl_abs_deviation_ms": quantiles(dev * 1000.0),
                "ok": client.get("summary", {}).get("requests", {}).get("ok"),
                "errors": client.get("summary", {}).get("errors"),
                "client_cpu": client.get("summary", {}).get("client"),
                "server_cpu_s": cpu,
                "wall_s": round(wall, 3),
                "steps": stats["twin"]["steps"],
            }
        )
        client_out.unlink(missing_ok=True)
    p99s = [r["server_lag_ms"]["p99"] for r in runs]
    out = {
        "simulated": True,
        "what": "real-time twin server (fixed 50 ms steps) under N concurrent streams: emission lag",
        "streams": args.streams,
        "step_ms": args.step_ms,
        "max_tokens": args.max_tokens,
        "target_p99_lag_ms": 10,
        "runs": runs,
        "server_lag_p99_ms_spread": round(max(p99s) - min(p99s), 3) if all(p is not None for p in p99s) else None,
        "metadata": bench_meta.metadata_block(
            started=started,
            duration_s=sum(r["wall_s"] for r in runs),
            engine="llmlab engine-sim --mode twin --fixed-step-ms",
            model_id="meta-llama/Llama-3.1-8B-Instruct (served name only)",
            concurrency=args.streams,
            warmup="none (each run starts a fresh server)",
            prompt_dataset="llmlab_loadtest.sse_client default prompt",
            input_length_distribution="one short prompt (~15 tokens)",
            output_length_distribution=f"exactly {args.max_tokens} tokens (max_tokens, output_len)",
            sampling_parameters=f"max_tokens={args.max_tokens}",
            command=" ".join(["python -m llmlab_lab.twin_replay", *sys.argv[1:]]),
            simulated=True,
        ),
    }
    Path(args.out + ".json").parent.mkdir(parents=True, exist_ok=True)
    Path(args.out + ".json").write_text(json.dumps(out, indent=2, default=str) + "\n")
    md = [
        "# Real-time twin: emission lag (simulated engine, measured lag)",
        "",
        f"{args.streams} concurrent streams, every step pinned to {args.step_ms:g} ms, {args.max_tokens} tokens each;"
        " client: llmlab_loadtest.sse_client in its own process.",
        "",
        "| run | server lag p50 / p99 / max (ms) | client ITL p50 / p99 (ms) | ok | client CPU | server CPU s "
        "| wall s |",
        "|---|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(runs, 1):
        lag, itl = r["server_lag_ms"], r["client_itl_ms"]
        cu = (r["client_cpu"] or {}).get("cpu_util")
        md.append(
            f"| {i} | {lag['p50']:.2f} / {lag['p99']:.2f} / {lag['max']:.2f} | "
            f"{(itl['p50'] or 0) * 1:.2f} / {(itl['p99'] or 0) * 1:.2f} | {r['ok']} | {cu} | {r['server_cpu_s']} | "
            f"{r['wall_s']} |"
        )
    Path(args.out + ".md").write_text("\n".join(md) + "\n")
    sys.stdout.write("\n".join(md) + "\n")
    return 0


def _itls(rec: dict[str, Any]) -> list[float]:
    t = rec.get("chunk_times") or []
    return [t[i] - t[i - 1] for i in range(1, len(t))]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _proc_cpu_s(pid: int) -> float | None:
    try:
        t = psutil.Process(pid).cpu_times()
        return round(t.user + t.system, 3)
    except Exception:
        return None


if __name__ == "__main__":
    raise SystemExit(main())
