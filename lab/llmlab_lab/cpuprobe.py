"""Measure this machine's CPU for the `cpu-local` device: matmul FLOP/s and memory bandwidth.

    python -m llmlab_lab.cpuprobe [--out results/twin-cpu-probe.json] [--repeats 7]

Matmul: numpy float32 (torch is not in .venv, and numpy has no bf16), square n x n, 2n^3 FLOPs, BLAS on all
cores. Bandwidth: a 512 MiB float64 array, read by a sum split across one thread per core (numpy releases the
GIL), and a copy (counted as read + write, 2 x bytes; write-allocate traffic is not counted). Every figure is
timed `repeats` times after one warm-up run (median, min, max and spread kept); the whole probe runs `rounds`
(2) times. The summary peak is each round's best run (STREAM convention), median over rounds, with the spread
between rounds. About 15 s.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import logging
import os
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def _stats(values: list[float]) -> dict[str, float]:
    med = statistics.median(values)
    return {
        "median": med,
        "min": min(values),
        "max": max(values),
        "spread_pct": 100.0 * (max(values) - min(values)) / med if med else 0.0,
        "n": len(values),
    }


def _timed(fn: Callable[[], object], repeats: int) -> list[float]:
    fn()  # warm-up: page faults, BLAS thread start, caches
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def cpu_info() -> dict[str, Any]:
    info: dict[str, Any] = {"model_name": "unknown", "logical_cpus": os.cpu_count(), "simd": []}
    with contextlib.suppress(OSError):
        text = Path("/proc/cpuinfo").read_text()
        for line in text.splitlines():
            if line.startswith("model name") and info["model_name"] == "unknown":
                info["model_name"] = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                info["simd"] = sorted(f for f in flags if f.startswith(("avx", "amx", "fma", "f16c")))
                break
    return info


def probe_matmul(n: int, repeats: int) -> dict[str, Any]:
    import numpy as np

    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    times = _timed(lambda: a @ b, repeats)
    flops = [2.0 * n**3 / t for t in times]
    return {"dtype": "float32", "library": f"numpy {np.__version__}", "n": n, "flops": _stats(flops)}


def probe_bandwidth(mib: int, repeats: int, threads: int) -> dict[str, Any]:
    import numpy as np

    src = np.ones(mib * 2**20 // 8, dtype=np.float64)
    dst = np.empty_like(src)
    nbytes = src.nbytes
    chunks = np.array_split(src, threads)
    pool = ThreadPoolExecutor(max_workers=threads)

    def read() -> None:
        list(pool.map(np.sum, chunks))

    def copy() -> None:
        np.copyto(dst, src)

    try:
        read_bw = [nbytes / t for t in _timed(read, repeats)]
        copy_bw = [2.0 * nbytes / t for t in _timed(copy, repeats)]
    finally:
        pool.shutdown()
    return {
        "array_mib": mib,
        "threads_read": threads,
        "read_bytes_s": _stats(read_bw),
        "copy_bytes_s_1thread": _stats(copy_bw),
    }


def run(repeats: int = 9, n: int = 2048, mib: int = 512, rounds: int = 2) -> dict[str, Any]:
    """`rounds` independent rounds (MISSION rule: every measurement twice, spread reported)."""
    started = dt.datetime.now(dt.UTC)
    t0 = time.perf_counter()
    threads = os.cpu_count() or 1
    load_before = os.getloadavg()  # other tenants' load: a busy machine makes every figure low
    per_round = []
    for i in range(rounds):
        mm = probe_matmul(n, repeats)
        bw = probe_bandwidth(mib, repeats, threads)
        log.info(
            "round %d: matmul %.1f GFLOP/s, read %.2f GB/s",
            i + 1,
            mm["flops"]["median"] / 1e9,
            bw["read_bytes_s"]["median"] / 1e9,
        )
        per_round.append({"matmul": mm, "bandwidth": bw})
    # Peak = best run of each round (STREAM convention: other tenants of this VM only ever slow a run down),
    # then the median over rounds. Decode streams weights, so the multi-threaded read is the bandwidth figure.
    flops = [r["matmul"]["flops"]["max"] for r in per_round]
    reads = [r["bandwidth"]["read_bytes_s"]["max"] for r in per_round]
    return {
        "kind": "cpu-probe",
        "measured": True,
        "date": started.isoformat(timespec="seconds"),
        "duration_s": round(time.perf_counter() - t0, 1),
        "cpu": cpu_info(),
        "loadavg_1_5_15_before": load_before,
        "loadavg_1_5_15_after": os.getloadavg(),
        "rounds": per_round,
        "summary": {
            "peak_fp32_flops": statistics.median(flops),
            "peak_fp32_flops_rounds_spread": _stats(flops)["spread_pct"],
            "peak_bf16_flops": statistics.median(flops),
            "peak_bf16_note": "no native bf16 on this CPU and none in numpy: bf16 repeats the fp32 figure",
            "mem_bandwidth_bytes_s": statistics.median(reads),
            "mem_bandwidth_rounds_spread": _stats(reads)["spread_pct"],
        },
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m llmlab_lab.cpuprobe", description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(Path("results") / "twin-cpu-probe.json"))
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--n", type=int, default=2048, help="matmul size")
    ap.add_argument("--mib", type=int, default=512, help="bandwidth array size")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    result = run(args.repeats, args.n, args.mib, args.rounds)
    result["command"] = "python -m llmlab_lab.cpuprobe " + shlex.join(argv or sys.argv[1:])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    s = result["summary"]
    sys.stdout.write(
        f"{result['cpu']['model_name']} ({result['cpu']['logical_cpus']} cpus): "
        f"matmul fp32 {s['peak_fp32_flops'] / 1e9:.1f} GFLOP/s "
        f"(spread between rounds {s['peak_fp32_flops_rounds_spread']:.0f}%), "
        f"read bandwidth {s['mem_bandwidth_bytes_s'] / 1e9:.2f} GB/s "
        f"(spread {s['mem_bandwidth_rounds_spread']:.0f}%) -> {args.out}\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
