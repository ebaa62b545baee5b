"""CPU per request of each process of the full default stack (gateway with budget auth and the
router service, budget, router, accounting, one worker, the simulator) and of nats-server, under a
closed-loop load of the SSE client. Used by results/relay-cost-split/20261203 and
results/relay-token-batches/20261203 (BATCHES=false for the worker's per-gateway batches off).

    python loadtest/studies/relay_cpu_split.py OUT_DIR STREAMS TOKENS ITL_MS

Environment: BATCHES (true/false: LLMLAB_WORKER_GATEWAY_BATCHES, default true), NOPROF=1 skips the
py-spy profiles (--gil: samples only while a thread holds the GIL; GIL=0 samples every thread, as
results/relay-gpu-check/20261203/profiles did with 64 tokens at ITL 20 ms), PERF=1 / STRACE=1
record perf or strace of the gateway and the worker instead. Prints the requests and each process's CPU per
request over a 15 s window that starts 4 s after the client."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
from llmlab_testkit.budget import BudgetAdmin
from llmlab_testkit.procs import ManagedProcess, Stack, unique_namespace, url

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
WINDOW_S = 15
UNLIMITED = dict.fromkeys(("daily_tokens", "monthly_tokens", "rpm", "tpm", "max_concurrent"), "unlimited")


def gateway_requests(gw: ManagedProcess) -> float:
    text = urllib.request.urlopen(url(gw) + "/metrics").read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("llmlab_gateway_requests_total{")
    )


def cpu_times(procs: dict[str, psutil.Process]) -> dict[str, tuple[float, float]]:
    """(user + system, system) CPU seconds of each process."""
    out = {}
    for name, p in procs.items():
        t = p.cpu_times()
        out[name] = (t.user + t.system, t.system)
    return out


def recorders(out: Path, procs: dict[str, ManagedProcess]) -> list[subprocess.Popen[bytes]]:
    quiet = subprocess.DEVNULL
    front = {n: procs[n] for n in ("gateway", "worker")}
    if os.environ.get("PERF"):
        return [
            subprocess.Popen(
                [
                    "perf",
                    "record",
                    "-F",
                    "499",
                    "-g",
                    "-p",
                    str(p.pid),
                    "-o",
                    str(out / f"{n}.perf"),
                    "--",
                    "sleep",
                    "10",
                ],
                stdout=quiet,
                stderr=quiet,
            )
            for n, p in front.items()
        ]
    if os.environ.get("STRACE"):
        return [
            subprocess.Popen(
                ["timeout", "-s", "INT", "10", "strace", "-c", "-f", "-p", str(p.pid), "-o", str(out / f"{n}.strace")],
                stdout=quiet,
                stderr=quiet,
            )
            for n, p in front.items()
        ]
    if os.environ.get("NOPROF"):
        return []
    pyspy = str(Path(sys.executable).parent / "py-spy")
    gil = [] if os.environ.get("GIL") == "0" else ["--gil"]
    return [
        subprocess.Popen(
            [
                pyspy,
                "record",
                "--pid",
                str(p.pid),
                "-d",
                str(WINDOW_S),
                "-r",
                "100",
                "--format",
                "raw",
                "-o",
                str(out / f"{n}.txt"),
                "--nonblocking",
                *gil,
            ],
            stdout=quiet,
            stderr=quiet,
        )
        for n, p in procs.items()
        if n not in ("sim",)
    ]


def main(out: Path, streams: int, tokens: int, itl_ms: float) -> None:
    out.mkdir(parents=True, exist_ok=True)
    s = Stack(namespace=unique_namespace())
    try:
        sim = s.sim("vllm", MODEL, ttft_ms=50, itl_ms=itl_ms, max_num_seqs=2000, output_len=tokens)
        batches = {"LLMLAB_WORKER_GATEWAY_BATCHES": os.environ.get("BATCHES", "true")}
        worker = s.worker("vllm", "gpu-vllm", url(sim), max_concurrency=2000, heartbeat_s=1.0, env=batches)
        budget, router = s.budget(), s.router()
        s.accounting()
        key = BudgetAdmin(url(budget)).provision("enterprise", {"key": UNLIMITED, "user": UNLIMITED, "team": UNLIMITED})
        gw = s.gateway(auth="budget", router="service")
        time.sleep(2)
        client = subprocess.Popen(
            [sys.executable, "-m", "llmlab_loadtest.sse_client", "--url", url(gw) + "/v1/chat/completions",
             "--model", MODEL, "--api-key", key.api_key, "--concurrency", str(streams), "--requests-per-stream", "1000",
             "--max-tokens", str(tokens), "--timeout", "60", "--read-timeout", "90", "--out", str(out / "client.json"),
             "--log-level", "WARNING"]
        )  # fmt: skip
        time.sleep(4)
        named = {"gateway": gw, "worker": worker, "router": router, "budget": budget, "sim": sim}
        procs = {n: psutil.Process(p.pid) for n, p in named.items()}
        nats = [p for p in psutil.process_iter(["name"]) if p.info["name"] == "nats-server"]
        if nats:
            procs["nats-server"] = nats[0]
        r0, c0, t0 = gateway_requests(gw), cpu_times(procs), time.time()
        running = recorders(out, named)
        for rec in running:
            rec.wait()
        if not running:
            time.sleep(WINDOW_S)
        r1, c1, t1 = gateway_requests(gw), cpu_times(procs), time.time()
        n, wall = r1 - r0, t1 - t0
        print(f"requests {n:.0f} in {wall:.1f}s = {n / wall:.1f} req/s; tokens/req {tokens}")
        for k in c0:
            used, system = c1[k][0] - c0[k][0], c1[k][1] - c0[k][1]
            print(
                f"  {k}: {1e3 * used / max(n, 1):.3f} ms CPU/request, {used / wall:.2f} cores; "
                f"system share {system / max(1e-9, used):.2f}"
            )
        client.send_signal(signal.SIGINT)
        client.wait(30)
    finally:
        s.close()


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
