"""Relay cost: CPU per request and per token of the full default stack, the data-plane issue's
per-core targets.

    python -m llmlab_loadtest.cost_bench                       # this tree, 2 repeats (~3 min)
    python -m llmlab_loadtest.cost_bench --baseline 7d4fbba    # A/B: that commit and this tree, interleaved
    python -m llmlab_loadtest.cost_bench --router-ab           # A/B on this tree: router service vs shared
    python -m llmlab_loadtest.cost_bench --env-ab LLMLAB_WORKER_PUBLISH_BATCH_MS=5   # A/B of a setting

The full default stack (gateway with budget auth and the router service, budget, router,
accounting, one worker) runs on the engine simulator at a GPU's pace (TTFT 50 ms, ITL 20 ms: one
token per NATS message). A closed-loop SSE client (its own process) keeps ``--streams`` requests
open; after a warm-up the runner reads every process's CPU seconds (its live children included)
and the gateway's and worker's metrics over a ``--window-s`` window, and divides by the requests
the gateway answered in it. Each repeat measures 2-token and 64-token requests:

- **per request**: the CPU of gateway, budget, router, worker and accounting per 2-token request
  (target <= 2 ms, NATS server apart);
- **per token**: (CPU per 64-token request - CPU per 2-token request) / (the tokens they delivered
  apart), for gateway and worker (target <= 60 us together; >= 16,000 tokens/s per core each).

With ``--baseline REV`` a second stack runs the code of REV (a git worktree put first on the
services' PYTHONPATH) and the measurements interleave, the first of each pair alternating by
repeat: base, this, then this, base. ``--router-ab`` measures this tree twice the same way: the
gateway asking the router service (``service``) and deciding itself with shared decisions
(``shared``, the router service still running and following them). ``--env-ab KEY=VALUE``
(repeatable, ``LLMLAB_*`` settings) measures this tree twice: as configured (``default``) and
with those variables set for every process of the stack (``env``). Refused requests
(any non-200) are counted apart: a window with any is flagged and its figures miss their targets.
After the measured windows, one window of each length is profiled with py-spy (GIL-held samples:
every stack process at 2 tokens, for the per-request cost; gateway and worker at 64) unless
``--no-profile``. The tree must be committed unless ``--dirty`` (then the result says so).

Writes ``results/relay-cost/<UTC ts>/result.{json,md,png}`` plus ``profiles/``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from llmlab_testkit.budget import BudgetAdmin
from llmlab_testkit.procs import ManagedProcess, Stack, unique_namespace, url

from llmlab_loadtest import promscrape
from llmlab_loadtest.bench_meta import git, metadata_block, metadata_section, require_committed, write_outputs
from llmlab_loadtest.ladder import cpu_seconds
from llmlab_loadtest.profiles import py_spy
from llmlab_loadtest.profiles import summary as profile_summary
from llmlab_loadtest.relay_bench import find_nats_server, wait_sim_idle
from llmlab_loadtest.settings_arg import parse_setting

log = logging.getLogger("cost_bench")

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
POOL = "gpu-vllm"
NAME = "relay-cost"
SHORT, LONG = 2, 64
STACK_PROCS = ("gateway", "budget", "router", "worker", "accounting")  # the per-request target's sum
RELAY_PROCS = ("gateway", "worker")  # the per-token target's sum
UNLIMITED = dict.fromkeys(("daily_tokens", "monthly_tokens", "rpm", "tpm", "max_concurrent"), "unlimited")
# Targets (benchmark figures; never asserted).
TARGET_REQUEST_MS = 2.0
TARGET_RELAY_TOKEN_US = 60.0
TARGET_TOKENS_PER_CORE = 16_000.0


@dataclass
class CostConfig:
    streams: int = 100
    window_s: float = 15.0
    warm_s: float = 4.0
    repeats: int = 2
    ttft_ms: float = 50.0
    itl_ms: float = 20.0
    baseline: str | None = None
    router_ab: bool = False
    env_ab: dict[str, str] = field(default_factory=dict)  # the "env" variant's settings (--env-ab)
    dirty: bool = False
    profile: bool = True
    idle_s: float = 5.0  # each process's idle CPU is measured this long before the windows
    out_dir: Path = Path("results")


# ---------------------------------------------------------------------------------------------
# Pure figures (unit-tested)
# ---------------------------------------------------------------------------------------------
def per_request_ms(window: dict[str, Any]) -> dict[str, float]:
    """CPU ms per answered request of each process in one window."""
    ok = window["requests_ok"]
    return {n: 1e3 * s / ok for n, s in window["cpu_s"].items()} if ok else {}


def net_per_request_ms(window: dict[str, Any]) -> dict[str, float]:
    """The same, less what the process spends idle over as long (heartbeats, sweeps, scrapes): the
    work the requests brought. Two variants answering different numbers of requests in a window
    spread the same background over different counts; the net figure compares their work."""
    ok, idle = window["requests_ok"], window.get("idle_cpu_s_per_s") or {}
    if not ok:
        return {}
    return {n: 1e3 * (s - idle[n] * window["wall_s"]) / ok for n, s in window["cpu_s"].items() if n in idle}


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def variant_figures(windows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Means over a variant's measured windows: ms per request at each length, the tokens each
    delivered per request, and the CPU per added token (the slope between the two lengths)."""
    by_len: dict[int, list[dict[str, Any]]] = {SHORT: [], LONG: []}
    for w in windows:
        by_len[w["max_tokens"]].append(w)
    ms: dict[int, dict[str, float]] = {}
    net: dict[int, dict[str, float]] = {}
    tokens: dict[int, float] = {}
    for length, ws in by_len.items():
        for out, fn in ((ms, per_request_ms), (net, net_per_request_ms)):
            per = [fn(w) for w in ws if w["requests_ok"]]
            names = sorted({n for p in per for n in p})
            out[length] = {n: round(v, 3) for n in names if (v := _mean([p[n] for p in per if n in p])) is not None}
        tokens[length] = _mean([w["tokens"] / w["requests_ok"] for w in ws if w["requests_ok"]]) or 0.0
    added = tokens[LONG] - tokens[SHORT]
    us_token = (
        {n: round(1e3 * (ms[LONG][n] - ms[SHORT][n]) / added, 1) for n in ms[LONG] if n in ms[SHORT]}
        if added > 0
        else {}
    )
    request_ms = sum(ms[SHORT].get(n, 0.0) for n in STACK_PROCS) if ms[SHORT] else None
    net_ms = sum(net[SHORT].get(n, 0.0) for n in STACK_PROCS) if all(n in net[SHORT] for n in STACK_PROCS) else None
    relay_us = sum(us_token[n] for n in RELAY_PROCS) if us_token and all(n in us_token for n in RELAY_PROCS) else None
    # The slope of each repeat alone (its 2- and 64-token windows ran back to back): the spread
    # says how much of a difference between variants is the host's noise.
    per_repeat: list[float] = []
    repeats = sorted({w.get("repeat", 0) for w in windows})
    if len(repeats) > 1:
        for r in repeats:
            pair = [w for w in windows if w.get("repeat", 0) == r]
            if {w["max_tokens"] for w in pair} == {SHORT, LONG}:
                f = variant_figures(pair)
                if f["relay_us_per_token"] is not None:
                    per_repeat.append(f["relay_us_per_token"])
    return {
        "relay_us_per_token_by_repeat": per_repeat,
        "ms_per_request": {str(k): v for k, v in ms.items()},
        "tokens_per_request": {str(k): round(v, 2) for k, v in tokens.items()},
        "us_per_added_token": us_token,
        "stack_ms_per_request": None if request_ms is None else round(request_ms, 3),
        # Beside the target's figure, not instead of it: CPU per request less each process's idle CPU.
        "net_ms_per_request": {str(k): v for k, v in net.items()},
        "stack_net_ms_per_request": None if net_ms is None else round(net_ms, 3),
        "relay_us_per_token": None if relay_us is None else round(relay_us, 1),
        "tokens_per_core_s": {n: round(1e6 / us_token[n]) for n in RELAY_PROCS if us_token.get(n, 0) > 0},
        "refused": sum(w["requests_refused"] for w in windows),
        "router_timeouts": sum(w["router_fallbacks"] for w in windows),
    }


