"""The ladder's report, assembled from the step files of one or two runs (``make loadtest-report
RUN=r1,r2``): Markdown, PNG plots, the raw figures as JSON and an HTML page, under
``reports/benchmark/<date>/``. Every figure comes from a step file; ``loadtest/tests`` recompute
them from the step's raw records and fail when they disagree.

The failure point is the first step whose stop rule fired (errors over 5%, interactive TTFT p95
over the SLO, or a client-bound step). The safe operating limit is the highest step below it
whose error rate is at most 1%, whose interactive TTFT p95 is within the SLO and whose goodput
share (answered within the SLO, of all requests) is at least 90%: a margin below the point where
the SLO breaks, as an operator would set an admission limit.
"""

from __future__ import annotations

import argparse
import datetime as dt
import html
import json
import logging
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from llmlab_loadtest.bench_meta import metadata_section
from llmlab_loadtest.ladder import INTERACTIVE, MAX_ERROR_RATE, TPOT_SLO_MS, TTFT_SLO_MS, load_steps
from llmlab_loadtest.ladder import show as _f

log = logging.getLogger(__name__)

SAFE_MAX_ERROR_RATE = 0.01
SAFE_MIN_GOODPUT_SHARE = 0.90
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]


def is_safe(step: dict[str, Any]) -> bool:
    f = step["figures"]
    p95 = f["interactive_ttft_p95_ms"]
    return (
        not step.get("stop_reason")
        and f["requests"] > 0
        and f["error_rate"] <= SAFE_MAX_ERROR_RATE
        and p95 is not None
        and p95 <= TTFT_SLO_MS
        and f["goodput_share"] >= SAFE_MIN_GOODPUT_SHARE
    )


