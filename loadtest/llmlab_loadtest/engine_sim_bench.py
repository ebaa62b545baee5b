"""Load the engine simulator with N concurrent streams and report throughput and CPU use.

    python -m llmlab_loadtest.engine_sim_bench --streams 1000 --duration 20 \
        --ramp 13 --warmup 15

By default it spawns ``python -m llmlab_engine_sim`` with ``--max-num-seqs`` = streams and the
given TTFT/ITL/output length (``--url`` targets a running simulator instead, ``--pid`` then names
its process for the CPU figure). Each of the N clients sends streamed completions back to back
(closed loop), their first requests spread over ``--ramp`` seconds; after ``--warmup`` seconds it
counts streamed tokens for ``--duration`` seconds. The ideal rate is
``streams * output_len / (ttft + (output_len - 1) * itl)`` tokens/s. It also reports the engine's
own mean TTFT/ITL over the window (from its histograms) next to the client-side TTFT.

CPU use is read from /proc (Linux): process CPU seconds over the window / wall seconds, so 100 %
is one full core. The client (aiohttp, one process) is measured too: on a small machine both
compete for the same cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

import aiohttp
from llmlab_common.metrics import parse_prometheus_text

log = logging.getLogger(__name__)
_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime + stime


@dataclass
class Tally:
    counting: bool = False
    tokens: int = 0
    requests: int = 0
    errors: int = 0
    ttfts: list[float] = field(default_factory=list)


async def client_loop(
    session: aiohttp.ClientSession, url: str, body: bytes, tally: Tally, stop: asyncio.Event, delay: float
) -> None:
    headers = {"content-type": "application/json"}
    await asyncio.sleep(delay)
    while not stop.is_set():
        t0 = time.monotonic()
        first = True
        try:
            async with session.post(url, data=body, headers=headers) as resp:
                if resp.status != 200:
                    tally.errors += 1
                    await asyncio.sleep(0.1)
                    continue
                async for data in resp.content.iter_any():
                    n = data.count(b'data: {"')
                    if n and first:
                        first = False
                        if tally.counting:
                            tally.ttfts.append(time.monotonic() - t0)
                    if tally.counting:
                        tally.tokens += n
                    if stop.is_set():
                        break
            if tally.counting:
                tally.requests += 1
        except (aiohttp.ClientError, TimeoutError):
            tally.errors += 1
            await asyncio.sleep(0.1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def wait_healthy(session: aiohttp.ClientSession, base: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            async with session.get(base + "/health") as r:
                if r.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.2)
    raise TimeoutError(f"{base} not healthy")


def spawn_simulator(args: argparse.Namespace) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    cmd = [sys.executable, "-m", "llmlab_engine_sim", "--port", str(port), "--max-num-seqs", str(args.streams)]
    cmd += ["--ttft-ms", str(args.ttft_ms), "--itl-ms", str(args.itl_ms), "--output-len", str(args.output_len)]
    cmd += ["--flavor", args.flavor, "--max-model-len", str(args.output_len + 1024)]
    proc = subprocess.Popen(cmd, env={**os.environ, "LLMLAB_LOG_LEVEL": "WARNING"})
    return proc, f"http://127.0.0.1:{port}"


async def engine_latency(session: aiohttp.ClientSession, base: str, prefix: str) -> dict[str, float]:
    """Sums and counts of the engine's own TTFT/ITL/queue-time histograms."""
    async with session.get(base + "/metrics") as r:
        values = parse_prometheus_text(await r.text())
    out: dict[str, float] = {}
    for short, name in (("ttft", "time_to_first_token_seconds"), ("itl", "inter_token_latency_seconds")):
        for part in ("sum", "count"):
            out[f"{short}_{part}"] = values.get(f"{prefix}:{name}_{part}", 0.0)
    return out


def mean_delta(before: dict[str, float], after: dict[str, float], short: str) -> float:
    n = after[f"{short}_count"] - before[f"{short}_count"]
    return (after[f"{short}_sum"] - before[f"{short}_sum"]) / n if n else float("nan")


async def run(args: argparse.Namespace, base: str, pid: int | None) -> dict[str, float]:
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, read_bufsize=1 << 16) as session:
        await wait_healthy(session, base)
        async with session.get(base + "/v1/models") as r:
            card = (await r.json())["data"][0]
        model, flavor = card["id"], card["owned_by"]
        body = json.dumps({"model": model, "prompt": "Benchmark the relay, please.", "stream": True}).encode()
        tally, stop = Tally(), asyncio.Event()
        tasks = [
            asyncio.create_task(
                client_loop(session, base + "/v1/completions", body, tally, stop, random.uniform(0, args.ramp))
            )
            for _ in range(args.streams)
        ]
        await asyncio.sleep(args.warmup)
        tally.counting = True
        lat0 = await engine_latency(session, base, flavor)
        t0 = time.monotonic()
        sim_cpu0 = cpu_seconds(pid) if pid else 0.0
        me_cpu0 = cpu_seconds(os.getpid())
        await asyncio.sleep(args.duration)
        elapsed = time.monotonic() - t0
        sim_cpu = (cpu_seconds(pid) - sim_cpu0) / elapsed if pid else float("nan")
        me_cpu = (cpu_seconds(os.getpid()) - me_cpu0) / elapsed
        tally.counting = False
        lat1 = await engine_latency(session, base, flavor)
        stop.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    ideal = args.streams * args.output_len / (args.ttft_ms / 1000 + (args.output_len - 1) * args.itl_ms / 1000)
    ttfts = sorted(tally.ttfts)
    return {
        "streams": args.streams,
        "tokens_per_s": tally.tokens / elapsed,
        "ideal_tokens_per_s": ideal,
        "requests_completed": tally.requests,
        "errors": tally.errors,
        "ttft_p50_s": ttfts[len(ttfts) // 2] if ttfts else float("nan"),
        "ttft_p99_s": ttfts[int(len(ttfts) * 0.99)] if ttfts else float("nan"),
        "engine_ttft_mean_s": mean_delta(lat0, lat1, "ttft"),
        "engine_itl_mean_s": mean_delta(lat0, lat1, "itl"),
        "sim_cpu_cores": sim_cpu,
        "client_cpu_cores": me_cpu,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", type=int, default=1000)
    p.add_argument("--duration", type=float, default=20.0)
    p.add_argument("--warmup", type=float, default=5.0, help="seconds before counting (keep it >= --ramp)")
    p.add_argument(
        "--ramp",
        type=float,
        default=0.0,
        help="spread the clients' first requests over this many seconds (about one request's duration gives "
        "steady, unsynchronised arrivals; 0: all start together and stay in lock-step)",
    )
    p.add_argument("--ttft-ms", type=float, default=100.0)
    p.add_argument("--itl-ms", type=float, default=50.0)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--flavor", choices=["vllm", "sglang"], default="vllm")
    p.add_argument("--url", help="a running simulator (default: spawn one)")
    p.add_argument("--pid", type=int, help="the running simulator's pid, for its CPU use")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    proc = None
    base, pid = args.url, args.pid
    if base is None:
        proc, base = spawn_simulator(args)
        pid = proc.pid
    try:
        result = asyncio.run(run(args, base, pid))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)
    log.info("%s", json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