def targets(fig: dict[str, Any]) -> list[dict[str, Any]]:
    """PASS/MISS of the per-request and per-token targets; any refused request misses them all."""
    rows: list[tuple[str, float | None, str, float, str]] = [
        ("CPU per 2-token request, gateway+budget+router+worker+accounting", fig["stack_ms_per_request"], "<=",
         TARGET_REQUEST_MS, "ms"),
        ("CPU per delivered token, gateway + worker", fig["relay_us_per_token"], "<=", TARGET_RELAY_TOKEN_US, "us"),
    ]  # fmt: skip
    for proc in RELAY_PROCS:
        rows.append(
            (f"{proc}: tokens/s per core", fig["tokens_per_core_s"].get(proc), ">=", TARGET_TOKENS_PER_CORE, "")
        )
    out = []
    for label, value, op, limit, unit in rows:
        ok = value is not None and (value <= limit if op == "<=" else value >= limit)
        result = "n/a" if value is None else ("PASS" if ok else "MISS")
        note = ""
        if result == "PASS" and fig["refused"]:
            result, note = "MISS", f"{fig['refused']} requests refused"
        out.append(
            {"target": f"{label} {op} {limit:g} {unit}".rstrip(), "value": value, "result": result, "note": note}
        )
    return out


# ---------------------------------------------------------------------------------------------
# The stacks
# ---------------------------------------------------------------------------------------------
class QuietStack(Stack):
    """The services' logs at WARNING (INFO per request costs CPU); a baseline's code first on the path."""

    def __init__(self, pythonpath: str | None, settings: dict[str, str] | None = None) -> None:
        super().__init__(namespace=unique_namespace())
        self.pythonpath = pythonpath
        self.settings = settings or {}

    def base_env(self) -> dict[str, str]:
        env = {**super().base_env(), "LLMLAB_LOG_LEVEL": "WARNING", **self.settings}
        if self.pythonpath:
            env["PYTHONPATH"] = self.pythonpath
        return env


