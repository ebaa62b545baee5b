"""Pipelines A, B and C launched for real (tutorial §2.3, issue 20): vLLM on this CPU started from each
pipeline's config (``configs/pipelines/``), behind a worker and the whole stack (our SSE client -> gateway ->
NATS -> worker-vllm -> vLLM), each with its own workload:

* **A, throughput-first**: many concurrent medium requests, closed loop. The batch limit is raised step by step
  (the worker's concurrency, which bounds the engine's running batch below A's ``--max-num-seqs``: a vLLM restart
  per rung costs about a minute here) and the walk stops one rung after goodput falls or the p95 breaks the SLO;
  the chosen limit is the rung with the highest goodput within the SLO.
* **B, latency-first**: short interactive requests with a per-request output cap, arriving open loop (Poisson);
  TTFT p95 is the SLO.
* **C, long context**: long documents, each asked several questions (a shared prefix), with short chats beside
  them; prefix caching on (C's flags) against off (C with ``--no-enable-prefix-caching``), both engines up at once
  and the rounds interleaved ABBA; the short chats' TTFT shows whether long prefills block them.

Each pipeline's vLLM flags go to the engine as written, except what has no meaning on a CPU, listed with the
reason in the results (``cpu_launch``): ``--gpu-memory-utilization`` (the KV cache here is
``VLLM_CPU_KVCACHE_SPACE`` GiB), ``--tensor-parallel-size`` above 1 (one CPU device), FP8 weights or KV cache
(pipeline D, not launched). ``--max-model-len`` is capped at the model's 8,192 positions.

SLOs: the configs' SLOs are GPU figures for 8B-32B models; this CPU runs SmolLM2-135M in fp32 at about 10 tokens/s
per stream, so each pipeline gets a CPU SLO of the same shape (``CPU_SLO``), stated in the table. A request meets
its SLO when its TTFT and its TPOT are both within it; goodput = such requests per second of the window.
Everything is MEASURED on this machine (no twin figures here).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmlab_loadtest import sse_client as sc

from llmlab_experiments.note import Note, metadata, write_experiment
from llmlab_experiments.pipelines import Pipeline, load_pipelines
from llmlab_experiments.real_caching_batching import (
    NO_EOS_BIAS,
    Plan,
    chat_body,
    combine,
    cpu_vllm_fields,
    drive,
    engine_env,
    proc_tree,
    scrape,
    vllm_base_command,
)

log = logging.getLogger(__name__)

NAME = "real_pipelines"
ROUNDS = 2
MODEL_MAX_LEN = 8192  # SmolLM2-135M's max_position_embeddings
KV_SPACE_GIB = 1  # VLLM_CPU_KVCACHE_SPACE: whole GiB only; 1 GiB holds ~23k tokens of this model in fp32
HEARTBEAT_S = 2.0  # as real_caching_batching: a starved worker on this shared box is not declared lost
# A's and C's gateways let requests queue this long (configs/catalog.yaml's batch class): a document's prefill
# takes seconds here, and the dev key's interactive plan would answer 429 after 5 s.
QUEUE_TIMEOUT_S = 60.0

# Flags with no meaning on this CPU: flag -> why it is skipped.
GPU_ONLY: dict[str, str] = {
    "--gpu-memory-utilization": "a share of GPU memory; on the CPU the KV cache is VLLM_CPU_KVCACHE_SPACE "
    f"({KV_SPACE_GIB} GiB here)",
    "--tensor-parallel-size": "splits the model across GPUs; this host has one CPU device",
    "--quantization": "FP8 weights need a GPU with FP8 support",
    "--kv-cache-dtype": "an FP8 KV cache needs a GPU with FP8 support",
}


@dataclass(frozen=True)
class Slo:
    ttft_s: float
    tpot_s: float


# The CPU SLOs (see the module doc): A lenient on TTFT (throughput first), B strict on TTFT, C lenient on both.
# A's TPOT bound (4 tokens/s to each user) is what its batch-limit walk backs off from.
CPU_SLO: dict[str, Slo] = {"A": Slo(6.0, 0.25), "B": Slo(1.5, 0.4), "C": Slo(10.0, 0.6)}


@dataclass
class CpuLaunch:
    """A pipeline's vLLM flags as launched here, and what was left out or changed, with the reason."""

    pipeline: str
    flags: dict[str, Any]
    skipped: list[dict[str, Any]] = field(default_factory=list)
    changed: list[dict[str, Any]] = field(default_factory=list)

    def argv(self) -> list[str]:
        out: list[str] = []
        for name, value in self.flags.items():
            if value is True:
                out.append(name)
            elif value is False:
                out.append("--no-" + name.removeprefix("--"))
            else:
                out += [name, str(value)]
        return out


