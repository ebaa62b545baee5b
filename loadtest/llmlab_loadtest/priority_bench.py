"""Admission and plan priority under overload (resilience issue; ``make bench WORKLOAD=priority``).

1,000 streams against one saturated worker (64 slots, simulated engine): 950 from a free-plan key
(priority 0) start at once, and 1 s later, with that flood queued, 50 from an enterprise key
(priority 2), through the whole gateway with budget auth. Two variants, interleaved
(``priority, fifo, priority, fifo``), each on a fresh stack:

* ``priority``: what ships (admission by predicted wait on, one queue per plan priority);
* ``fifo``: the behaviour before, for comparison: admission off and the 50 on the free plan too,
  so every request waits in one FIFO queue.

Per variant and class it reports the answered and refused requests (429 by code), TTFT p50/p95 of
the answered ones (send to first content chunk, as the client saw it) and how fast admission's
429s came (send to response headers). The flood's own 429s wait for the gateway to get through the
burst's admission work; a probe (30 requests one after another, from 1 s after the enterprise ones,
through a second gateway whose queue bound is 0.5 s) times a refusal alone on the saturated pool.
Targets: the enterprise requests' TTFT p95 within their SLO class's ``ttft_p95_s`` (catalog: 1 s),
none of them refused, and the probe's refusals within 50 ms (p95). Each load
client runs in its own process; its CPU is in the result. Simulated engine: the figures are the
control plane's, not a GPU's.

    python -m llmlab_loadtest.priority_bench [--repeats 2] [--out results]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from llmlab_common.catalog import load_catalog
from llmlab_common.settings import DEFAULT_CATALOG
from llmlab_common.stats import quantile
from llmlab_testkit.budget import BudgetAdmin
from llmlab_testkit.procs import unique_namespace, url

from llmlab_loadtest import bench_meta
from llmlab_loadtest.relay_bench import BenchStack
from llmlab_loadtest.sse_client import http_error_code

log = logging.getLogger("priority_bench")
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
POOL = "gpu-vllm"
PREFIX = "priority"
REFUSAL_TARGET_MS = 50.0
PROBE_BOUND_S = 0.5  # the probe gateway's queue bound
PROBE_AFTER_S = 1.0  # after the enterprise requests, with the flood queued
PROBE_REQUESTS = 30  # one after another
UNLIMITED = dict.fromkeys(("daily_tokens", "monthly_tokens", "rpm", "tpm", "max_concurrent"), "unlimited")


@dataclass(frozen=True)
class Config:
    streams: int = 1000
    high: int = 50
    slots: int = 64
    tokens: int = 25
    ttft_ms: float = 50.0
    itl_ms: float = 20.0
    heartbeat_s: float = 0.5
    # The enterprise requests arrive this long after the free-plan flood (already queued).
    high_delay_s: float = 1.0
    repeats: int = 2
    out: Path = Path("results")
    dirty: bool = False


@dataclass(frozen=True)
class Variant:
    name: str
    admission: bool
    high_plan: str


VARIANTS = (Variant("priority", True, "enterprise"), Variant("fifo", False, "free"))


def _client(
    gw_url: str, key: str, streams: int, tokens: int, out: Path, per_stream: int = 1
) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "llmlab_loadtest.sse_client", "--url", gw_url + "/v1/chat/completions"]
    cmd += ["--model", MODEL, "--api-key", key, "--concurrency", str(streams), "--max-tokens", str(tokens)]
    cmd += ["--requests-per-stream", str(per_stream)]
    cmd += ["--timeout", "120", "--out", str(out), "--log-level", "WARNING"]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL)


def _code(rec: dict[str, Any]) -> str:
    """The error code of a refused request (from the OpenAI-shaped body the client kept)."""
    return http_error_code(rec.get("error")) or rec.get("error_kind") or "error"


def class_summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Answered and refused requests of one class, TTFT of the answered (ms) and how fast the
    admission refusals came (ms)."""
    ok = [r for r in records if r["ok"]]
    ttft = sorted(r["chunk_times"][0] * 1000 for r in ok if r["chunk_times"])
    refused: dict[str, int] = {}
    for r in records:
        if not r["ok"]:
            key = f"{r['status']} {_code(r)}" if r.get("status") else _code(r)
            refused[key] = refused.get(key, 0) + 1
    fast = sorted(
        r["headers_at"] * 1000
        for r in records
        if r.get("status") == 429 and _code(r) == "queue_wait_predicted" and r.get("headers_at") is not None
    )

    def q(values: list[float], p: float) -> float | None:
        return round(quantile(values, p), 1) if values else None

    return {
        "requests": len(records),
        "answered": len(ok),
        "refused": refused,
        "ttft_ms": {"p50": q(ttft, 0.5), "p95": q(ttft, 0.95), "max": round(ttft[-1], 1) if ttft else None},
        "admission_429_ms": {"n": len(fast), "p50": q(fast, 0.5), "p95": q(fast, 0.95), "max": q(fast, 1.0)},
    }


