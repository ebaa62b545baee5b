"""Peers, side by side: the same ladder steps against the engine directly, through this
repository's stack, and through LiteLLM's proxy, interleaved in one run (``make peers``).

    python -m llmlab_loadtest.peers --steps 1,64,512            # -> results/peers/<UTC>/

One engine twin (Llama-3.1-8B on an H100, simulated) is the upstream of all three. At each step
the three targets take turns (the order rotates from step to step): a warm-up (one request per
stream, not measured), then the measured run. The client is this repository's SSE client
(``llmlab_loadtest.sse_client``) in its own process, not k6: k6 reads a stream whole, and its
time to first byte is the first token only where a server sends its headers with it (the engine
and LiteLLM send them before), while the SSE client times the first content chunk everywhere.
Per target and step: answered requests/s, output tokens/s and its ratio to the direct run, TTFT
p50/p95 and what the proxy added to it, ITL p50, E2E p50, errors, the client's CPU, and the CPU
the proxy spent per answered request (ours: gateway, router, workers, budget, accounting, NATS
and Redis; LiteLLM: its proxy process). LiteLLM runs from its own virtual environment
(``--litellm``, made by ``make peers``: ``litellm[proxy]`` pinned), with no database (the master
key only) and its local cost map (no network).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import psutil

from llmlab_loadtest.bench_meta import metadata_section
from llmlab_loadtest.ladder import GENERATE_TO_MAX, LLAMA, Target, cpu_seconds, machine_pids
from llmlab_loadtest.ladder import show as _f

log = logging.getLogger(__name__)

LITELLM_VERSION = "1.108.7"
LITELLM_ENV = Path.home() / ".cache" / "llm-inference-lab" / f"litellm-{LITELLM_VERSION}"
LITELLM_KEY = "sk-peers-litellm-master"  # a throwaway master key of a proxy that lives for one run
# LiteLLM looks a Llama-3 tokenizer up on the Hugging Face hub for model names containing
# "llama-3" (no network here): its upstream is served under a name without it.
PEER_MODEL = "peer-8b"
TARGETS = ("direct", "ours", "litellm")
OURS = ("gateway", "router", "budget", "accounting", "worker-vllm", "nats", "redis")


@contextmanager
def litellm_proxy(litellm_bin: Path, upstream: str, work: Path) -> Iterator[Any]:
    """LiteLLM's proxy in front of ``upstream`` (an OpenAI-compatible engine), one worker process;
    its log is the test kit's (``ManagedProcess``)."""
    from llmlab_testkit.procs import ManagedProcess, free_port

    work.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config = work / "litellm.yaml"
    config.write_text(
        "model_list:\n"
        f"  - model_name: {PEER_MODEL}\n"
        "    litellm_params:\n"
        f"      model: openai/{PEER_MODEL}\n"
        f"      api_base: {upstream}/v1\n"
        "      api_key: none\n"
        "litellm_settings:\n"
        "  drop_params: true\n"
        "  request_timeout: 600\n"
        "general_settings:\n"
        f"  master_key: {LITELLM_KEY}\n"
    )
    env = {
        **os.environ,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_LOG": "ERROR",
        "NO_DOCS": "True",
        "DISABLE_ADMIN_UI": "True",
    }
    env.pop("DATABASE_URL", None)
    cmd = [str(litellm_bin), "--config", str(config), "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"]
    proc = ManagedProcess("litellm", cmd, env, ready_url=f"http://127.0.0.1:{port}/health/liveliness").start()
    proc.port = port  # type: ignore[attr-defined]
    try:
        proc.wait_ready(timeout=120)
        yield proc
    finally:
        proc.stop()