def cpu_launch(p: Pipeline, *, prefix_caching: bool | None = None) -> CpuLaunch:
    """The CPU-meaningful subset of a pipeline's vLLM flags; ``prefix_caching`` overrides its setting."""
    launch = CpuLaunch(p.name, {})
    for name, value in p.engines["vllm"].flags.items():
        if name in GPU_ONLY and not (name == "--tensor-parallel-size" and value == 1):
            launch.skipped.append({"flag": name, "value": value, "reason": GPU_ONLY[name]})
        elif name == "--max-model-len" and int(value) > MODEL_MAX_LEN:
            launch.flags[name] = MODEL_MAX_LEN
            launch.changed.append(
                {"flag": name, "from": value, "to": MODEL_MAX_LEN, "reason": "SmolLM2-135M has 8,192 positions"}
            )
        else:
            launch.flags[name] = value
    if prefix_caching is not None:
        launch.flags["--enable-prefix-caching"] = prefix_caching
    return launch


def engine_command(port: int, launch: CpuLaunch) -> list[str]:
    """The test tier's vLLM command with the pipeline's flags (one the command already sets takes the
    pipeline's value)."""
    cmd = vllm_base_command(port)
    for name, value in launch.flags.items():
        if name in cmd and not isinstance(value, bool):
            cmd[cmd.index(name) + 1] = str(value)
        else:
            cmd += CpuLaunch(launch.pipeline, {name: value}).argv()
    return cmd


# ---- the metrics of one run ------------------------------------------------------------------------------------


def meets(rec: sc.RequestRecord, slo: Slo) -> bool:
    """A request meets its SLO when it succeeded, its TTFT and its TPOT are within it (one token: TTFT only)."""
    if not rec.ok or rec.ttft is None:
        return False
    tpot = rec.tpot()
    return rec.ttft <= slo.ttft_s and (tpot is None or tpot <= slo.tpot_s)


def goodput(records: Sequence[sc.RequestRecord], slo: Slo, window_s: float) -> tuple[float | None, float | None]:
    """(requests meeting the SLO per second, the share of all requests that met it)."""
    if not records:
        return None, None
    good = sum(1 for r in records if meets(r, slo))
    return (round(good / window_s, 4) if window_s > 0 else None), round(good / len(records), 4)


@dataclass
class Served:
    key: str
    launch: CpuLaunch
    proc: Any  # llmlab_testkit.procs.ManagedProcess
    engine_url: str
    startup_s: float = 0.0
    stacks: list[Any] = field(default_factory=list)  # llmlab_testkit.procs.Stack, one per worker setting

    def close_stacks(self) -> None:
        for st in self.stacks:
            st.close()  # its processes, streams and Redis keys
        self.stacks.clear()


Spawn = Callable[[str, int, CpuLaunch], Any]  # (key, port, launch) -> an unstarted ManagedProcess serving it


def vllm_process(key: str, port: int, launch: CpuLaunch) -> Any:
    """Real vLLM on this CPU with the pipeline's flags."""
    from llmlab_testkit.procs import ManagedProcess

    env = {**engine_env(), "VLLM_CPU_KVCACHE_SPACE": str(KV_SPACE_GIB)}
    return ManagedProcess(
        f"vllm-cpu-{key}", engine_command(port, launch), env, ready_url=f"http://127.0.0.1:{port}/health"
    )


@contextlib.contextmanager
def engines(launches: dict[str, CpuLaunch], spawn: Spawn = vllm_process) -> Any:
    """Start the engines together (their start-ups overlap), yield them; stop them and their stacks on exit."""
    from llmlab_testkit.procs import free_port

    served: dict[str, Served] = {}
    try:
        t0 = time.perf_counter()
        for key, launch in launches.items():
            port = free_port()
            proc = spawn(key, port, launch)
            proc.start()
            log.info("engine %s: pid %d, log %s", key, proc.pid, proc.log_path)
            served[key] = Served(key, launch, proc, f"http://127.0.0.1:{port}")
        for sv in served.values():
            sv.proc.wait_ready(timeout=600)
            sv.startup_s = round(time.perf_counter() - t0, 1)
            log.info("engine %s ready after %.0f s", sv.key, sv.startup_s)
        yield served
    finally:
        for sv in served.values():
            sv.close_stacks()
            sv.proc.stop(timeout=30)