def package_dirs(root: Path) -> list[Path]:
    """The directories holding the repository's importable packages (what editable installs point at)."""
    return sorted({p.parent.parent for p in root.glob("*/*/llmlab_*/__init__.py")} | {root / "lab"})


class Variant:
    def __init__(
        self,
        name: str,
        cfg: CostConfig,
        code: Path | None,
        router: str = "service",
        settings: dict[str, str] | None = None,
    ) -> None:
        self.name, self.cfg, self.code, self.router = name, cfg, code, router
        self.settings = dict(settings or {})  # LLMLAB_* variables set for every process of its stack
        self.commit = git("-C", str(code), "rev-parse", "HEAD") if code else git("rev-parse", "HEAD")
        pythonpath = ":".join(str(d) for d in package_dirs(code)) if code else None
        self.stack = QuietStack(pythonpath, self.settings)
        self.procs: dict[str, ManagedProcess] = {}
        self.api_key = ""
        self.idle: dict[str, float] = {}  # CPU s per s of each stack process with nothing to do

    def start(self) -> None:
        s, c = self.stack, self.cfg
        sim = s.sim("vllm", MODEL, ttft_ms=c.ttft_ms, itl_ms=c.itl_ms, max_num_seqs=2000, output_len=LONG)
        self.procs = {
            "simulator": sim,
            "worker": s.worker("vllm", POOL, url(sim), max_concurrency=2000, heartbeat_s=1.0),
            "budget": s.budget(),
            "router": s.router(),
            "accounting": s.accounting(),
        }
        admin = BudgetAdmin(url(self.procs["budget"]))
        self.api_key = admin.provision("enterprise", {"key": UNLIMITED, "user": UNLIMITED, "team": UNLIMITED}).api_key
        admin.close()
        self.procs["gateway"] = s.gateway(auth="budget", router=self.router)
        log.info("%s (%s): stack up in namespace %s", self.name, self.commit[:10], s.namespace)

    def close(self) -> None:
        self.stack.close()  # processes, then the namespace's streams and Redis keys