def verdict(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """The failure point (first stopped step) and the safe operating limit of one run."""
    failed = next((s for s in steps if s.get("stop_reason")), None)
    below = [s for s in steps if failed is None or s["step"] < failed["step"]]
    safe = [s for s in below if is_safe(s)]
    return {
        "failure_point": None
        if failed is None
        else {
            "step": failed["step"],
            "why": failed["stop_reason"],
            # where the failures were: unanswered requests per class, and the answers that were not 200
            "unanswered_by_class": {
                c: v["requests"] - v["answered"]
                for c, v in failed["figures"]["classes"].items()
                if v["requests"] > v["answered"]
            },
            "failures": {k: v for k, v in failed["figures"]["answers"].items() if not k.startswith("200 ")},
        },
        "safe_limit": None
        if not safe
        else {
            "step": safe[-1]["step"],
            "completed_rps": safe[-1]["figures"]["completed_rps"],
            "goodput_rps": safe[-1]["figures"]["goodput_rps"],
            "output_tokens_per_s": safe[-1]["figures"]["output_tokens_per_s"],
        },
        "highest_step": steps[-1]["step"] if steps else None,
    }


def row(step: dict[str, Any]) -> dict[str, Any]:
    """The report's figures of one step: copied from the step file, never computed anew."""
    f, w = step["figures"], step["window"]
    g = w.get("gauges", {})
    cpu = w.get("cpu_cores", {})
    return {
        "step": step["step"],
        "open_connections": step["vus"],
        "requests": f["requests"],
        "answered": f["answered"],
        "offered_rps": f["offered_rps"],
        "completed_rps": f["completed_rps"],
        "goodput_rps": f["goodput_rps"],
        "goodput_share": f["goodput_share"],
        "output_tokens_per_s": f["output_tokens_per_s"],
        "ttft_ms": f["ttft_ms"],
        "interactive_ttft_p95_ms": f["interactive_ttft_p95_ms"],
        "tpot_ms": f["tpot_ms"],
        "itl_ms": {k: w.get("itl_ms", {}).get(k) for k in ("p50", "p95", "p99")},
        "e2e_ms": f["e2e_ms"],
        "error_rate": f["error_rate"],
        "timeouts": f["timeouts"],
        "refused_429": f["refused_429"],
        "server_errors_5xx": f["server_errors_5xx"],
        "answers": f["answers"],
        "queue_pending": g.get("queue_pending"),
        "engine_waiting": {k.split(":", 1)[1]: v for k, v in g.items() if k.startswith("engine_waiting:")},
        "kv_use_max": {k.split(":", 1)[1]: v["max"] for k, v in g.items() if k.startswith("kv_use:")},
        "client_cpu_core": cpu.get("client"),
        "client_rx_bytes_per_s": step["client_network"]["received_bytes_per_s"],
        "machine_cores_busy": w.get("machine_cores"),
        "cpu_cores": cpu,
        "limited_by": step["limited_by"],
        "stop_reason": step.get("stop_reason"),
        "classes": f["classes"],
    }


def spread(a: float | None, b: float | None) -> float | None:
    """|a - b| / mean(a, b): how far two runs of the same step lie apart."""
    if a is None or b is None or a + b == 0:
        return None
    return abs(a - b) / ((a + b) / 2)


SPREAD_FIGURES = {
    "completed req/s": lambda r: r["completed_rps"],
    "goodput req/s": lambda r: r["goodput_rps"],
    "output tok/s": lambda r: r["output_tokens_per_s"],
    "TTFT p50": lambda r: r["ttft_ms"]["p50"],
    "TTFT p95": lambda r: r["ttft_ms"]["p95"],
    "E2E p95": lambda r: r["e2e_ms"]["p95"],
}


def assemble(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    rows = {run: [row(s) for s in steps] for run, steps in runs.items()}
    names = list(runs)
    spreads: list[dict[str, Any]] = []
    if len(names) >= 2:
        other = {r["step"]: r for r in rows[names[1]]}
        for r in rows[names[0]]:
            if r["step"] in other:
                o = other[r["step"]]
                spreads.append({"step": r["step"], **{k: spread(fn(r), fn(o)) for k, fn in SPREAD_FIGURES.items()}})
    invocations = []
    for run, steps in runs.items():
        for s in steps:
            m = s["metadata"]
            invocations.append(
                {
                    "run": run,
                    "step": s["step"],
                    "command": m["command_line"],
                    "git_commit": m["git_commit"],
                    "started": s["started"],
                }
            )
    first = next(iter(runs.values()))[0]
    return {
        "runs": rows,
        "verdicts": {run: verdict(steps) for run, steps in runs.items()},
        "spread": spreads,
        "invocations": invocations,
        "commits": sorted({i["git_commit"] for i in invocations}),
        "target": first.get("target", ""),
        "targets": {run: steps[0].get("target", "") for run, steps in runs.items()},
        "classes": {run: steps[0].get("classes", "") for run, steps in runs.items()},
        "metadata": first["metadata"],
        "slo": {"ttft_p95_ms": TTFT_SLO_MS, "tpot_ms": TPOT_SLO_MS, "max_error_rate": MAX_ERROR_RATE},
        "hold_s": sorted({s["hold_s"] for steps in runs.values() for s in steps}),
        "warmup_s": sorted({s["warmup_s"] for steps in runs.values() for s in steps}),
    }


# --- rendering ----------------------------------------------------------------------------


def _codes(d: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in d.items()) or "0"


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *("| " + " | ".join(r) + " |" for r in rows)]


def step_tables(rows: list[dict[str, Any]]) -> list[str]:
    """Two tables per run: load and latency; failures, queues and what limited the step."""
    load = _table(
        [
            "step (open conns)",
            "offered req/s",
            "answered req/s",
            "goodput req/s (share)",
            "out tok/s",
            "TTFT p50/p95/p99 ms",
            "interactive TTFT p95 ms",
            "ITL p50/p95 ms",
            "TPOT p50/p95 ms",
            "E2E p50/p95/p99 ms",
        ],
        [
            [
                str(r["step"]),
                f"{r['offered_rps']:.2f}",
                f"{r['completed_rps']:.2f}",
                f"{r['goodput_rps']:.2f} ({100 * r['goodput_share']:.0f}%)",
                f"{r['output_tokens_per_s']:.0f}",
                " / ".join(_f(r["ttft_ms"][k]) for k in ("p50", "p95", "p99")),
                _f(r["interactive_ttft_p95_ms"]),
                " / ".join(_f(r["itl_ms"][k], "{:.1f}") for k in ("p50", "p95")),
                " / ".join(_f(r["tpot_ms"][k], "{:.1f}") for k in ("p50", "p95")),
                " / ".join(_f(r["e2e_ms"][k]) for k in ("p50", "p95", "p99")),
            ]
            for r in rows
        ],
    )
    health = _table(
        [
            "step",
            "requests (answered)",
            "timeouts",
            "429 by reason",
            "5xx",
            "other answers",
            "queue pending mean/max",
            "engine waiting mean/max",
            "KV use max",
            "client CPU",
            "client rx",
            "machine cores busy",
            "limited by",
            "stop",
        ],
        [
            [
                str(r["step"]),
                f"{r['requests']} ({r['answered']})",
                str(r["timeouts"]),
                _codes(r["refused_429"]),
                str(r["server_errors_5xx"]),
                _codes({k: v for k, v in r["answers"].items() if not k.startswith(("200 ", "429 ")) and k[0] != "5"}),
                _mean_max(r["queue_pending"]),
                ", ".join(f"{k} {_mean_max(v)}" for k, v in r["engine_waiting"].items()) or "-",
                _kv(r),
                f"{_f(r['client_cpu_core'] and 100 * r['client_cpu_core'])}% of a core",
                f"{r['client_rx_bytes_per_s'] / 1e6:.2f} MB/s",
                _f(r["machine_cores_busy"], "{:.2f}"),
                r["limited_by"],
                r["stop_reason"] or "-",
            ]
            for r in rows
        ],
    )
    names = sorted({c for r in rows for c in r["classes"]})
    per_class = _table(
        ["step", *(f"{c}: answered / sent, TTFT p95 ms, within SLO" for c in names)],
        [
            [str(r["step"])]
            + [
                (
                    f"{r['classes'][c]['answered']} / {r['classes'][c]['requests']}, "
                    f"{_f(r['classes'][c]['ttft_p95_ms'])}, {r['classes'][c]['within_slo']}"
                )
                if c in r["classes"]
                else "-"
                for c in names
            ]
            for r in rows
        ],
    )
    return [*load, "", *health, "", *per_class]


def _kv(r: dict[str, Any]) -> str:
    return ", ".join(f"{k} {100 * v:.0f}%" for k, v in r["kv_use_max"].items()) or "-"


def _mean_max(g: dict[str, float] | None) -> str:
    return "-" if not g else f"{g['mean']:.1f} / {g['max']:.0f}"


def baseline_table(doc: dict[str, Any]) -> list[str]:
    """§0's table: one line per step of the first run."""
    run = next(iter(doc["runs"]))
    m = doc["metadata"]
    out = [
        "| engine | model | precision | concurrency | input / output tokens | TTFT p50 / p95 ms | ITL p50 / p95 ms | "
        "output tok/s | GPU memory |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["runs"][run]:
        out.append(
            f"| {m['engine']} | {m['model_id']} | bf16 (Llama), fp8 (Qwen), simulated | {r['step']} | §8.3 mix | "
            f"{_f(r['ttft_ms']['p50'])} / {_f(r['ttft_ms']['p95'])} | "
            f"{_f(r['itl_ms']['p50'], '{:.1f}')} / {_f(r['itl_ms']['p95'], '{:.1f}')} | "
            f"{r['output_tokens_per_s']:.0f} | n/a (simulated; KV use max {_kv(r)}) |"
        )
    return out


def markdown(doc: dict[str, Any], images: list[str]) -> str:
    runs = list(doc["runs"])
    lines = [
        "# Load ladder: the §8.3 mix against the stack, step by step",
        "",
        f"Target: {doc['target']}.",
        "",
        f"Each step: k6 closed-loop clients (one open connection each) for a warm-up of "
        f"{', '.join(f'{w:.0f}' for w in doc['warmup_s'])} s (not measured), then a hold of "
        f"{', '.join(f'{h:.0f}' for h in doc['hold_s'])} s (measured). The tutorial asks 5 minutes per step; "
        "a step here is shorter so that each invocation stays under 15 minutes on this 2-core machine, and the "
        "figures are the hold's. "
        f"SLO (the catalog's interactive class): TTFT p95 <= {TTFT_SLO_MS:.0f} ms for the interactive classes "
        f"({', '.join(INTERACTIVE)}), mean time per output token <= {TPOT_SLO_MS:.0f} ms; goodput counts the answered "
        "requests within both. Runs: " + ", ".join(f"`{r}`" for r in runs) + ".",
        "",
        "## Verdict",
        "",
    ]
    for run, v in doc["verdicts"].items():
        fp = v["failure_point"]
        sl = v["safe_limit"]
        lines.append(
            f"- Run `{run}`{' (another target: see its steps)' if doc['targets'].get(run) != doc['target'] else ''}: "
            "failure point "
            + (
                f"**step {fp['step']}** ({fp['why']}; unanswered by class: {_codes(fp['unanswered_by_class'])}; "
                f"failures: {_codes(fp['failures'])})"
                if fp
                else f"not reached up to step {v['highest_step']}"
            )
            + "; safe operating limit "
            + (
                f"**{sl['step']} concurrent streams** ({sl['completed_rps']:.2f} answered req/s, "
                f"{sl['goodput_rps']:.2f} within the SLO, {sl['output_tokens_per_s']:.0f} output tok/s)"
                if sl
                else "none of the steps run"
            )
            + "."
        )
    lines += [
        "",
        f"Safe: error rate <= {100 * SAFE_MAX_ERROR_RATE:.0f}%, interactive TTFT p95 within the SLO and goodput share "
        f">= {100 * SAFE_MIN_GOODPUT_SHARE:.0f}%, below the failure point.",
        "",
        "## §0 baseline (first run)",
        "",
        *baseline_table(doc),
        "",
    ]
    for run in runs:
        lines += [f"## Steps of run `{run}`", ""]
        if doc["targets"].get(run) != doc["target"] or doc["classes"].get(run) != doc["classes"].get(runs[0]):
            lines += [f"Target: {doc['targets'][run]}; classes: {doc['classes'][run]}.", ""]
        lines += [*step_tables(doc["runs"][run]), ""]
    if doc["spread"]:
        keys = list(SPREAD_FIGURES)
        lines += [
            f"## Spread between `{runs[0]}` and `{runs[1]}`",
            "",
            "|a - b| / mean(a, b) per step.",
            "",
            "| step | " + " | ".join(keys) + " |",
            "|---|" + "---|" * len(keys),
        ]
        for s in doc["spread"]:
            lines.append(f"| {s['step']} | " + " | ".join(_f(s[k] and 100 * s[k], "{:.1f}%") for k in keys) + " |")
        lines.append("")
    lines += [
        "## What the figures mean",
        "",
        "- open connections = k6 clients (closed loop: each sends its next request when the last ends); answered "
        "req/s counts only 200s that ended with `[DONE]`, so 1,000 open connections are not 1,000 successful requests.",
        "- TTFT = k6's time to the first byte of the streamed response: the gateway sends its headers with the "
        "first token.",
        "- ITL = the workers' histogram of gaps between engine chunks over the hold (`llmlab_worker_itl_seconds`), "
        "TPOT = (E2E - TTFT) / (completion tokens - 1) per request: k6 reads a stream whole, so it has no chunk times.",
        "- queue pending = the router's JetStream backlog gauge; engine waiting = the engines' waiting requests; "
        "KV use = "
        "the engines' cache gauges; all sampled every second over the hold.",
        "- client CPU = the k6 process's CPU over the hold, in % of one core; client rx = k6's data_received rate.",
        "- limited by: the client when k6 passed 70% of a core; else the busiest process group when the "
        "machine's cores "
        "were at least 90% busy; else neither (the simulated GPUs or the offered load set the pace).",
        "- Client: k6 drove every step of the ladder (k6 is compiled and cheap per request: the client CPU column "
        "shows how far it was from saturating a core); the peers table below was driven by the Python SSE client.",
        "- Figures are SIMULATED (engine twin) unless the run's target says real vLLM: they say what this stack does "
        "in front of such GPUs, on this CPU.",
        "",
    ]
    if doc.get("peers"):
        from llmlab_loadtest.peers import CLIENT_NOTE, MEANING, PEERS_NOTE, table

        p = doc["peers"]
        lines += [
            "## Peers: the engine directly, this stack, LiteLLM (interleaved)",
            "",
            f"From `{p['source']}` (`make peers`): LiteLLM {p['litellm_version']} (one worker, no database), one "
            f"engine twin upstream ({p['engine']}); {p['max_tokens']} output tokens per request; client: {CLIENT_NOTE} "
            f"{MEANING}",
            "",
            *table(p["rows"]),
            "",
            PEERS_NOTE,
            "",
        ]
    lines += [f"![{Path(i).stem}]({i})" for i in images] + [""]
    lines += ["## Invocations", "", "| run | step | started | commit | command |", "|---|---|---|---|---|"]
    lines += [
        f"| {i['run']} | {i['step']} | {i['started']} | {i['git_commit'][:10]} | `{i['command']}` |"
        for i in doc["invocations"]
    ]
    lines += ["", *metadata_section(doc["metadata"], "## Metadata (§12, first step of the first run)")]
    return "\n".join(lines)


def plots(doc: dict[str, Any], out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for run, rows in doc["runs"].items():
        x = [r["offered_rps"] for r in rows]
        for key, style in (("p50", "-"), ("p95", "--"), ("p99", ":")):
            axes[0].plot(x, [r["ttft_ms"][key] for r in rows], style, marker="o", label=f"{run} TTFT {key}")
            axes[1].plot(x, [r["e2e_ms"][key] for r in rows], style, marker="o", label=f"{run} E2E {key}")
    for ax, title in ((axes[0], "time to first token"), (axes[1], "end to end")):
        ax.axhline(TTFT_SLO_MS, color="red", lw=0.8) if ax is axes[0] else None
        ax.set_xlabel("offered requests/s")
        ax.set_ylabel("ms")
        ax.set_yscale("log")
        ax.set_title(f"{title} vs offered load (simulated)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "latency.png", dpi=110)
    plt.close(fig)
    names.append("latency.png")

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for run, rows in doc["runs"].items():
        x = [r["offered_rps"] for r in rows]
        ax.plot(x, [r["completed_rps"] for r in rows], marker="o", label=f"{run} answered")
        ax.plot(x, [r["goodput_rps"] for r in rows], marker="s", label=f"{run} goodput (within SLO)")
        for r in rows:
            ax.annotate(str(r["step"]), (r["offered_rps"], r["goodput_rps"]), fontsize=7)
    ax.set_xlabel("offered requests/s (labels: open connections)")
    ax.set_ylabel("requests/s")
    ax.set_title("goodput vs offered load (simulated)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "goodput.png", dpi=110)
    plt.close(fig)
    names.append("goodput.png")

    run = next(iter(doc["runs"]))
    rows = doc["runs"][run]
    kinds = sorted({k for r in rows for k in r["answers"] if not k.startswith("200 ")})
    fig, ax = plt.subplots(figsize=(6.5, 4))
    bottom = [0.0] * len(rows)
    labels = [str(r["step"]) for r in rows]
    for k in kinds:
        vals = [float(r["answers"].get(k, 0)) for r in rows]
        ax.bar(labels, vals, bottom=bottom, label=k)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    if not kinds:
        ax.text(0.5, 0.5, "no failure at any step", ha="center", transform=ax.transAxes)
    ax.set_xlabel("step (open connections)")
    ax.set_ylabel("requests in the hold")
    ax.set_title(f"failures by status and code per step (run {run})")
    if kinds:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "failures.png", dpi=110)
    plt.close(fig)
    names.append("failures.png")
    return names


def html_page(md: str) -> str:
    """The Markdown as a standalone page: headings, tables, lists, code and images (enough for
    this report; no dependency on a Markdown library)."""
    body: list[str] = []
    table: list[str] = []
    code = False

    def inline(t: str) -> str:
        t = html.escape(t)
        t = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", t)
        return re.sub(r"`(.+?)`", r"<code>\1</code>", t)

    def flush() -> None:
        if table:
            rows = [r for r in table if not re.fullmatch(r"\|(-+\|)+", r)]
            cells = [[c.strip() for c in r.strip("|").split("|")] for r in rows]
            body.append("<table><tr>" + "".join(f"<th>{inline(c)}</th>" for c in cells[0]) + "</tr>")
            body.extend("<tr>" + "".join(f"<td>{inline(c)}</td>" for c in r) + "</tr>" for r in cells[1:])
            body.append("</table>")
            table.clear()

    for line in md.splitlines():
        if line.startswith("```"):
            flush()
            body.append("</pre>" if code else "<pre>")
            code = not code
        elif code:
            body.append(html.escape(line))
        elif line.startswith("|"):
            table.append(line)
        else:
            flush()
            if m := re.match(r"(#+) (.*)", line):
                n = len(m.group(1))
                body.append(f"<h{n}>{inline(m.group(2))}</h{n}>")
            elif m := re.match(r"!\[(.*?)\]\((.*?)\)", line):
                body.append(f'<img alt="{html.escape(m.group(1))}" src="{html.escape(m.group(2))}">')
            elif line.startswith("- "):
                body.append(f"<li>{inline(line[2:])}</li>")
            elif line.strip():
                body.append(f"<p>{inline(line)}</p>")
    flush()
    style = (
        "body{font-family:sans-serif;margin:2em;max-width:1600px}table{border-collapse:collapse;font-size:12px}"
        "td,th{border:1px solid #ccc;padding:2px 6px}th{background:#eee}img{max-width:100%}pre{background:#f6f6f6}"
    )
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>Load ladder</title>"
        f"<style>{style}</style></head><body>\n" + ("\n".join(body) + "\n</body></html>\n")
    )


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def screenshot(page: Path, png: Path) -> bool:
    """The HTML page rendered by headless Chromium (Debian's ``chromium``), when installed."""
    exe = chromium()
    if exe is None:
        log.warning("no chromium: the HTML page is not screenshotted (apt-get install chromium)")
        return False
    profile = png.parent / ".chromium-profile"
    cmd = [
        exe,
        *CHROMIUM_FLAGS,
        f"--user-data-dir={profile}",
        "--window-size=1600,4000",
        f"--screenshot={png}",
        page.resolve().as_uri(),
    ]
    try:
        subprocess.run(cmd, capture_output=True, timeout=120, check=False)
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    return png.exists() and png.stat().st_size > 0


def cmd_report(a: argparse.Namespace) -> int:
    runs = {run: load_steps(a.results / run) for run in a.run}
    empty = [run for run, steps in runs.items() if not steps]
    if empty:
        raise SystemExit(f"no step files for run(s) {', '.join(empty)} under {a.results}")
    doc = assemble(runs)
    date = dt.datetime.fromisoformat(next(iter(runs.values()))[0]["started"]).date().isoformat()
    out = a.out or Path("reports/benchmark") / date
    out.mkdir(parents=True, exist_ok=True)
    doc["sources"] = {run: str(a.results / run) for run in runs}
    if a.peers:
        peers = json.loads(a.peers.read_text())
        keep = ("rows", "engine", "max_tokens", "requests_per_stream", "litellm_version")
        doc["peers"] = {"source": str(a.peers), **{k: peers[k] for k in keep}}
    images = plots(doc, out)
    (out / "report.json").write_text(json.dumps(doc, indent=1) + "\n")
    md = markdown(doc, images)
    (out / "README.md").write_text(md)
    (out / "report.html").write_text(html_page(md))
    shot = screenshot(out / "report.html", out / "report-html.png")
    log.info("report: %s (HTML screenshot %s)", out, "taken" if shot else "not taken")
    return 0