def run_variant(cfg: Config, v: Variant, tmp: Path) -> dict[str, Any]:
    stack = BenchStack(namespace=unique_namespace())
    try:
        sim = stack.sim("vllm", MODEL, ttft_ms=cfg.ttft_ms, itl_ms=cfg.itl_ms, output_len=cfg.tokens)
        stack.worker("vllm", POOL, url(sim), max_concurrency=cfg.slots, heartbeat_s=cfg.heartbeat_s)
        admin = BudgetAdmin(url(stack.budget()))
        scopes = {"key": UNLIMITED, "user": UNLIMITED, "team": UNLIMITED}
        low_key = admin.provision("free", scopes).api_key
        high_key = admin.provision(v.high_plan, scopes).api_key
        admin.close()
        gw = stack.gateway(auth="budget", env={"LLMLAB_GATEWAY_ADMISSION": str(v.admission).lower()})
        base = url(gw)
        # The probe's own gateway, with a bound of PROBE_BOUND_S: while the flood keeps the worker
        # saturated, each of its requests is predicted over that bound. Its 429s time the refusal
        # alone, apart from the flood's own admission work (the flood's gateway is busy with it).
        probe_gw = stack.gateway(auth="budget", queue_timeout_s=PROBE_BOUND_S) if v.admission else None
        # Warm-up: one round of the worker's slots, so its heartbeats carry a service time.
        warm = _client(base, low_key, cfg.slots, cfg.tokens, tmp / f"{v.name}-warmup.json")
        warm.wait(120)
        time.sleep(3 * cfg.heartbeat_s)
        t0 = time.monotonic()
        low = _client(base, low_key, cfg.streams - cfg.high, cfg.tokens, tmp / f"{v.name}-low.json")
        time.sleep(cfg.high_delay_s)
        high = _client(base, high_key, cfg.high, cfg.tokens, tmp / f"{v.name}-high.json")
        clients = {"low": low, "high": high}
        if probe_gw is not None:
            time.sleep(PROBE_AFTER_S)
            clients["probe"] = _client(
                url(probe_gw), low_key, 1, cfg.tokens, tmp / f"{v.name}-probe.json", per_stream=PROBE_REQUESTS
            )
        for proc in clients.values():
            proc.wait(300)
        wall = time.monotonic() - t0
        docs = {name: json.loads((tmp / f"{v.name}-{name}.json").read_text()) for name in clients}
        with httpx.Client(timeout=5) as h:
            gw_metrics = h.get(base + "/metrics").text
        request_lines = [ln for ln in gw_metrics.splitlines() if ln.startswith("llmlab_gateway_requests_total{")]
        return {
            "variant": v.name,
            "admission": v.admission,
            "high_plan": v.high_plan,
            "wall_s": round(wall, 2),
            "classes": {name: class_summary(doc["requests"]) for name, doc in docs.items()},
            "clients_cpu": {name: doc["summary"].get("client") for name, doc in docs.items()},
            "gateway_requests_total": request_lines,
        }
    finally:
        stack.close()


def verdicts(runs: list[dict[str, Any]], slo_ttft_ms: float) -> dict[str, Any]:
    """MET/MISS per target, over every run of the shipped variant (all must meet it)."""
    shipped = [r for r in runs if r["variant"] == "priority"]
    high_p95 = [r["classes"]["high"]["ttft_ms"]["p95"] for r in shipped]
    fast_p95 = [r["classes"]["probe"]["admission_429_ms"]["p95"] for r in shipped]
    high_refused = [sum(r["classes"]["high"]["refused"].values()) for r in shipped]
    return {
        "high_ttft_p95_within_slo": {
            "limit_ms": slo_ttft_ms,
            "values_ms": high_p95,
            "met": all(p is not None and p <= slo_ttft_ms for p in high_p95),
        },
        "high_never_refused": {"values": high_refused, "met": all(n == 0 for n in high_refused)},
        "admission_429_p95_within_50ms": {
            "limit_ms": REFUSAL_TARGET_MS,
            "values_ms": fast_p95,
            "met": all(p is not None and p <= REFUSAL_TARGET_MS for p in fast_p95),
        },
    }