def stack_for(sv: Served, concurrency: int, queue_timeout_s: float | None = None) -> str:
    """A gateway + worker (of this concurrency) in front of the engine; returns the gateway URL. The gateway's
    queue bound is its plan's SLO class's (the dev key: interactive, 5 s) unless ``queue_timeout_s``."""
    from llmlab_testkit.procs import Stack, unique_namespace, url

    st = Stack(namespace=unique_namespace())
    sv.stacks.append(st)
    st.worker("vllm", "cpu-vllm", sv.engine_url, max_concurrency=concurrency, heartbeat_s=HEARTBEAT_S)
    gw = st.gateway(queue_timeout_s=queue_timeout_s)
    wait_workers(gw, 1, sv.key)
    return url(gw)


def wait_workers(gw: Any, n: int, what: str, timeout_s: float = 30.0) -> None:
    """Until the gateway has heard ``n`` workers: it routes only to workers it has heard (their heartbeat);
    before that, 503 no_workers."""
    from llmlab_testkit.e2e import metric

    deadline = time.monotonic() + timeout_s
    while metric(gw, "llmlab_gateway_live_workers") < n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the gateway of {what} heard fewer than {n} workers in {timeout_s:g} s")
        time.sleep(0.2)


def measure(
    sv: Served,
    gateway_url: str,
    plan: Plan,
    slo: Slo,
    slo_class: str = "interactive",
    **labels: Any,
) -> tuple[dict[str, Any], list[sc.RequestRecord]]:
    """One measured run: the client's summary, goodput at the SLO, the engine's counters, CPU and load."""
    before = scrape(sv.engine_url)
    cpu0_eng, _ = proc_tree(sv.proc.pid)
    cpu0 = sc.client_usage()
    records = asyncio.run(drive(gateway_url, plan, slo_class=slo_class, timeout_s=900.0))
    cpu1 = sc.client_usage()
    cpu1_eng, rss = proc_tree(sv.proc.pid)
    after = scrape(sv.engine_url)
    window = sc.measured_window(records)
    summary = sc.summarize(
        records, window, sc.ClientUsage(cpu1.cpu_user_s - cpu0.cpu_user_s, cpu1.cpu_sys_s - cpu0.cpu_sys_s, 0.0)
    )
    delta = {k.removeprefix("vllm:"): after[k] - before[k] for k in before}
    q, h = delta["prefix_cache_queries_total"], delta["prefix_cache_hits_total"]
    gp, attain = goodput(records, slo, window)
    row = {
        "pipeline": sv.launch.pipeline,
        "engine": sv.key,
        **labels,
        "requests": summary["requests"],
        "ttft_ms": summary["ttft_ms"],
        "itl_ms": summary["itl_ms"],
        "tpot_ms": summary["tpot_ms"],
        "e2e_ms": summary["e2e_ms"],
        "output_tokens": summary["output_tokens"],
        "prompt_tokens": summary["prompt_tokens"],
        "window_s": summary["window_s"],
        "output_tok_s": summary["output_tokens_per_s"],
        "requests_per_s": round(len(records) / window, 4) if window > 0 else None,
        "slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s},
        "slo_class": slo_class,
        "goodput_rps": gp,
        "slo_attainment": attain,
        "prefix_hit_rate": round(h / q, 4) if q else 0.0,
        "preemptions": delta["num_preemptions_total"],
        "engine_counters_delta": delta,
        "engine_cpu_s": round(cpu1_eng - cpu0_eng, 2) if cpu0_eng is not None and cpu1_eng is not None else None,
        "engine_rss_mib": round(rss) if rss else None,
        "client": summary.get("client"),
        "errors": summary["error_samples"],
    }
    log.info(
        "%s %s %s: ok %d/%d, ttft p95 %s ms, tpot p50 %s ms, %s tok/s, goodput %s/s (%s met), hit %s, preempt %s",
        sv.launch.pipeline,
        sv.key,
        labels,
        summary["requests"]["ok"],
        summary["requests"]["total"],
        summary["ttft_ms"]["p95"],
        summary["tpot_ms"]["p50"],
        summary["output_tokens_per_s"],
        gp,
        attain,
        row["prefix_hit_rate"],
        row["preemptions"],
    )
    return row, records


# ---- workloads --------------------------------------------------------------------------------------------------

_TOPICS = ["tides", "bread", "glaciers", "jazz", "bees", "volcanoes", "chess", "maps", "comets", "silk", "owls"]