@contextmanager
def peer_targets(litellm_bin: Path, work: Path) -> Iterator[dict[str, Target]]:
    """Two twins of the same engine (one serves our catalog's name, one a name LiteLLM takes
    offline; one runs at a time under load), our default stack over the first, LiteLLM over the
    second, and the first again for the direct run."""
    from llmlab_testkit.budget import BudgetAdmin
    from llmlab_testkit.procs import Stack, unique_namespace, url

    twin = ["--mode", "twin", "--twin-device", "H100-SXM", "--twin-model", "Llama-3.1-8B"]
    with ExitStack() as stack_cm:
        stack = Stack(namespace=unique_namespace())
        stack_cm.callback(stack.close)
        sim = stack.sim("vllm", LLAMA, max_num_seqs=256, output_len=GENERATE_TO_MAX, extra=twin)
        sim_peer = stack.sim("vllm", PEER_MODEL, max_num_seqs=256, output_len=GENERATE_TO_MAX, extra=twin)
        worker = stack.worker("vllm", "gpu-vllm", url(sim), max_concurrency=256)
        budget = stack.budget()
        router = stack.router()
        accounting = stack.accounting()
        admin = BudgetAdmin(url(budget))
        # One key drives all the streams (the SSE client sends one), with room above the plan's
        # 512 concurrent: a slot is held until the budget service settles the request's event, so
        # under load a user's count runs ahead of its open streams (seen: 2x the streams at 64).
        keys = [admin.provision("enterprise", {"user": {"max_concurrent": 8192}}).api_key]
        admin.close()
        gw = stack.gateway(auth="budget", router="service")
        proxy = stack_cm.enter_context(litellm_proxy(litellm_bin, url(sim_peer), work))
        infra = machine_pids()
        engine = "engine-sim --mode twin, Llama-3.1-8B on one H100-SXM (bf16), SIMULATED"
        ours_pids = {"gateway": gw.pid, "router": router.pid, "budget": budget.pid, "accounting": accounting.pid}
        ours_pids |= {"worker-vllm": worker.pid, **infra, "twin-llama": sim.pid}
        yield {
            "direct": Target(
                url=url(sim),
                api_keys=["none"],
                model=LLAMA,
                class_models="",
                description="the engine twin directly",
                simulated=True,
                engine=engine,
                pids={"twin-llama": sim.pid},
                metrics={"twin-llama": f"{url(sim)}/metrics"},
            ),
            "ours": Target(
                url=url(gw),
                api_keys=keys,
                model=LLAMA,
                class_models="",
                description="this repository's default stack (budget auth, router service, accounting, worker-vllm)",
                simulated=True,
                engine=engine,
                pids=ours_pids,
                metrics={n: f"{url(p)}/metrics" for n, p in (("gateway", gw), ("router", router), ("twin-llama", sim))},
            ),
            "litellm": Target(
                url=f"http://127.0.0.1:{proxy.port}",
                api_keys=[LITELLM_KEY],
                model=PEER_MODEL,
                class_models="",
                description=f"LiteLLM {LITELLM_VERSION} proxy (one worker, no database)",
                simulated=True,
                engine=engine,
                pids={"litellm": proxy.pid, "twin-llama": sim_peer.pid},
                metrics={"twin-llama": f"{url(sim_peer)}/metrics"},
            ),
        }


def proxy_cpu(target: str, cpu: dict[str, float]) -> float:
    """What the proxy spent (cores or seconds), the engine and the client apart."""
    if target == "ours":
        return sum(cpu.get(n, 0.0) for n in OURS)
    if target == "litellm":
        return cpu.get("litellm", 0.0)
    return 0.0


def sse_run(target: Target, streams: int, per_stream: int, max_tokens: int, out: Path) -> dict[str, Any]:
    """One run of the SSE client in its own process; returns its summary and the CPU seconds each
    watched process spent meanwhile (``cpu_s``) over the client's wall time (``wall_s``)."""
    cmd = [
        sys.executable, "-m", "llmlab_loadtest.sse_client",
        "--url", f"{target.url}/v1/chat/completions", "--model", target.model, "--api-key", target.api_keys[0],
        "--concurrency", str(streams), "--requests-per-stream", str(per_stream), "--max-tokens", str(max_tokens),
        "--summary-only", "--out", str(out), "--log-level", "WARNING",
    ]  # fmt: skip
    procs = {name: psutil.Process(pid) for name, pid in target.pids.items()}
    before = cpu_seconds(procs)
    t0 = time.monotonic()
    subprocess.run(cmd, check=True, timeout=600, capture_output=True)
    wall = time.monotonic() - t0
    after = cpu_seconds(procs)
    doc = json.loads(out.read_text())
    return {
        "summary": doc["summary"],
        "cpu_s": {n: after[n] - before[n] for n in after if n in before},
        "wall_s": wall,
    }


