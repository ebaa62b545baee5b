"""Issue 34's granian lever, measured before it is wired in: the ASGI server's CPU per streamed
token, uvicorn (uvloop + httptools, as the services run it) against granian (Rust HTTP, ASGI
interface, uvloop), serving the same plain-ASGI app (``asgi_stream_app.py``: one body send per
token, paced like the simulator's GPU-like setting, TTFT 50 ms, ITL 20 ms).

    python loadtest/studies/asgi_servers.py [--repeats 2] [--streams 100] [--requests 12]

Each window: the server under test starts, a 2 s warm-up load runs, then the SSE client (its own
process) runs ``--streams`` closed-loop streams of ``--requests`` 64-token requests each; the
server's CPU (its whole process tree: granian serves from a child process) over the client's run,
divided by the tokens the client received, is the server's µs per token. Servers alternate
(uvicorn, granian, then granian, uvicorn: ABBA). Writes ``results/asgi-servers/<UTC>/``.

Needs granian, which the stack does not install: ``.venv/bin/pip install granian``."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
from llmlab_loadtest import bench_meta
from llmlab_loadtest.ladder import tree_cpu_s
from llmlab_testkit.procs import ManagedProcess, free_port

log = logging.getLogger("asgi_servers")
HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
TOKENS = 64


def server_cmd(server: str, port: int) -> list[str]:
    if server == "uvicorn":
        return [sys.executable, "-m", "uvicorn", "asgi_stream_app:app", "--app-dir", str(HERE), "--port", str(port),
                "--loop", "uvloop", "--http", "httptools", "--no-access-log", "--log-level", "warning",
                "--backlog", "4096"]  # fmt: skip
    return [str(BIN / "granian"), "--interface", "asgi", "--loop", "uvloop", "--host", "127.0.0.1", "--port", str(port),
            "--workers", "1", "--no-ws", "--http", "1", "--log-level", "warning", "--working-dir", str(HERE),
            "asgi_stream_app:app"]  # fmt: skip


def client(port: int, streams: int, requests: int, out: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "llmlab_loadtest.sse_client", "--url", f"http://127.0.0.1:{port}/v1/chat/completions",
           "--model", "m", "--concurrency", str(streams), "--requests-per-stream", str(requests),
           "--max-tokens", str(TOKENS), "--out", str(out), "--summary-only", "--log-level", "WARNING"]  # fmt: skip
    subprocess.run(cmd, check=True, timeout=600)
    return dict(json.loads(out.read_text())["summary"])


def window(server: str, streams: int, requests: int, tmp: Path) -> dict[str, Any]:
    port = free_port()
    proc = ManagedProcess(server, server_cmd(server, port), {}, ready_url=f"http://127.0.0.1:{port}/health")
    try:
        proc.start().wait_ready()  # a server that cannot start fails the study with its log
        client(port, streams, 1, tmp / "warmup.json")
        p = psutil.Process(proc.pid)
        cpu0, t0 = tree_cpu_s(p), time.monotonic()
        s = client(port, streams, requests, tmp / f"{server}.json")
        cpu, wall = tree_cpu_s(p) - cpu0, time.monotonic() - t0
    finally:
        proc.stop()
    tokens = int(s["output_tokens"])
    row = {
        "server": server,
        "tokens": tokens,
        "failed": s["requests"]["failed"],
        "server_cpu_s": round(cpu, 3),
        "server_us_per_token": round(1e6 * cpu / tokens, 2) if tokens else None,
        "server_cores": round(cpu / wall, 3),
        "client_us_per_token": round(1e6 * s["client"]["cpu_s"] / tokens, 2) if tokens else None,
        "tokens_per_s": s["output_tokens_per_s"],
        "itl_ms": s["itl_ms"],
        "ttft_ms": s["ttft_ms"],
    }
    log.info("%s: %s us/token server, %s cores, ITL p99 %s ms", server, row["server_us_per_token"],
             row["server_cores"], s["itl_ms"].get("p99"))  # fmt: skip
    return row


def markdown(doc: dict[str, Any]) -> str:
    lines = ["# ASGI servers: CPU per streamed token (simulated app)", "", doc["summary"], "",
             "| repeat | server | tokens | failed | server µs/token | server cores | client µs/token | tokens/s | "
             "ITL p50 / p99 ms |", "|---:|---|---:|---:|---:|---:|---:|---:|---|"]  # fmt: skip
    for w in doc["windows"]:
        itl = w["itl_ms"]
        lines.append(
            f"| {w['repeat']} | {w['server']} | {w['tokens']} | {w['failed']} | {w['server_us_per_token']} | "
            f"{w['server_cores']} | {w['client_us_per_token']} | {w['tokens_per_s']} | {itl.get('p50')} / "
            f"{itl.get('p99')} |"
        )
    lines.append("")
    return "\n".join(lines + bench_meta.metadata_section(doc["metadata"]))


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    servers = list(doc["median_us_per_token"])
    for i, s in enumerate(servers):
        vals = [w["server_us_per_token"] for w in doc["windows"] if w["server"] == s]
        ax.scatter([i] * len(vals), vals, color="C0")
        ax.bar(i, doc["median_us_per_token"][s], alpha=0.4, color="C0")
    ax.set_xticks(range(len(servers)), servers)
    ax.set_ylabel("server CPU µs per token")
    ax.set_title("ASGI server CPU per streamed token (bars: median)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--streams", type=int, default=100)
    ap.add_argument("--requests", type=int, default=12, help="64-token requests per stream per window")
    ap.add_argument("--out", type=Path, default=Path("results"))
    ap.add_argument("--dirty", action="store_true")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    dirty = bench_meta.require_committed(a.dirty)
    started, t0 = dt.datetime.now(dt.UTC), time.monotonic()
    windows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(1, a.repeats + 1):
            for server in ("uvicorn", "granian") if r % 2 else ("granian", "uvicorn"):
                w = window(server, a.streams, a.requests, Path(tmp))
                w["repeat"] = r
                windows.append(w)
    med = {s: statistics.median(w["server_us_per_token"] for w in windows if w["server"] == s)
           for s in ("uvicorn", "granian")}  # fmt: skip
    summary = (
        f"{a.streams} closed-loop streams of {TOKENS}-token requests, one body send per token (TTFT 50 ms, ITL 20 ms), "
        f"{a.repeats} repeats, ABBA. Median server CPU per token: uvicorn {med['uvicorn']:.1f} µs, granian "
        f"{med['granian']:.1f} µs ({med['granian'] / med['uvicorn']:.2f} of uvicorn)."
    )
    meta = bench_meta.metadata_block(
        started=started,
        duration_s=time.monotonic() - t0,
        engine="asgi_stream_app (no engine: a paced ASGI app)",
        model_id="n/a",
        concurrency=a.streams,
        warmup="one request per stream before each window",
        prompt_dataset="sse_client's fixed prompt",
        input_length_distribution="fixed",
        output_length_distribution=f"fixed: {TOKENS} tokens",
        sampling_parameters={"stream": True},
        command=" ".join(["python", "loadtest/studies/asgi_servers.py", *(argv or sys.argv[1:])]),
        servers={
            "uvicorn": bench_meta.dist_version("uvicorn"),
            "granian": bench_meta.dist_version("granian"),
            "uvloop": bench_meta.dist_version("uvloop"),
        },
        cores=os.cpu_count(),
        dirty_files=dirty,
    )
    doc = {"summary": summary, "median_us_per_token": med, "windows": windows, "metadata": meta}
    paths = bench_meta.write_outputs(doc, a.out, started, "asgi-servers", markdown, plot)
    log.info("%s -> %s", summary, paths["md"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