# ---------------------------------------------------------------------------------------------
# One window
# ---------------------------------------------------------------------------------------------
def syscalls(procs: dict[str, psutil.Process]) -> dict[str, tuple[int, int]]:
    """(read, write) system calls so far of each process (psutil's io_counters: /proc/<pid>/io)."""
    out: dict[str, tuple[int, int]] = {}
    for name, p in procs.items():
        try:
            io = p.io_counters()
        except (psutil.Error, AttributeError):
            continue
        out[name] = (int(io.read_count), int(io.write_count))
    return out


def _profiled(tokens: int) -> tuple[str, ...]:
    """Whom the profiled window samples: every stack process for the per-request cost (the short
    requests), the relay for the per-token cost."""
    return STACK_PROCS if tokens == SHORT else RELAY_PROCS


def measure(v: Variant, tokens: int, cfg: CostConfig, tmp: Path, profile_dir: Path | None = None) -> dict[str, Any]:
    """One window of ``cfg.window_s`` under a closed-loop load of ``cfg.streams`` streams."""
    gw, worker = url(v.procs["gateway"]), url(v.procs["worker"])
    cmd = [sys.executable, "-m", "llmlab_loadtest.sse_client", "--url", gw + "/v1/chat/completions",
           "--model", MODEL, "--api-key", v.api_key, "--concurrency", str(cfg.streams),
           "--requests-per-stream", "1000000", "--max-tokens", str(tokens), "--timeout", "60",
           "--read-timeout", "90", "--out", str(tmp / "client.json"), "--summary-only",
           "--log-level", "ERROR"]  # fmt: skip
    client = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(cfg.warm_s)
        procs = {n: psutil.Process(p.pid) for n, p in v.procs.items()}
        procs["client"] = psutil.Process(client.pid)
        nats = find_nats_server(v.stack.nats_url)
        if nats is not None:
            procs["nats-server"] = nats
        g0, w0, c0, t0 = promscrape.scrape(gw), promscrape.scrape(worker), cpu_seconds(procs), time.monotonic()
        io0 = syscalls(procs)
        spies = (
            [py_spy(v.procs[n].pid, profile_dir / f"{n}-{tokens}tok.txt", cfg.window_s) for n in _profiled(tokens)]
            if profile_dir is not None
            else []
        )
        time.sleep(cfg.window_s)
        g1, w1, c1, t1 = promscrape.scrape(gw), promscrape.scrape(worker), cpu_seconds(procs), time.monotonic()
        io1 = syscalls(procs)
        for spy in spies:
            spy.wait(30)
    finally:
        client.send_signal(signal.SIGINT)
        try:
            client.wait(30)
        except subprocess.TimeoutExpired:
            client.kill()
            client.wait(10)
    wait_sim_idle(url(v.procs["simulator"]))
    gd, wd = promscrape.delta(g0, g1), promscrape.delta(w0, w1)
    statuses = promscrape.by_label(gd, "llmlab_gateway_requests_total", "status")
    ok = statuses.get("200", 0.0)
    window = {
        "variant": v.name,
        "max_tokens": tokens,
        "profiled": profile_dir is not None,
        "wall_s": round(t1 - t0, 2),
        "requests_ok": int(ok),
        "requests_refused": int(sum(statuses.values()) - ok),
        "statuses": {k: int(n) for k, n in statuses.items() if n},
        "tokens": int(promscrape.total(gd, "llmlab_gateway_completion_tokens_total")),
        "cpu_s": {n: round(c1[n] - c0[n], 3) for n in c1 if n in c0},
        "idle_cpu_s_per_s": v.idle,
        # read and write system calls (/proc/<pid>/io): what one more message or socket write costs
        "syscalls": {n: [io1[n][0] - io0[n][0], io1[n][1] - io0[n][1]] for n in io1 if n in io0},
        "queue_wait_ms": promscrape.percentiles_ms(promscrape.buckets(wd, "llmlab_worker_nats_queue_seconds")),
        "router_fallbacks": int(promscrape.total(gd, "llmlab_gateway_router_fallbacks_total")),
    }
    per = per_request_ms(window)
    log.info(
        "  %s %d tok: %d answered (%d refused) in %.1fs; ms/request %s",
        v.name,
        tokens,
        window["requests_ok"],
        window["requests_refused"],
        window["wall_s"],
        ", ".join(f"{n} {x:.2f}" for n, x in per.items()),
    )
    return window