@dataclass(frozen=True)
class Sizes:
    a_streams: int
    a_requests_per_stream: int
    a_max_tokens: int
    a_rungs: tuple[int, ...]
    b_requests: int
    b_rate_per_s: float
    b_max_tokens: int
    c_documents: int
    c_questions: int
    c_doc_sentences: int
    c_max_tokens: int
    c_short_chats: int


FULL = Sizes(a_streams=16, a_requests_per_stream=2, a_max_tokens=24, a_rungs=(2, 4, 8, 16),
             b_requests=24, b_rate_per_s=1.0, b_max_tokens=16,
             c_documents=3, c_questions=3, c_doc_sentences=60, c_max_tokens=12, c_short_chats=6)  # fmt: skip
QUICK = Sizes(a_streams=6, a_requests_per_stream=1, a_max_tokens=12, a_rungs=(2, 6),
              b_requests=6, b_rate_per_s=1.0, b_max_tokens=8,
              c_documents=2, c_questions=2, c_doc_sentences=40, c_max_tokens=8, c_short_chats=2)  # fmt: skip


def _body(model: str, system: str | None, user: str, max_tokens: int) -> dict[str, Any]:
    body = chat_body(model, system, user, max_tokens)
    body["stream_options"] = {"include_usage": True}
    return body


def a_plan(model: str, s: Sizes, rnd: int, rung: int) -> Plan:
    """Medium requests (a paragraph to summarise), every stream from the start: the engine's batch fills up."""
    return [
        (
            0.0,
            [
                _body(
                    model,
                    None,
                    f"Round {rnd}, rung {rung}, item {i}-{j}: summarise in one line why "
                    + ", ".join(_TOPICS[(i + j + k) % len(_TOPICS)] for k in range(24))
                    + " matter to a small coastal town.",
                    s.a_max_tokens,
                )
                for j in range(s.a_requests_per_stream)
            ],
        )
        for i in range(s.a_streams)
    ]


def b_plan(model: str, s: Sizes, rnd: int) -> Plan:
    """Short questions arriving open loop (Poisson, seeded per round), each capped at b_max_tokens."""
    rng = random.Random(1000 + rnd)
    t, plan = 0.0, []
    for i in range(s.b_requests):
        plan.append((t, [_body(model, None, f"Q{rnd}.{i}: one word for {_TOPICS[i % len(_TOPICS)]}?", s.b_max_tokens)]))
        t += rng.expovariate(s.b_rate_per_s)
    return plan


SHORT_MAX_TOKENS = 4  # C's short chats (how short_ttft_p95 tells them from the documents' questions)


def document(rnd: int, d: int, sentences: int) -> str:
    """About 29 tokens a clause: 60 clauses stay under the 2,048 tokens of context that configs/catalog.yaml
    gives the smollm2-cpu deployment (the gateway refuses a longer prompt with context_length_exceeded)."""
    rng = random.Random(rnd * 100 + d)
    words = [
        f"Clause {k}: the {rng.choice(_TOPICS)} office files its {rng.choice(_TOPICS)} report every "
        f"{rng.randint(2, 30)} days and keeps {rng.randint(1, 90)} copies."
        for k in range(sentences)
    ]
    return f"Document {rnd}-{d}. " + " ".join(words)


def c_plans(model: str, s: Sizes, rnd: int) -> Plan:
    """One stream per document asking its questions one after the other (the document is the shared prefix),
    and one stream of short chats beside them, spaced over the run."""
    plan: Plan = [
        (
            0.0,
            [
                _body(model, document(rnd, d, s.c_doc_sentences), f"Question {q}: which office files most often?",
                      s.c_max_tokens)
                for q in range(s.c_questions)
            ],
        )
        for d in range(s.c_documents)
    ]  # fmt: skip
    plan += [
        (1.0 + 2.0 * i, [_body(model, None, f"Short {rnd}.{i}: hi!", SHORT_MAX_TOKENS)]) for i in range(s.c_short_chats)
    ]
    return plan


def nearest_rank(values: Sequence[float], q: float) -> float | None:
    """The value at rank ``int(q * n)`` of the sorted values (0 < q < 1), rounded to 0.1; None for none. These
    experiments' few requests per cell report a value that occurred, not an interpolation."""
    if not values:
        return None
    vals = sorted(values)
    return round(vals[min(len(vals) - 1, int(q * len(vals)))], 1)


