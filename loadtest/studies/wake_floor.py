"""What a hop costs when the process at its other end was idle: the latency of one NATS
request/reply (a responder in another process, as the budget and router services answer the
gateway) and of one Redis script call (as the budget service reserves), back to back and after
idle gaps of 1-50 ms, as a lone request meets them: between two requests of one stream at a GPU's
pace every process of the stack sleeps in epoll for milliseconds.

    python loadtest/studies/wake_floor.py [--n 300] [--out results]

Run it on an idle host: it measures the host (a virtual CPU woken from its idle state, cold
caches), not the code. The responder is a plain nats-py callback, the script a one-line Lua
INCR, both on uvloop as the services run, so the figures are the floor under each hop of the
stack's unloaded TTFT path (issue 34's added TTFT p50)."""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import multiprocessing as mp
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import nats
import uvloop
from llmlab_loadtest.bench_meta import metadata_block, metadata_section, write_outputs
from redis.asyncio import Redis

GAPS_MS = (0.0, 1.0, 5.0, 20.0, 50.0)
SUBJECT = "llmlab.study.wake_floor"
PAYLOAD = b"x" * 300  # about a reserve request's size


def _responder(url: str, ready: Any) -> None:
    async def main() -> None:
        nc = await nats.connect(url)

        async def echo(msg: Any) -> None:
            await msg.respond(msg.data)

        await nc.subscribe(SUBJECT, cb=echo)
        await nc.flush()
        ready.set()
        await asyncio.Event().wait()

    uvloop.run(main())


async def _timed(call: Callable[[], Awaitable[object]], gap_s: float, n: int, warm: int) -> list[float]:
    out: list[float] = []
    for i in range(n + warm):
        if gap_s > 0:
            await asyncio.sleep(gap_s)
        t = time.perf_counter()
        await call()
        if i >= warm:
            out.append((time.perf_counter() - t) * 1e3)
    return out


def _stats(ms: list[float]) -> dict[str, float]:
    ms = sorted(ms)
    return {
        "p50_ms": round(statistics.median(ms), 3),
        "p90_ms": round(ms[int(0.9 * (len(ms) - 1))], 3),
        "mean_ms": round(statistics.mean(ms), 3),
    }


async def measure(nats_url: str, redis_url: str, n: int) -> dict[str, dict[str, dict[str, float]]]:
    nc = await nats.connect(nats_url)
    redis = Redis.from_url(redis_url)
    key = f"llmlab:study:wake_floor:{time.time_ns()}"
    script = redis.register_script("return redis.call('incr', KEYS[1])")
    hops: dict[str, Callable[[], Awaitable[object]]] = {
        "nats_request_reply": lambda: nc.request(SUBJECT, PAYLOAD, timeout=2),
        "redis_script_call": lambda: script(keys=[key], args=[]),
    }
    out: dict[str, dict[str, dict[str, float]]] = {name: {} for name in hops}
    try:
        for gap in GAPS_MS:
            for name, call in hops.items():
                out[name][f"{gap:g}"] = _stats(await _timed(call, gap / 1e3, n, warm=max(10, n // 10)))
                print(f"gap {gap:g} ms {name}: {out[name][f'{gap:g}']}", file=sys.stderr)
    finally:
        await redis.delete(key)
        await redis.aclose()
        await nc.close()
    return out


def markdown(doc: dict[str, Any]) -> str:
    hops = doc["hops"]
    lines = [
        "# A hop's latency after an idle gap (NATS request/reply, Redis script call)",
        "",
        "Measured on this host, no stack: one client process, one NATS responder process, Redis. p50 / p90 in ms.",
        "",
        "| idle gap before each call (ms) | " + " | ".join(f"{h} p50 / p90" for h in hops) + " |",
        "|---:|" + "---:|" * len(hops),
    ]
    for gap in (f"{g:g}" for g in GAPS_MS):
        cells = [f"{hops[h][gap]['p50_ms']:.3f} / {hops[h][gap]['p90_ms']:.3f}" for h in hops]
        lines.append(f"| {gap} | " + " | ".join(cells) + " |")
    lines += ["", *metadata_section(doc["metadata"])]
    return "\n".join(lines)


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for name, by_gap in doc["hops"].items():
        gaps = [float(g) for g in by_gap]
        ax.plot(gaps, [v["p50_ms"] for v in by_gap.values()], marker="o", label=f"{name} p50")
    ax.set_xlabel("idle gap before each call (ms)")
    ax.set_ylabel("latency (ms)")
    ax.set_ylim(bottom=0)
    ax.legend()
    ax.set_title("A hop's latency after an idle gap")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=300, help="timed calls per hop and gap")
    p.add_argument("--nats-url", default="nats://127.0.0.1:4222")
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    p.add_argument("--out", type=Path, default=Path("results"))
    a = p.parse_args()
    started = dt.datetime.now(dt.UTC)
    ready = mp.get_context("spawn").Event()
    responder = mp.get_context("spawn").Process(target=_responder, args=(a.nats_url, ready), daemon=True)
    responder.start()
    try:
        if not ready.wait(30):
            raise SystemExit("the NATS responder did not start")
        hops = uvloop.run(measure(a.nats_url, a.redis_url, a.n))
    finally:
        responder.terminate()
        responder.join(5)
    meta = metadata_block(
        started=started,
        duration_s=(dt.datetime.now(dt.UTC) - started).total_seconds(),
        engine="none (no engine: NATS and Redis round trips alone)",
        model_id="n/a",
        concurrency=1,
        warmup=f"max(10, n/10) calls per hop and gap before the {a.n} timed ones",
        prompt_dataset="n/a",
        input_length_distribution=f"NATS payload {len(PAYLOAD)} bytes; Redis: one INCR script",
        output_length_distribution="n/a",
        sampling_parameters="n/a",
        command=" ".join(sys.argv),
        simulated=False,
        gaps_ms=list(GAPS_MS),
    )
    doc = {"hops": hops, "metadata": meta}
    paths = write_outputs(doc, a.out, started, "wake-floor", markdown, plot)
    print(paths["md"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