def measure_idle(variants: Sequence[Variant], seconds: float) -> None:
    """Each stack process's CPU per second while no request runs (every variant idle at once)."""
    procs = {f"{v.name}/{n}": psutil.Process(v.procs[n].pid) for v in variants for n in STACK_PROCS}
    c0, t0 = cpu_seconds(procs), time.monotonic()
    time.sleep(seconds)
    c1, t1 = cpu_seconds(procs), time.monotonic()
    for v in variants:
        v.idle = {n: round((c1[f"{v.name}/{n}"] - c0[f"{v.name}/{n}"]) / (t1 - t0), 4) for n in STACK_PROCS}
        log.info("%s idle CPU (cores): %s", v.name, ", ".join(f"{n} {x:.3f}" for n, x in v.idle.items()))


# ---------------------------------------------------------------------------------------------
# The benchmark
# ---------------------------------------------------------------------------------------------
def run(cfg: CostConfig, argv: Sequence[str]) -> dict[str, Path]:
    dirty = require_committed(cfg.dirty)
    started = dt.datetime.now(dt.UTC)
    t_start = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="cost-bench-"))
    worktree: Path | None = None
    variants: list[Variant] = []
    windows: list[dict[str, Any]] = []
    profiles: dict[str, Any] = {}
    try:
        if cfg.baseline:
            worktree = tmp / "baseline"
            subprocess.run(["git", "worktree", "add", "--detach", str(worktree), cfg.baseline], check=True,
                           capture_output=True)  # fmt: skip
            variants.append(Variant("base", cfg, worktree))
        if cfg.router_ab:
            variants += [Variant("service", cfg, None), Variant("shared", cfg, None, router="shared")]
        elif cfg.env_ab:
            variants += [Variant("default", cfg, None), Variant("env", cfg, None, settings=cfg.env_ab)]
        else:
            variants.append(Variant("this", cfg, None))
        for v in variants:
            v.start()
        time.sleep(2.0)  # the gateway sees the worker's heartbeat
        measure_idle(variants, cfg.idle_s)
        for r in range(1, cfg.repeats + 1):
            log.info("repeat %d/%d (elapsed %.0fs)", r, cfg.repeats, time.monotonic() - t_start)
            # ABBA: the variant that goes first alternates by repeat, so a drift of the host
            # during a repeat (or a cost of going second) does not always favour the same one.
            order = variants if r % 2 else variants[::-1]
            for tokens in (SHORT, LONG):
                for v in order:
                    w = measure(v, tokens, cfg, tmp)
                    w["repeat"] = r
                    windows.append(w)
        if cfg.profile:
            pdir = tmp / "profiles"
            pdir.mkdir()
            log.info("profiled windows (not in the figures): py-spy on the stack (2 tokens), gateway and worker (64)")
            for tokens in (SHORT, LONG):
                w = measure(variants[-1], tokens, cfg, tmp, profile_dir=pdir)
                w["repeat"] = 0
                windows.append(w)
            profiles = {p.stem: profile_summary(p) for p in sorted(pdir.glob("*.txt")) if p.stat().st_size}
    finally:
        for v in variants:
            v.close()
        if worktree is not None:
            subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], capture_output=True)
    measured = [w for w in windows if not w["profiled"]]
    figures = {v.name: variant_figures([w for w in measured if w["variant"] == v.name]) for v in variants}
    doc = {
        "metadata": metadata_block(
            started=started,
            duration_s=time.monotonic() - t_start,
            engine="llmlab-engine-sim (vLLM flavour)",
            model_id=MODEL,
            concurrency=cfg.streams,
            warmup=f"{cfg.warm_s:g} s of load before each window",
            prompt_dataset="one fixed chat prompt (llmlab_loadtest.sse_client)",
            input_length_distribution="fixed",
            output_length_distribution=f"fixed: {SHORT} and {LONG} tokens (max_tokens)",
            sampling_parameters={"stream": True, "max_tokens": [SHORT, LONG]},
            command=shlex.join(["python", "-m", "llmlab_loadtest.cost_bench", *argv]),
            simulator={"ttft_ms": cfg.ttft_ms, "itl_ms": cfg.itl_ms},
            window_s=cfg.window_s,
            repeats=cfg.repeats,
            dirty_files=dirty,
            variants={v.name: v.commit for v in variants},
            routers={v.name: v.router for v in variants},
            settings={v.name: v.settings for v in variants},
            cores=psutil.cpu_count(),
        ),
        "figures": figures,
        "targets": {name: targets(f) for name, f in figures.items()},
        "windows": windows,
        "profiles": profiles,
    }
    paths = write_outputs(doc, cfg.out_dir, started, NAME, render_markdown, render_plot)
    if profiles:
        dest = paths["json"].parent / "profiles"
        shutil.copytree(tmp / "profiles", dest, dirs_exist_ok=True)
    shutil.rmtree(tmp, ignore_errors=True)
    return paths