def short_streams(plan: Plan) -> set[int]:
    """The streams of C's short chats (how they are told from the documents' questions)."""
    return {i for i, (_, seq) in enumerate(plan) if seq[0]["max_tokens"] == SHORT_MAX_TOKENS}


def short_ttft_p95(records: Sequence[sc.RequestRecord], plan: Plan) -> float | None:
    """The short chats' TTFT p95 (ms): the streams after the documents' (one request each)."""
    shorts = short_streams(plan)
    return nearest_rank([r.ttft * 1000 for r in records if r.stream in shorts and r.ok and r.ttft is not None], 0.95)


# ---- the run ----------------------------------------------------------------------------------------------------


def _tpot_broke(row: dict[str, Any]) -> bool:
    p95 = row["tpot_ms"]["p95"]
    return p95 is None or p95 > row["slo"]["tpot_s"] * 1000


def choose_rung(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A's choice: the rung with the highest goodput whose TPOT p95 is within the SLO (else the best goodput).
    TTFT is not the walk's bound: at a low limit it is the queue's wait, which a higher limit shortens."""
    within = [r for r in rows if not _tpot_broke(r)]
    best = max(within or list(rows), key=lambda r: r["goodput_rps"] or 0.0)
    return {"batch_limit": best["batch_limit"], "goodput_rps": best["goodput_rps"], "within_slo": bool(within)}


def walk_a(sv: Served, model: str, s: Sizes, rnd: int) -> list[dict[str, Any]]:
    """Raise the batch limit one rung at a time; stop at the rung where TPOT p95 broke the SLO or goodput fell
    (that rung measured: the walk backs off to the one before)."""
    rows: list[dict[str, Any]] = []
    for rung in s.a_rungs:
        # A throughput deployment's gateway lets a request queue (the batch class's 60 s), where the dev key's
        # interactive plan would answer 429 after 5 s: the walk measures the batch limit, not admission.
        gw = stack_for(sv, rung, queue_timeout_s=QUEUE_TIMEOUT_S)
        plan = a_plan(model, s, rnd, rung)
        row, _ = measure(sv, gw, plan, CPU_SLO["A"], slo_class="batch", round=rnd, batch_limit=rung)
        rows.append(row)
        # fell: 5% below the rung before (less is this host's noise)
        fell = len(rows) > 1 and (row["goodput_rps"] or 0) < 0.95 * (rows[-2]["goodput_rps"] or 0)
        if _tpot_broke(row) or fell:
            log.info("A round %d: stop at batch limit %d (%s)", rnd, rung, "goodput fell" if fell else "TPOT p95 broke")
            break
    return rows


def launches_of_pipelines() -> dict[str, CpuLaunch]:
    by_name = load_pipelines()
    return {
        "A": cpu_launch(by_name["A"]),
        "B": cpu_launch(by_name["B"]),
        "C": cpu_launch(by_name["C"]),
        "C-no-cache": cpu_launch(by_name["C"], prefix_caching=False),
    }


@contextlib.contextmanager
def engines_of(
    group: Sequence[str], launches: dict[str, CpuLaunch], spawn: Spawn, running: dict[str, Served] | None
) -> Any:
    """The group's engines: those already ``running`` (left running, their stacks closed on exit), the rest
    started for the group and stopped after it."""
    have = {k: running[k] for k in group if running is not None and k in running}
    with engines({k: launches[k] for k in group if k not in have}, spawn) as started:
        try:
            yield {k: have.get(k) or started[k] for k in group}
        finally:
            for sv in have.values():
                sv.close_stacks()


def execute(
    s: Sizes,
    launches: dict[str, CpuLaunch],
    spawn: Spawn = vllm_process,
    rounds: int = ROUNDS,
    running: dict[str, Served] | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every pipeline's workload through the whole stack, on the engines ``spawn`` starts: (rows, servers).
    ``rounds`` below ROUNDS and engines already ``running``: the CI-sized run (make test), which shares A, B
    and C with the §2 table's."""
    from llmlab_testkit.vllm import SERVED_NAME as model

    logging.getLogger("httpx").setLevel(logging.WARNING)
    rows: list[dict[str, Any]] = []
    servers: list[dict[str, Any]] = []
    # One engine at a time (A, then B, then C with its no-cache twin): four vLLM processes at once would hold
    # ~15 GB and share two cores during every measurement.
    for group in (("A",), ("B",), ("C", "C-no-cache")):
        with engines_of(group, launches, spawn, running) as served:
            for sv in served.values():
                _, rss = proc_tree(sv.proc.pid)
                servers.append(
                    {"engine": sv.key, "command": sv.proc.cmd, "ready_after_s": sv.startup_s,
                     "rss_mib_idle": round(rss) if rss else None}
                )  # fmt: skip
            if group == ("A",):
                for rnd in range(1, rounds + 1):
                    rows += walk_a(served["A"], model, s, rnd)
            elif group == ("B",):
                gw = stack_for(served["B"], 8)
                _warm(gw, model)
                for rnd in range(1, rounds + 1):
                    rows.append(measure(served["B"], gw, b_plan(model, s, rnd), CPU_SLO["B"], round=rnd)[0])
            else:
                gws = {k: stack_for(served[k], 4, queue_timeout_s=QUEUE_TIMEOUT_S) for k in group}
                for gw in gws.values():
                    _warm(gw, model)
                for rnd in range(1, rounds + 1):
                    for key in group if rnd % 2 else group[::-1]:  # ABBA
                        plan = c_plans(model, s, rnd)
                        row, recs = measure(served[key], gws[key], plan, CPU_SLO["C"], round=rnd)
                        row["short_ttft_p95_ms"] = short_ttft_p95(recs, plan)
                        rows.append(row)
            for sv in served.values():
                next(x for x in servers if x["engine"] == sv.key)["log_tail"] = sv.proc.tail(6)
    return rows, servers


def run(out: Path, quick: bool, command: str) -> Path:
    s = QUICK if quick else FULL
    t_start = time.time()
    launches = launches_of_pipelines()
    rows, servers = execute(s, launches)
    return report(out, command, s, rows, servers, launches, t_start, time.time() - t_start)


def _warm(gateway_url: str, model: str) -> None:
    """Two short requests through the stack, not measured."""
    asyncio.run(drive(gateway_url, [(0.0, [_body(model, None, f"Warm-up {i}: hello.", 4) for i in range(2)])]))


# ---- report -----------------------------------------------------------------------------------------------------

KEYS = (
    "goodput_rps",
    "slo_attainment",
    "output_tok_s",
    "ttft_ms.p50",
    "ttft_ms.p95",
    "tpot_ms.p95",
    "itl_ms.p50",
    "itl_ms.p95",
    "prefix_hit_rate",
    "preemptions",
)


def summarize_runs(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    a_rows = [r for r in rows if r["engine"] == "A"]
    rounds = sorted({r["round"] for r in rows})
    a_choice = {rnd: choose_rung([r for r in a_rows if r["round"] == rnd]) for rnd in rounds}
    chosen = statistics.mode(c["batch_limit"] for c in a_choice.values())
    out: dict[str, Any] = {
        "rounds": len(rounds),
        "A": {
            "walk": {
                str(limit): combine([r for r in a_rows if r["batch_limit"] == limit], KEYS)
                for limit in sorted({r["batch_limit"] for r in a_rows})
            },
            "choice_by_round": a_choice,
            "chosen_batch_limit": chosen,
            "at_choice": combine([r for r in a_rows if r["batch_limit"] == chosen], KEYS),
        },
        "B": combine([r for r in rows if r["engine"] == "B"], KEYS),
    }
    for key in ("C", "C-no-cache"):
        out[key] = combine([r for r in rows if r["engine"] == key], (*KEYS, "short_ttft_p95_ms", "engine_cpu_s"))
    return out


def _c(cell: dict[str, Any], fmt: str = ".0f") -> str:
    """A ``combine`` cell as these experiments' tables print it: the mean, each round's value in brackets."""
    if cell["mean"] is None:
        return "–"
    runs = ", ".join(format(v, fmt) for v in cell["runs"])
    return f"{cell['mean']:{fmt}} ({runs})"


def table(summary: dict[str, Any], launches: dict[str, CpuLaunch]) -> str:
    head = (
        "| pipeline | setting | goodput (req/s) | SLO met | output tok/s | TTFT p50 / p95 (ms) | TPOT p95 (ms) "
        "| ITL p50 / p95 (ms) | prefix hit rate | preemptions |\n|---|---|---:|---:|---:|---|---:|---|---:|---:|"
    )
    lines = [head]

    def row(name: str, setting: str, c: dict[str, Any]) -> str:
        return (
            f"| {name} | {setting} | {_c(c['goodput_rps'], '.3f')} | {_c(c['slo_attainment'], '.2f')} "
            f"| {_c(c['output_tok_s'], '.1f')} | {_c(c['ttft_ms.p50'])} / {_c(c['ttft_ms.p95'])} "
            f"| {_c(c['tpot_ms.p95'])} "
            f"| {_c(c['itl_ms.p50'])} / {_c(c['itl_ms.p95'])} | {_c(c['prefix_hit_rate'], '.2f')} "
            f"| {_c(c['preemptions'])} |"
        )

    a = summary["A"]
    for limit, c in a["walk"].items():
        mark = " **chosen**" if int(limit) == a["chosen_batch_limit"] else ""
        lines.append(row("A throughput", f"batch limit {limit}{mark}", c))
    lines.append(row("B latency", "worker concurrency 8", summary["B"]))
    lines.append(row("C long context", "prefix caching on", summary["C"]))
    lines.append(row("C long context", "prefix caching off", summary["C-no-cache"]))
    slo = "; ".join(f"{k}: TTFT ≤ {v.ttft_s:g} s and TPOT ≤ {v.tpot_s:g} s" for k, v in CPU_SLO.items())
    lines += [
        "",
        f"Cells: mean over {summary['rounds']} rounds (each round's value in brackets). CPU SLOs per request: {slo}.",
        f"C's short chats beside the documents, TTFT p95: caching on {_c(summary['C']['short_ttft_p95_ms'])} ms, "
        f"off {_c(summary['C-no-cache']['short_ttft_p95_ms'])} ms.",
        "",
        "## Flags as launched on this CPU",
        "",
        "| pipeline | flags passed to vLLM | skipped (GPU only) | changed |",
        "|---|---|---|---|",
    ]
    for key, launch in launches.items():
        skipped = "; ".join(f"`{x['flag']} {x['value']}`: {x['reason']}" for x in launch.skipped) or "none"
        changed = "; ".join(f"`{x['flag']}` {x['from']} → {x['to']}: {x['reason']}" for x in launch.changed) or "none"
        lines.append(f"| {key} | `{' '.join(launch.argv())}` | {skipped} | {changed} |")
    return "\n".join(lines)


def plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    walk = summary["A"]["walk"]
    limits = [int(k) for k in walk]
    ax1.plot(limits, [walk[k]["goodput_rps"]["mean"] or 0 for k in walk], "o-", label="goodput (req/s)")
    ax1b = ax1.twinx()
    ax1b.plot(limits, [walk[k]["tpot_ms.p95"]["mean"] or 0 for k in walk], "s--", color="tab:red", label="TPOT p95")
    ax1b.axhline(CPU_SLO["A"].tpot_s * 1000, color="tab:red", lw=0.8, ls=":")
    ax1.set_xscale("log", base=2)
    ax1.set_xlabel("batch limit (worker concurrency)")
    ax1.set_ylabel("goodput (req/s)")
    ax1b.set_ylabel("TPOT p95 (ms; dotted: the SLO)")
    ax1.set_title("A: the batch-limit walk")
    names = ["B", "C", "C-no-cache"]
    x = range(len(names))
    ax2.bar([i - 0.2 for i in x], [summary[n]["ttft_ms.p95"]["mean"] or 0 for n in names], 0.4, label="TTFT p95")
    ax2.bar([i + 0.2 for i in x], [summary[n]["ttft_ms.p50"]["mean"] or 0 for n in names], 0.4, label="TTFT p50")
    ax2.set_xticks(list(x), ["B latency", "C cache on", "C cache off"])
    ax2.set_ylabel("ms")
    ax2.set_title("B and C: TTFT (MEASURED, vLLM on CPU)")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(
    out: Path,
    command: str,
    s: Sizes,
    rows: list[dict[str, Any]],
    servers: list[dict[str, Any]],
    launches: dict[str, CpuLaunch],
    t_start: float,
    duration: float,
) -> Path:
    summary = summarize_runs(rows)
    prompts: dict[str, int] = {}
    for r in rows:
        prompts.setdefault(r["engine"], int(r["engine_counters_delta"]["prompt_tokens_total"]))
    meta = metadata(
        **cpu_vllm_fields(
            t_start,
            duration,
            command,
            "vLLM OpenAI server on CPU (--dtype float32 --enforce-eager, each pipeline's CPU flags) behind "
            "gateway -> NATS -> worker-vllm",
        ),
        prompt_dataset="synthetic, seeded: A paragraphs to summarise; B one-line questions; C generated documents "
        "of numbered clauses, several questions each, with short chats beside them",
        input_length_distribution=", ".join(
            f"{k}: {prompts[k]} prompt tokens over its first run" for k in ("A", "B", "C") if k in prompts
        ),
        output_length_distribution=f"fixed (end tokens banned): A {s.a_max_tokens}, B {s.b_max_tokens} (the cap), "
        f"C {s.c_max_tokens}, C's short chats 4",
        concurrency=f"A: {s.a_streams} closed-loop streams x {s.a_requests_per_stream}; B: open loop, Poisson "
        f"{s.b_rate_per_s}/s, {s.b_requests} requests; C: {s.c_documents} document streams x {s.c_questions} "
        f"questions + {s.c_short_chats} short chats",
        warmup="A: none (each rung a fresh worker); B, C: 2 requests through each stack before round 1",
        sampling_parameters={"temperature": 0, "logit_bias": NO_EOS_BIAS},
        rounds=summary["rounds"],
        kv_cache=f"VLLM_CPU_KVCACHE_SPACE={KV_SPACE_GIB} GiB per engine",
    )
    a = summary["A"]
    cg, cn = summary["C"], summary["C-no-cache"]
    n_failed = sum(r["requests"]["failed"] for r in rows)
    note = Note(
        title="Pipelines A, B and C launched for real: vLLM on this CPU through the whole stack",
        hypothesis=(
            "A: raising the batch limit raises goodput until the queue's wait is replaced by slower steps and TTFT "
            "p95 or TPOT breaks the SLO. B: with short capped requests arriving open loop, TTFT p95 stays within a "
            "second. C: with documents asked several questions, prefix caching cuts TTFT and prefill CPU; the "
            "short chats beside them are slowed by long prefills less with chunked prefill."
        ),
        fixed_conditions=[
            "SmolLM2-135M-Instruct, fp32, vLLM-CPU, --enforce-eager, one engine group at a time on 2 shared cores",
            f"KV cache {KV_SPACE_GIB} GiB per engine; end tokens banned so every request generates its max_tokens",
            "the whole default stack per engine (gateway with budget auth, NATS, worker-vllm); the catalog's "
            "smollm2-cpu deployment allows 2,048 tokens of context, so C's documents are about 1,800 tokens",
            "A's and C's gateways let requests queue 60 s (the batch class's bound); B's answers 429 past 5 s "
            "(the dev key's interactive plan)",
        ],
        changed_variable="the pipeline (its flags and workload); in A the batch limit; in C prefix caching on/off",
        expected="A's goodput peaks at a middle rung; B meets its TTFT SLO; C with caching has the lower TTFT and "
        "a hit rate near the shared share of each prompt, without caching 0.",
        actual=(
            f"A chose batch limit {a['chosen_batch_limit']} (goodput {_c(a['at_choice']['goodput_rps'], '.3f')} "
            f"req/s); B TTFT p95 {_c(summary['B']['ttft_ms.p95'])} ms, SLO met "
            f"{_c(summary['B']['slo_attainment'], '.2f')}; C TTFT p50 with caching {_c(cg['ttft_ms.p50'])} ms, "
            f"without {_c(cn['ttft_ms.p50'])} ms, hit rate {_c(cg['prefix_hit_rate'], '.2f')} vs "
            f"{_c(cn['prefix_hit_rate'], '.2f')}, preemptions {_c(cg['preemptions'])} / {_c(cn['preemptions'])}. "
            + ("Every request succeeded." if not n_failed else f"{n_failed} requests FAILED (see results.json).")
        ),
        interpretation=(
            "On a CPU the engine's step time grows with the batch almost linearly, so A's goodput gains stop early: "
            "the walk shows where on this host. The GPU SLOs and rungs in configs/pipelines are not checked by this "
            "run, only that each pipeline's flags launch and behave as intended on vLLM."
        ),
        unverified=[
            "the GPU-only flags listed in the flags table (memory utilisation, tensor parallelism, FP8)",
            "pipeline D (FP8 weights and KV cache: GPU only)",
            "SGLang's flags of each pipeline (no CPU build)",
        ],
        next_experiment="the twin side by side on these traces (make pipelines-twin); routing by request class "
        "across the three; the §2 table at the tutorial's sizes.",
    )
    doc_rows = {"runs": rows, "summary": summary, "servers": servers,
                "cpu_launch": {k: vars(v) for k, v in launches.items()}, "sizes": vars(s)}  # fmt: skip
    return write_experiment(
        out,
        name=NAME,
        simulated=False,
        rows=doc_rows,
        table_md=table(summary, launches),
        note=note,
        command=command,
        meta=meta,
        plot=lambda p: plot(summary, p),
    )
