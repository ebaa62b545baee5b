"""`make demo`: talk to the running stack (`make up`) the way a user would, then load it and report.

1. the official openai SDK: list models, a unary answer, a streamed answer printed as it arrives,
   a completion, and what errors look like;
2. a load run with our SSE client (its own process) on both simulated deployments at once;
3. a report under results/: demo-<ts>.md (table + queue/prefill/decode attribution from the
   workers' metrics), demo-<ts>.json (raw) and demo-<ts>.png (TTFT distribution, tokens/s);
4. (printed as 5.) the cost report, after attributing the run's GPU time (accounting's
   /admin/v1/attribute), under results/demo-<ts>-cost/;
5. (6.) the Grafana dashboards' panels over the run, rendered from Prometheus into one PNG per row
   under results/demo-<ts>-dashboards/ (when `make up` could start Prometheus);
6. (7.) where the slowest request's time went (python -m llmlab_accounting.explain --slowest).

Figures come from the engine simulator, not a GPU, and are labelled so.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
from llmlab_common.metrics import parse_prometheus_text
from llmlab_loadtest.bench_meta import metadata_block

REPO = Path(__file__).resolve().parents[1]

log = logging.getLogger("demo")
RUN_DIR = Path(os.environ.get("LLMLAB_RUN_DIR", REPO / ".run"))


def api_key(name: str = "api-key") -> str:
    """A demo tenant's key, written by scripts/stack.sh (llmlab_budget.bootstrap)."""
    if name == "api-key" and os.environ.get("LLMLAB_API_KEY"):
        return os.environ["LLMLAB_API_KEY"]
    return (RUN_DIR / name).read_text().strip()


LOAD = [  # model, concurrent streams, requests per stream, max_tokens
    ("meta-llama/Llama-3.1-8B-Instruct", 150, 2, 64),
    ("Qwen/Qwen3-32B", 50, 2, 64),
]
WORKERS = {  # same variables as scripts/stack.sh
    "worker-vllm": int(os.environ.get("WORKER_VLLM_PORT", "8091")),
    "worker-sglang": int(os.environ.get("WORKER_SGLANG_PORT", "8092")),
}


# Requests the demo saw answered (tours and load): the cost report waits until ClickHouse holds
# this many attempts, not merely until the count pauses (an insert slower than a poll interval on
# a busy machine looked like the end of ingest and printed a short count).
ANSWERED = 0


def answered(n: int = 1) -> None:
    global ANSWERED
    ANSWERED += n


def say(text: str = "") -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def sdk_tour(base: str) -> None:
    client = openai.OpenAI(base_url=base + "/v1", api_key=api_key(), max_retries=0)
    say("== 1. the openai SDK against the gateway")
    say("models: " + ", ".join(m.id for m in client.models.list().data))
    t0 = time.monotonic()
    r = client.chat.completions.create(
        model="meta-llama/Llama-3.1-8B-Instruct", messages=[{"role": "user", "content": "Say hello."}], max_tokens=12
    )
    answered()
    say(
        f"unary  ({time.monotonic() - t0:.2f}s, finish={r.choices[0].finish_reason}, "
        f"usage={r.usage.model_dump() if r.usage else None}):"
    )
    say(f"  {r.choices[0].message.content!r}")
    say("stream (Qwen/Qwen3-32B via the SGLang-flavoured worker), tokens as they arrive:")
    t0 = time.monotonic()
    first = None
    sys.stdout.write("  ")
    stream = client.chat.completions.create(
        model="best",
        messages=[{"role": "user", "content": "Tell me a story."}],
        max_tokens=24,
        stream=True,
        stream_options={"include_usage": True},
    )
    usage = None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        elif chunk.choices and chunk.choices[0].delta.content:
            first = first or time.monotonic() - t0
            sys.stdout.write(chunk.choices[0].delta.content)
            sys.stdout.flush()
    answered()
    say(
        f"\n  (TTFT {first or 0:.3f}s, total {time.monotonic() - t0:.2f}s, "
        f"usage {usage.model_dump() if usage else None})"
    )
    c = client.completions.create(model="fast", prompt="The capital of France is", max_tokens=6)
    answered()
    say(f"completion: {c.choices[0].text!r} ({c.choices[0].finish_reason})")
    say("errors are OpenAI-shaped:")
    for label, call in (
        (
            "unknown model",
            lambda: client.chat.completions.create(model="gpt-17", messages=[{"role": "user", "content": "x"}]),
        ),
        (
            "no worker for the pool (SmolLM2 runs on real vLLM only in the tests)",
            lambda: client.chat.completions.create(
                model="SmolLM2-135M-Instruct", messages=[{"role": "user", "content": "x"}]
            ),
        ),
        ("n=2", lambda: client.chat.completions.create(model="auto", n=2, messages=[{"role": "user", "content": "x"}])),
        (
            "wrong API key",
            lambda: client.with_options(api_key="sk-llm-not-a-real-key").models.list(),
        ),
        (
            "over budget (a key with 100 tokens a day; refused before any worker sees it)",
            lambda: client.with_options(api_key=api_key("api-key-tiny")).chat.completions.create(
                model="auto", messages=[{"role": "user", "content": "Tell me everything."}], max_tokens=500
            ),
        ),
    ):
        try:
            call()
        except openai.APIStatusError as exc:
            say(f"  {label}: HTTP {exc.status_code} {json.dumps(exc.body)}")