def _settings_note(meta: dict[str, Any], name: str) -> str:
    """The note " with KEY=VALUE, ..." of a variant run with settings of its own (--env-ab); results of
    older runs have no such field."""
    settings = (meta.get("settings") or {}).get(name) or {}
    return " with " + ", ".join(f"`{k}={v}`" for k, v in settings.items()) if settings else ""


def _f(x: Any, nd: int = 2) -> str:
    return "-" if x is None else f"{x:,.{nd}f}"


def render_markdown(doc: dict[str, Any]) -> str:
    meta, figs = doc["metadata"], doc["figures"]
    names = list(figs)
    lines = [
        "# Relay cost: CPU per request and per token (simulated)",
        "",
        f"{meta['concurrency']} closed-loop streams through the full default stack on the engine simulator "
        f"(TTFT {meta['simulator']['ttft_ms']:g} ms, ITL {meta['simulator']['itl_ms']:g} ms), "
        f"{meta['repeats']} repeats of a {meta['window_s']:g} s window per length and variant, interleaved. "
        "Variants: "
        + ", ".join(f"**{n}** `{c[:10]}`{_settings_note(meta, n)}" for n, c in meta["variants"].items())
        + ". "
        f"Tree {'dirty (' + str(len(meta['dirty_files'])) + ' files)' if meta['git_dirty'] else 'committed'}.",
        "",
        "## Targets",
        "",
        "| variant | target | value | result |",
        "|---|---|---:|---|",
    ]
    for n in names:
        for t in doc["targets"][n]:
            note = f" ({t['note']})" if t["note"] else ""
            lines.append(f"| {n} | {t['target']} | {_f(t['value'], 1)} | {t['result']}{note} |")
    for n in names:
        runs = figs[n].get("relay_us_per_token_by_repeat") or []
        if runs:
            lines.append(f"\n{n}: gateway + worker µs per token by repeat: {', '.join(f'{x:.1f}' for x in runs)}.")
    procs = sorted({p for f in figs.values() for p in f["ms_per_request"].get(str(SHORT), {})})
    lines += [
        "",
        "## CPU per process",
        "",
        "ms per answered request at each length; µs per added token = the difference / the tokens delivered apart.",
        "",
        "| process | "
        + " | ".join(f"{n}: ms/req {SHORT} tok | {n}: ms/req {LONG} tok | {n}: µs/token" for n in names)
        + " |",
        "|---|" + "---:|" * (3 * len(names)),
    ]
    for p in procs:
        cells = []
        for n in names:
            f = figs[n]
            cells += [
                _f(f["ms_per_request"][str(SHORT)].get(p)),
                _f(f["ms_per_request"][str(LONG)].get(p)),
                _f(f["us_per_added_token"].get(p), 1),
            ]
        lines.append(f"| {p} | " + " | ".join(cells) + " |")
    if any(f.get("stack_net_ms_per_request") is not None for f in figs.values()):
        lines += [
            "",
            "## Net of idle CPU",
            "",
            "ms per answered request less each process's idle CPU over the window (measured before the windows, "
            "nothing running): the work the requests brought, comparable between variants that answered different "
            "numbers of requests. Not the target's figure.",
            "",
            "| process | idle (cores) | "
            + " | ".join(f"{n}: net ms/req {SHORT} tok | {n}: net ms/req {LONG} tok" for n in names)
            + " |",
            "|---|---|" + "---:|" * (2 * len(names)),
        ]
        idle = {w["variant"]: w.get("idle_cpu_s_per_s") or {} for w in doc["windows"]}
        for p in STACK_PROCS:
            cells = [_f(figs[n]["net_ms_per_request"][str(k)].get(p)) for n in names for k in (SHORT, LONG)]
            lines.append(
                f"| {p} | {' / '.join(_f(idle.get(n, {}).get(p), 3) for n in names)} | " + " | ".join(cells) + " |"
            )
        stack = [c for n in names for c in (f"**{_f(figs[n]['stack_net_ms_per_request'])}**", "")]
        lines.append("| **stack** | | " + " | ".join(stack) + " |")
    lines += [
        "",
        "## System calls per answered request (read / write; gateway and worker, mean over the measured windows)",
        "",
        "| variant | tokens | gateway | worker | nats-server |",
        "|---|---:|---|---|---|",
    ]
    for n in names:
        for length in (SHORT, LONG):
            ws = [w for w in doc["windows"] if w["variant"] == n and w["max_tokens"] == length and not w["profiled"]]
            cells = []
            for proc in ("gateway", "worker", "nats-server"):
                per = [(r / w["requests_ok"], wr / w["requests_ok"]) for w in ws if w["requests_ok"]
                       for r, wr in [w.get("syscalls", {}).get(proc, (0, 0))]]  # fmt: skip
                cells.append(
                    f"{sum(a for a, _ in per) / len(per):.1f} / {sum(b for _, b in per) / len(per):.1f}" if per else "-"
                )
            lines.append(f"| {n} | {length} | " + " | ".join(cells) + " |")
    lines += ["", "## Windows", "", "| variant | repeat | tokens | answered | refused | router fallbacks | "
              "queue wait p50/p95/p99 ms | tokens/request |", "|---|---:|---:|---:|---:|---:|---|---:|"]  # fmt: skip
    for w in doc["windows"]:
        q = w["queue_wait_ms"]
        rep = "profiled" if w["profiled"] else str(w["repeat"])
        lines.append(
            f"| {w['variant']} | {rep} | {w['max_tokens']} | {w['requests_ok']} | {w['requests_refused']} | "
            f"{w['router_fallbacks']} | {_f(q['p50'], 1)} / {_f(q['p95'], 1)} / {_f(q['p99'], 1)} | "
            f"{_f(w['tokens'] / w['requests_ok'] if w['requests_ok'] else None, 1)} |"
        )
    if doc["profiles"]:
        lines += ["", "## Profiles (py-spy, GIL-held samples; raw stacks in `profiles/`)", ""]
        for name, s in doc["profiles"].items():
            lines.append(
                f"- **{name}** ({s['samples']} samples): "
                + ", ".join(f"{k} {v:.0f}%" for k, v in s["by_package"].items())
                + "; top leaves: "
                + "; ".join(f"`{k}` {v:.0f}%" for k, v in list(s["top_leaves"].items())[:5])
            )
    lines += ["", *metadata_section(meta)]
    return "\n".join(lines)