def summarise(run: dict[str, Any], target: str, step: int) -> dict[str, Any]:
    s = run["summary"]
    ok = s["requests"]["ok"]
    window = s["window_s"]
    proxy_s = proxy_cpu(target, run["cpu_s"])
    return {
        "target": target,
        "step": step,
        "requests": s["requests"]["total"],
        "answered": ok,
        "errors": {k: v for k, v in s["errors"].items() if v},
        "answered_rps": ok / window if window else 0.0,
        "output_tokens_per_s": s["output_tokens_per_s"] or 0.0,
        "ttft_ms": {q: s["ttft_ms"][q] for q in ("p50", "p95", "p99")},
        "itl_ms": {q: s["itl_ms"][q] for q in ("p50", "p95", "p99")},
        "e2e_ms": {q: s["e2e_ms"][q] for q in ("p50", "p95", "p99")},
        "proxy_cores": proxy_s / run["wall_s"],
        "proxy_cpu_ms_per_request": 1000 * proxy_s / ok if ok else None,
        "client_cpu_util": s["client"]["cpu_util"],
        "engine_cores": run["cpu_s"].get("twin-llama", 0.0) / run["wall_s"],
        "window_s": window,
    }


def compare(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each proxy against the direct run of the same step: added TTFT, tokens/s ratio."""
    direct = {r["step"]: r for r in rows if r["target"] == "direct"}
    out = []
    for r in rows:
        d = direct.get(r["step"])
        c = dict(r)
        if d and r["target"] != "direct":
            for q in ("p50", "p95"):
                a, b = r["ttft_ms"][q], d["ttft_ms"][q]
                c[f"added_ttft_{q}_ms"] = None if a is None or b is None else a - b
            base = d["output_tokens_per_s"]
            c["tokens_ratio"] = r["output_tokens_per_s"] / base if base else None
        out.append(c)
    return out


def _pct(v: float | None) -> float | None:
    return None if v is None else 100 * v


def table(rows: list[dict[str, Any]]) -> list[str]:
    """Direct / ours / LiteLLM per step, one line each."""
    lines = [
        "| step (streams) | target | requests | answered req/s | out tok/s | tokens ratio | TTFT p50 / p95 ms "
        "| added TTFT p50 / p95 ms | ITL p50 ms | E2E p50 ms | errors | proxy CPU ms/request | client CPU |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        errors = ", ".join(f"{k} {v}" for k, v in r["errors"].items()) or "0"
        lines.append(
            f"| {r['step']} | {r['target']} | {r['requests']} | {r['answered_rps']:.2f} | "
            f"{r['output_tokens_per_s']:.0f} | {_f(r.get('tokens_ratio'), '{:.2f}')} | "
            f"{_f(r['ttft_ms']['p50'], '{:.1f}')} / {_f(r['ttft_ms']['p95'], '{:.1f}')} | "
            f"{_f(r.get('added_ttft_p50_ms'), '{:.1f}')} / {_f(r.get('added_ttft_p95_ms'), '{:.1f}')} | "
            f"{_f(r['itl_ms']['p50'], '{:.1f}')} | {_f(r['e2e_ms']['p50'])} | {errors} | "
            f"{_f(r['proxy_cpu_ms_per_request'], '{:.2f}')} | {_f(_pct(r['client_cpu_util']))}% |"
        )
    return lines


def markdown(doc: dict[str, Any]) -> str:
    lines = [
        "# Peers: the engine directly, this stack, LiteLLM's proxy (interleaved, simulated engine)",
        "",
        f"Upstream: {doc['engine']}. Client: {CLIENT_NOTE} {doc['max_tokens']} output tokens per request; "
        "per stream and step: one warm-up request, then the measured requests "
        f"({', '.join(f'{k}: {v}' for k, v in doc['requests_per_stream'].items())} per stream at each step). "
        f"{MEANING}",
        "",
        *table(doc["rows"]),
        "",
        PEERS_NOTE,
        "",
        *metadata_section(doc["metadata"]),
    ]
    return "\n".join(lines)


CLIENT_NOTE = (
    "this repository's SSE client (llmlab_loadtest.sse_client, its own process), which times the first content "
    "chunk: k6's time to first byte is not the first token against the engine or LiteLLM, which send their "
    "headers first."
)
MEANING = (
    "The targets take turns within each step (order rotating). Added TTFT = the proxy's TTFT minus the direct "
    "run's at the same step; tokens ratio = output tokens/s over the direct run's; proxy CPU = what the proxy's "
    "processes spent during the run per answered request (ours: gateway, router, worker, budget, accounting, "
    "NATS, Redis; LiteLLM: its proxy process); client CPU = the client's share of one core over the run."
)
PEERS_NOTE = (
    "All three share this 2-core machine with the engine twin and the client: where the machine is busy, a "
    "proxy's CPU per request is what limits it. Simulated engine: the figures compare the proxies, not GPUs."
)


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    steps = sorted({r["step"] for r in doc["rows"]})
    for target in TARGETS:
        rows = {r["step"]: r for r in doc["rows"] if r["target"] == target}
        xs = [s for s in steps if s in rows]
        axes[0].plot(xs, [rows[s]["ttft_ms"]["p50"] for s in xs], marker="o", label=target)
        axes[1].plot(xs, [rows[s]["output_tokens_per_s"] for s in xs], marker="o", label=target)
    for ax, title, unit in ((axes[0], "TTFT p50", "ms"), (axes[1], "output tokens/s", "tokens/s")):
        ax.set_xscale("log")
        ax.set_xlabel("open connections (k6 clients)")
        ax.set_ylabel(unit)
        ax.set_title(f"{title} (simulated engine)")
        ax.legend()
    axes[0].set_yscale("log")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--steps", default="1,64,512")
    ap.add_argument(
        "--requests", type=int, default=1024, help="measured requests per target and step (at least 2 per stream)"
    )
    ap.add_argument("--max-per-stream", type=int, default=64, help="caps a step's run (1 stream: 64 requests)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--litellm", type=Path, default=LITELLM_ENV / "bin" / "litellm", help="LiteLLM's CLI")
    ap.add_argument("--out", type=Path, default=Path("results"))
    a = ap.parse_args(argv)
    if not a.litellm.exists():
        raise SystemExit(f"{a.litellm} missing: make peers installs LiteLLM {LITELLM_VERSION} in its own venv")
    steps = [int(s) for s in a.steps.split(",") if s.strip()]
    per_stream = {vus: min(a.max_per_stream, max(2, a.requests // vus)) for vus in steps}
    started = dt.datetime.now(dt.UTC)
    work = a.out / "tmp" / "peers"
    work.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    with peer_targets(a.litellm, work) as targets:
        for i, vus in enumerate(steps):
            order = TARGETS[i % 3 :] + TARGETS[: i % 3]
            for name in order:
                log.info("step %d, %s: warm-up, then %d requests per stream", vus, name, per_stream[vus])
                sse_run(targets[name], vus, 1, a.max_tokens, work / f"{name}-{vus}-warmup.json")
                run = sse_run(targets[name], vus, per_stream[vus], a.max_tokens, work / f"{name}-{vus}.json")
                row = summarise(run, name, vus)
                rows.append(row)
                log.info(
                    "step %d, %s: %.2f answered/s, TTFT p50 %s ms, proxy %.2f cores, client %s of a core",
                    vus,
                    name,
                    row["answered_rps"],
                    _f(row["ttft_ms"]["p50"], "{:.1f}"),
                    row["proxy_cores"],
                    row["client_cpu_util"],
                )
        engine = targets["direct"].engine
    from llmlab_loadtest.bench_meta import metadata_block, write_outputs

    doc = {
        "rows": compare(sorted(rows, key=lambda r: (r["step"], TARGETS.index(r["target"])))),
        "engine": engine,
        "max_tokens": a.max_tokens,
        "requests_per_stream": {str(k): v for k, v in per_stream.items()},
        "litellm_version": LITELLM_VERSION,
        "metadata": metadata_block(
            started=started,
            duration_s=(dt.datetime.now(dt.UTC) - started).total_seconds(),
            engine=engine,
            model_id=f"{LLAMA} (LiteLLM's upstream serves it as {PEER_MODEL})",
            concurrency=steps,
            warmup="one request per stream per target and step, not measured",
            prompt_dataset="one fixed short prompt (llmlab_loadtest.sse_client DEFAULT_PROMPT)",
            input_length_distribution="fixed (the one prompt)",
            output_length_distribution=f"max_tokens {a.max_tokens} (the engine generates up to it)",
            sampling_parameters="server defaults, stream with include_usage",
            command=shlex.join(["python", "-m", "llmlab_loadtest.peers", *argv]),
            simulated=True,
            client="llmlab_loadtest.sse_client in its own process; its CPU per row (client_cpu_util)",
            litellm=f"litellm[proxy]=={LITELLM_VERSION}, one worker, no database, local cost map",
        ),
    }
    paths = write_outputs(doc, a.out, started, "peers", markdown, plot)
    log.info("peers: written %s", paths["json"].parent)
    return 0


if __name__ == "__main__":
    sys.exit(main())