def routing_tour(base: str) -> None:
    """Aliases carry a routing policy; the response names the deployment; the router logs why."""
    client = openai.OpenAI(base_url=base + "/v1", api_key=api_key(), max_retries=0)
    say("\n== 2. routing: one decision over model and replica (policy per alias, header per response)")
    last = ""
    for alias in ("auto", "fast", "cheap", "best"):
        raw = client.chat.completions.with_raw_response.create(
            model=alias, messages=[{"role": "user", "content": "Compare two sorting algorithms."}], max_tokens=8
        )
        answered()
        h = raw.headers
        last = h["x-request-id"]
        say(f"  {alias:<5} -> {h['x-llmlab-deployment']:<18} (policy {h['x-llmlab-route-policy']})")
    hard = client.chat.completions.with_raw_response.create(
        model="auto",
        messages=[{"role": "user", "content": "Hello"}],
        max_tokens=8,
        extra_headers={"x-llmlab-quality-floor": "0.7"},
    )
    answered()
    say(f"  auto with x-llmlab-quality-floor: 0.7 -> {hard.headers['x-llmlab-deployment']}")
    log_path = RUN_DIR / "router-decisions.jsonl"
    if log_path.exists():
        say(f"  python -m llmlab_router explain {last} --log {log_path}:")
        out = subprocess.run(
            [sys.executable, "-m", "llmlab_router", "explain", last, "--log", str(log_path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        say("    " + (out.stdout or out.stderr).strip().replace("\n", "\n    "))


ACCOUNTING = f"http://127.0.0.1:{os.environ.get('ACCOUNTING_PORT', '8086')}"
PROMETHEUS = f"http://127.0.0.1:{os.environ.get('PROMETHEUS_PORT', '9090')}"
ADMIN = {"Authorization": "Bearer sk-admin-dev"}  # the documented dev admin key (refused in prod)


def wait_for_attempts() -> int | None:
    """Until every answered request is in ClickHouse (a flush is 1 s, an insert on a busy machine
    longer) and the count then holds still (a duplicate would show as more); a short count is
    returned as is. None: the accounting service is not reachable."""
    sql = {"sql": "SELECT count() FROM attempts"}
    last, stable = -1, 0
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            n = httpx.post(ACCOUNTING + "/admin/v1/query", json=sql, headers=ADMIN, timeout=5).json()["rows"][0][0]
        except (httpx.HTTPError, KeyError, IndexError, ValueError):
            return None
        stable = stable + 1 if n == last else 0
        last = n
        if n >= ANSWERED and stable >= 3:
            break
        time.sleep(0.5)
    return last


def cost_report(out: Path, since: float, attempts: int) -> list[str]:
    """Every request above went through accounting into ClickHouse (chdb): attribute the demo's
    GPU time now (the attribution loop would reach it only a period plus its lag after the run),
    then run the SQL reports. Returns the lines to print."""
    r = httpx.post(ACCOUNTING + "/admin/v1/attribute", json={"start": since}, headers=ADMIN, timeout=120)
    r.raise_for_status()
    a = r.json()
    lines = [
        f"\n== 5. cost report: {attempts} attempts in ClickHouse (chdb) for {ANSWERED} answered requests; "
        f"GPU time attributed for the demo's "
        f"{a['periods']} period(s): ${a['gpu_cost_usd']:.4f} of GPU time (simulated GPUs at catalog prices) "
        f"-> {out}/ (make report runs the same)"
    ]
    # Its progress lines (one per report) would bury the table below: shown only if it fails.
    r = subprocess.run(
        [sys.executable, "-m", "llmlab_accounting.report", "--url", ACCOUNTING, "--out", str(out)],
        timeout=300,
        capture_output=True,
        text=True,
        check=False,
    )
    if r.returncode != 0:
        return [*lines, f"  report failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}"]
    table = out / "cost_by_model_day.md"
    if table.exists():
        lines.append(table.read_text().strip())
    return lines


def dashboards(since: float, out: Path) -> list[str]:
    """The Grafana dashboards' panels over the demo, rendered from Prometheus (no Grafana here)."""
    try:
        httpx.get(PROMETHEUS + "/-/ready", timeout=2).raise_for_status()
    except httpx.HTTPError:
        return [f"\n== 6. dashboards: no Prometheus at {PROMETHEUS} (see `make up`'s output); snapshot skipped"]
    time.sleep(6)  # one more scrape and rule evaluation after the last request
    end = time.time()
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "llmlab_lab.dashboards",
            "snapshot",
            "--prometheus",
            PROMETHEUS,
            "--start",
            str(since),
            "--end",
            str(end),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if r.returncode != 0:
        return [f"\n== 6. dashboards: snapshot failed: {r.stderr.strip()[-500:]}"]
    lines = [f"\n== 6. dashboards (every panel's query over the demo, from Prometheus at {PROMETHEUS}): {out}/"]
    return lines + [f"  {png}" for png in sorted(out.glob("*.png"))]


def explain_slowest(since: float) -> list[str]:
    minutes = (time.time() - since) / 60 + 1
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "llmlab_accounting.explain",
            "--url",
            ACCOUNTING,
            "--slowest",
            "--since-minutes",
            f"{minutes:.1f}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return [
        "\n== 7. where the slowest request's time went (python -m llmlab_accounting.explain --slowest):",
        r.stdout.rstrip() if r.returncode == 0 else f"  unavailable: {r.stderr.strip()[-300:]}",
        "   any request: make explain-latency REQUEST_ID=<its X-Request-Id>",
    ]


def after_the_run(out: Path, stamp: str, since: float) -> None:
    """Sections 5-7, printed in order. Their work overlaps: the dashboards' snapshot waits for one
    more scrape and renders in its own process while the accounting rows come in; the cost report
    and the slowest request's explanation (both reading those rows) run side by side after."""
    with ThreadPoolExecutor(max_workers=3) as pool:
        dash = pool.submit(dashboards, since, out / f"demo-{stamp}-dashboards")
        attempts = wait_for_attempts()
        explain = pool.submit(explain_slowest, since)
        if attempts is None:
            say(f"\n== 5. cost report: accounting service not reachable at {ACCOUNTING}; skipped")
            sections = [dash, explain]
        else:
            cost = pool.submit(cost_report, out / f"demo-{stamp}-cost", since, attempts)
            sections = [cost, dash, explain]
        for section in sections:
            for line in section.result():
                say(line)


def worker_phases() -> dict[str, dict[str, float]]:
    """Mean NATS queue wait, engine TTFT and e2e per worker, from their Prometheus histograms."""
    out: dict[str, dict[str, float]] = {}
    for name, port in WORKERS.items():
        try:
            m = parse_prometheus_text(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text)
        except httpx.HTTPError:
            continue
        row: dict[str, float] = {}
        for key in ("nats_queue", "ttft", "e2e"):
            s, n = m.get(f"llmlab_worker_{key}_seconds_sum"), m.get(f"llmlab_worker_{key}_seconds_count")
            if s is not None and n:
                row[key] = s
                row[f"{key}_n"] = n
        out[name] = row
    return out


def phase_means(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    res: dict[str, dict[str, float]] = {}
    for name, row in after.items():
        b = before.get(name, {})
        res[name] = {}
        for key in ("nats_queue", "ttft", "e2e"):
            n = row.get(f"{key}_n", 0) - b.get(f"{key}_n", 0)
            if n > 0:
                res[name][f"{key}_ms"] = round((row[key] - b.get(key, 0.0)) / n * 1000, 2)
    return res


def load_run(base: str, out_dir: Path, stamp: str) -> list[dict[str, Any]]:
    say("\n== 3. load: " + ", ".join(f"{c} streams x {r} requests on {m}" for m, c, r, _ in LOAD))
    procs = []
    for model, conc, reqs, max_tokens in LOAD:
        out = out_dir / f"demo-{stamp}-{model.split('/')[-1]}.load.json"
        cmd = [
            sys.executable,
            "-m",
            "llmlab_loadtest.sse_client",
            "--url",
            base + "/v1/chat/completions",
            "--model",
            model,
            "--api-key",
            api_key(),
            "--concurrency",
            str(conc),
            "--requests-per-stream",
            str(reqs),
            "--max-tokens",
            str(max_tokens),
            "--out",
            str(out),
            "--progress",
            "2",
            "--log-level",
            "WARNING",
        ]
        procs.append((model, conc, reqs, out, cmd, subprocess.Popen(cmd, stdout=subprocess.DEVNULL)))
    results = []
    for model, conc, reqs, out, cmd, p in procs:
        rc = p.wait()
        data = json.loads(out.read_text())
        results.append(
            {
                "model": model,
                "concurrency": conc,
                "requests_per_stream": reqs,
                "rc": rc,
                "command": " ".join(cmd),
                "summary": data["summary"],
                "requests": data.get("requests", []),
            }
        )
        s = data["summary"]
        answered(s["requests"]["ok"])
        say(
            f"  {model}: {s['requests']['ok']} ok / {s['requests']['failed']} failed, "
            f"TTFT p50 {s['ttft_ms']['p50']} ms, {s['output_tokens_per_s']} tokens/s"
        )
    return results


def report(
    results: list[dict[str, Any]],
    phases: dict[str, dict[str, float]],
    out_dir: Path,
    stamp: str,
    started: dt.datetime,
    duration_s: float,
) -> Path:
    meta = metadata_block(
        started=started,
        duration_s=duration_s,
        engine="engine-sim (vllm and sglang flavours)",
        model_id=", ".join(m for m, *_ in LOAD),
        concurrency=", ".join(str(c) for _, c, *_ in LOAD),
        warmup="none: the SDK tour before the load run warms every process",
        prompt_dataset="fixed short chat prompt (llmlab_loadtest.sse_client DEFAULT_PROMPT)",
        input_length_distribution="fixed, ~20 tokens",
        output_length_distribution="max_tokens 64 (simulator output_len 128, so every request ends on length)",
        sampling_parameters="defaults (temperature unset)",
        command="make demo",
    )
    rows = []
    for r in results:
        s = r["summary"]
        rows.append(
            f"| {r['model']} | {r['concurrency']} x {r['requests_per_stream']} | {s['requests']['ok']} | "
            f"{s['requests']['failed']} | {s['ttft_ms']['p50']} / {s['ttft_ms']['p95']} / {s['ttft_ms']['p99']} | "
            f"{s['itl_ms']['p50']} / {s['itl_ms']['p95']} | {s['e2e_ms']['p50']} / {s['e2e_ms']['p95']} | "
            f"{s['output_tokens_per_s']} | {s['client']['cpu_util']} |"
        )
    prow = [f"| {w} | {p.get('nats_queue_ms')} | {p.get('ttft_ms')} | {p.get('e2e_ms')} |" for w, p in phases.items()]
    md = "\n".join(
        [
            f"# make demo — {started.isoformat(timespec='seconds')}",
            "",
            "**Simulated**: the engines are the simulator (TTFT 100 ms, ITL 30 ms as `make up` starts them), not GPUs;"
            " these figures measure the serving stack on this machine, not model speed.",
            "",
            "| model | streams x requests | ok | failed | TTFT ms p50/p95/p99 | ITL ms p50/p95 | E2E ms p50/p95 "
            "| output tokens/s | client CPU (cores) |",
            "|---|---|---|---|---|---|---|---|---|",
            *rows,
            "",
            "Where the time went, per worker, means over the load run (from the workers' Prometheus histograms):",
            "",
            "| worker | NATS queue wait ms | engine TTFT ms (engine queue + prefill) | take → end ms |",
            "|---|---|---|---|",
            *prow,
            "",
            f"Plot: `demo-{stamp}.png`. Raw per-request records: `demo-{stamp}-*.load.json`.",
            "",
            "## Metadata",
            "",
            "```json",
            json.dumps(meta, indent=1),
            "```",
            "",
        ]
    )
    md_path = out_dir / f"demo-{stamp}.md"
    md_path.write_text(md)
    (out_dir / f"demo-{stamp}.json").write_text(
        json.dumps(
            {
                "metadata": meta,
                "phases": phases,
                "runs": [{k: v for k, v in r.items() if k != "requests"} for r in results],
            },
            indent=1,
        )
    )
    plot(results, out_dir / f"demo-{stamp}.png")
    return md_path


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for r in results:
        ttfts = sorted(1000 * q["chunk_times"][0] for q in r["requests"] if q.get("chunk_times"))
        if ttfts:
            ax1.plot(ttfts, [i / len(ttfts) for i in range(1, len(ttfts) + 1)], label=r["model"])
    ax1.set_xlabel("TTFT at the client (ms)")
    ax1.set_ylabel("share of requests")
    ax1.set_title("TTFT distribution (simulated engines)")
    ax1.legend(fontsize=8)
    ax1.grid(alpha=0.3)
    names = [r["model"].split("/")[-1] for r in results]
    ax2.bar(names, [r["summary"]["output_tokens_per_s"] or 0 for r in results], color=["#4c72b0", "#dd8452"])
    ax2.set_ylabel("output tokens/s")
    ax2.set_title("delivered throughput during the load run")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    logging.basicConfig(level=logging.WARNING)
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--gateway", default=f"http://127.0.0.1:{os.environ.get('GATEWAY_PORT', '8080')}")
    ap.add_argument("--out", type=Path, default=REPO / "results")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    started = dt.datetime.now(dt.UTC)
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    t0 = time.monotonic()
    sdk_tour(args.gateway)
    routing_tour(args.gateway)
    before = worker_phases()
    results = load_run(args.gateway, args.out, stamp)
    phases = phase_means(before, worker_phases())
    md = report(results, phases, args.out, stamp, started, time.monotonic() - t0)
    say(f"\n== 4. report: {md} (+ .json, .png)")
    say(md.read_text().split("## Metadata")[0])
    after_the_run(args.out, stamp, started.timestamp())
    say(f"The stack is still up: point any OpenAI client at {args.gateway}/v1 (key in {RUN_DIR / 'api-key'}).")
    say("`make down` stops it.")
    return 0 if all(r["summary"]["requests"]["failed"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