def render_plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figs = doc["figures"]
    names = list(figs)
    procs = sorted({p for f in figs.values() for p in f["us_per_added_token"]})
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / max(1, len(names))
    for i, n in enumerate(names):
        xs = [j + i * width for j in range(len(procs))]
        axes[0].bar(xs, [figs[n]["ms_per_request"][str(SHORT)].get(p, 0) for p in procs], width, label=n)
        axes[1].bar(xs, [figs[n]["us_per_added_token"].get(p, 0) for p in procs], width, label=n)
    for ax, title in ((axes[0], f"CPU ms per {SHORT}-token request"), (axes[1], "CPU µs per added token")):
        ax.set_xticks([j + width * (len(names) - 1) / 2 for j in range(len(procs))], procs, rotation=30)
        ax.set_title(title)
        ax.legend()
    axes[0].axhline(TARGET_REQUEST_MS, ls=":", c="grey")
    fig.suptitle("Relay cost per process (simulated engine; CPU of this 2-core machine)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def parse_args(argv: Sequence[str] | None) -> CostConfig:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", type=int, default=100)
    p.add_argument("--window-s", type=float, default=15.0)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--baseline", help="a git revision measured beside this tree, interleaved")
    p.add_argument("--router-ab", action="store_true", help="this tree twice: router service vs shared mode")
    p.add_argument(
        "--env-ab",
        type=parse_setting,
        action="append",
        default=[],
        metavar="LLMLAB_KEY=VALUE",
        help="this tree twice: as configured and with this setting for every process (repeatable)",
    )
    p.add_argument("--dirty", action="store_true", help="measure a modified tree (the result says so)")
    p.add_argument("--no-profile", action="store_true", help="skip the py-spy windows")
    p.add_argument("--out-dir", type=Path, default=Path("results"))
    a = p.parse_args(argv)
    if a.streams < 1 or a.repeats < 1 or a.window_s < 1:
        p.error("--streams, --repeats >= 1 and --window-s >= 1")
    if sum(map(bool, (a.baseline, a.router_ab, a.env_ab))) > 1:
        p.error("--baseline, --router-ab and --env-ab are different A/B runs: one at a time")
    # 2 lengths x variants x repeats windows (+ 2 profiled), each warm-up + window + drain: stay under 15 min.
    per_window = a.window_s + 4.0 + 8.0
    windows = 2 * (2 if a.baseline or a.router_ab or a.env_ab else 1) * a.repeats + (0 if a.no_profile else 2)
    if windows * per_window > 13 * 60:
        p.error(f"{windows} windows of about {per_window:.0f} s pass 13 minutes: fewer --repeats or a shorter window")
    return CostConfig(
        streams=a.streams,
        window_s=a.window_s,
        repeats=a.repeats,
        baseline=a.baseline,
        router_ab=a.router_ab,
        env_ab=dict(a.env_ab),
        dirty=a.dirty,
        profile=not a.no_profile,
        out_dir=a.out_dir,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    cfg = parse_args(args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s cost_bench %(message)s", datefmt="%H:%M:%S")
    for noisy in ("httpx", "httpcore", "matplotlib"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    paths = run(cfg, args)
    doc = json.loads(paths["json"].read_text())
    for name, rows in doc["targets"].items():
        for t in rows:
            log.info("%s: %s = %s -> %s %s", name, t["target"], t["value"], t["result"], t["note"])
    log.info("wrote %s", paths["md"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