def markdown(doc: dict[str, Any]) -> str:
    lines = [
        "# Admission and plan priority under overload (simulated engine)",
        "",
        f"{doc['config']['streams']} streams against one worker of {doc['config']['slots']} slots: "
        f"{doc['config']['streams'] - doc['config']['high']} free-plan (priority 0) at once, then, "
        f"{doc['config']['high_delay_s']:.0f} s later, {doc['config']['high']} enterprise (priority 2); "
        f"{doc['config']['tokens']} tokens each at ITL {doc['config']['itl_ms']:.0f} ms. "
        "`priority`: admission and priority queues on (as shipped); `fifo`: admission off and one queue.",
        "",
        "| run | variant | class | answered | refused | TTFT p50 ms | TTFT p95 ms | admission 429 p50/p95/max ms |",
        "|---:|---|---|---:|---|---:|---:|---|",
    ]
    for i, r in enumerate(doc["runs"], 1):
        for name in ("high", "low", "probe"):
            if name not in r["classes"]:
                continue
            c = r["classes"][name]
            f = c["admission_429_ms"]
            refused = ", ".join(f"{k}: {n}" for k, n in sorted(c["refused"].items())) or "0"
            fast = f"{f['p50']}/{f['p95']}/{f['max']} (n={f['n']})" if f["n"] else "-"
            lines.append(
                f"| {i} | {r['variant']} | {name} | {c['answered']}/{c['requests']} | {refused} | "
                f"{c['ttft_ms']['p50']} | {c['ttft_ms']['p95']} | {fast} |"
            )
    lines += ["", "## Targets", "", "| target | values | verdict |", "|---|---|---|"]
    for name, t in doc["verdicts"].items():
        values = t.get("values_ms", t.get("values"))
        lines.append(f"| {name} | {values} | {'MET' if t['met'] else 'MISS'} |")
    lines += ["", "Load clients' CPU (own processes, per run):", ""]
    for i, r in enumerate(doc["runs"], 1):
        lines.append(f"- run {i} ({r['variant']}): {json.dumps(r['clients_cpu'])}")
    lines.append("")
    lines += bench_meta.metadata_section(doc["metadata"])
    return "\n".join(lines)


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    names = []
    p50s, p95s = [], []
    for i, r in enumerate(doc["runs"], 1):
        for cls in ("high", "low"):
            t = r["classes"][cls]["ttft_ms"]
            names.append(f"{i}:{r['variant']}\n{cls}")
            p50s.append(t["p50"] or 0)
            p95s.append(t["p95"] or 0)
    xs = range(len(names))
    ax.bar([x - 0.2 for x in xs], p50s, width=0.4, label="TTFT p50")
    ax.bar([x + 0.2 for x in xs], p95s, width=0.4, label="TTFT p95")
    ax.axhline(doc["verdicts"]["high_ttft_p95_within_slo"]["limit_ms"], color="red", ls="--", label="SLO TTFT")
    ax.set_xticks(list(xs), names, fontsize=7)
    ax.set_ylabel("ms (answered requests)")
    ax.set_title("TTFT by plan class, priority queues vs one FIFO queue (simulated)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", type=int, default=Config.streams)
    p.add_argument("--high", type=int, default=Config.high, help="enterprise streams among them")
    p.add_argument("--slots", type=int, default=Config.slots, help="the worker's max_concurrency")
    p.add_argument("--tokens", type=int, default=Config.tokens)
    p.add_argument("--repeats", type=int, default=Config.repeats, help="rounds of (priority, fifo)")
    p.add_argument("--out", type=Path, default=Config.out)
    p.add_argument("--dirty", action="store_true", help="benchmark a modified tree (the result says so)")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    cfg = Config(a.streams, a.high, a.slots, a.tokens, repeats=a.repeats, out=a.out, dirty=a.dirty)
    bench_meta.require_committed(cfg.dirty)
    started = dt.datetime.now(dt.UTC)
    t0 = time.monotonic()
    tmp = cfg.out / "tmp" / f"priority-{started:%Y%m%dT%H%M%S}"
    tmp.mkdir(parents=True, exist_ok=True)
    runs = []
    for i in range(cfg.repeats):
        for v in VARIANTS:
            log.info("round %d/%d: %s", i + 1, cfg.repeats, v.name)
            runs.append(run_variant(cfg, v, tmp))
            c = runs[-1]["classes"]
            log.info("  high %s | low %s", json.dumps(c["high"]["ttft_ms"]), json.dumps(c["low"]["refused"]))
    catalog = load_catalog(DEFAULT_CATALOG)
    slo = catalog.slo_classes[catalog.plans["enterprise"].slo_class]
    doc = {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in cfg.__dict__.items()},
        "runs": runs,
        "verdicts": verdicts(runs, (slo.ttft_p95_s or 1.0) * 1000),
        "metadata": bench_meta.metadata_block(
            started=started,
            duration_s=time.monotonic() - t0,
            engine="llmlab-engine-sim (vllm flavour)",
            model_id=MODEL,
            concurrency=f"{cfg.streams - cfg.high} free-plan streams at once, {cfg.high} enterprise "
            f"{cfg.high_delay_s:.0f} s later; one worker of {cfg.slots} slots",
            warmup=f"one round of {cfg.slots} requests per stack (the worker's service time)",
            prompt_dataset="sse_client's default prompt",
            input_length_distribution="fixed (one prompt)",
            output_length_distribution=f"fixed: {cfg.tokens} tokens",
            sampling_parameters={"max_tokens": cfg.tokens},
            command=" ".join([sys.executable, "-m", "llmlab_loadtest.priority_bench", *(argv or sys.argv[1:])]),
        ),
    }
    paths = bench_meta.write_outputs(doc, cfg.out, started, PREFIX, markdown, plot)
    log.info("wrote %s", paths["md"])
    sys.stdout.write(markdown(doc) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
