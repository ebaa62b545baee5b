"""Pipelines A, B and C through the engine twin configured as this CPU, beside the real run (issue 20,
scope 1): the same workloads, SLOs, stacks and rounds as :mod:`llmlab_experiments.real_pipelines`, with the
engine simulator in twin mode (``--mode twin``: the twin's step scheduler with chunked prefill, paged KV,
prefix caching and preemption, its step times from the roofline of SmolLM2-135M in fp32 on the CPU device fitted
against real vLLM on the real run's host class by ``llmlab_lab.twin_calibrate_cpu``: ``cpu-local`` for the AVX2
hosts, ``cpu-local-zen4`` and ``cpu-local-avx512`` for the two AVX-512 generations, chosen by ``twin_device``) in
place of vLLM.

Each pipeline's CPU flags map onto the twin: ``--max-num-seqs``, ``--max-num-batched-tokens``,
``--max-model-len`` and prefix caching as written; chunked prefill is how the twin always schedules (as vLLM's
V1 engine does); the KV cache is vLLM's here, 1 GiB in 128-token blocks (vLLM's CPU default block size); the
prompts are counted, and prefix blocks keyed, by SmolLM2's own tokenizer and chat template (the simulator's
``--tokenizer``); the flags the twin does not model are listed with the reason (``NOT_MODELLED``). Every twin
figure is SIMULATED.

The side-by-side table reads the real run from ``<out>/real_pipelines/results.json`` and gives, per cell (A's
rungs both runs measured, B, C with and without caching), the twin's value, the real one and the error
``(twin - real) / real``. Runs of different sizes (a quick run against a full one) are not compared.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from llmlab_experiments.note import Note, metadata, write_experiment
from llmlab_experiments.real_pipelines import (
    FULL,
    KV_SPACE_GIB,
    QUICK,
    ROUNDS,
    CpuLaunch,
    Sizes,
    Spawn,
    execute,
    launches_of_pipelines,
    summarize_runs,
    table,
)

log = logging.getLogger(__name__)

NAME = "twin_pipelines"
REAL = "real_pipelines"
TWIN_MODEL = "SmolLM2-135M"
# The CPU devices of configs/hardware.yaml, one per host class these sessions land on, each fitted on its class:
# vLLM's decode step for one sequence takes ~100 ms on the AVX2 hosts, ~50 on the Zen 4 ones, ~23 on the Zen 5 ones.
TWIN_DEVICE_AVX2 = "cpu-local"
TWIN_DEVICE_ZEN4 = "cpu-local-zen4"
TWIN_DEVICE_ZEN5 = "cpu-local-avx512"
TWIN_DTYPE = "fp32"  # what the real run serves (real_caching_batching.DTYPE) and the device was fitted on
BLOCK_SIZE = 128  # vLLM's CPU default (the pipelines do not set --block-size)
# vLLM flags the simulator takes under the same name
MAPPED = ("--max-num-seqs", "--max-num-batched-tokens", "--max-model-len", "--long-prefill-token-threshold")
NOT_MODELLED = {
    "--enable-chunked-prefill": "the twin always splits prefills at the step's token budget (as vLLM V1 does)",
    "--scheduling-policy": "the twin schedules first come, first served",
    "--stream-interval": "the twin streams every token",
}
# The cells compared, with the metrics and how each is printed.
METRICS = (
    ("goodput_rps", ".3f"),
    ("output_tok_s", ".1f"),
    ("ttft_ms.p50", ".0f"),
    ("ttft_ms.p95", ".0f"),
    ("tpot_ms.p95", ".0f"),
    ("itl_ms.p50", ".0f"),
    ("prefix_hit_rate", ".2f"),
    ("preemptions", ".0f"),
    ("short_ttft_p95_ms", ".0f"),  # C's cells only
)


def kv_blocks() -> int:
    """The twin's KV blocks: the real engine's ``VLLM_CPU_KVCACHE_SPACE`` in blocks of SmolLM2's fp32 KV."""
    from llmlab_twin.hwcatalog import get_model
    from llmlab_twin.kvcalc import kv_bytes_per_token_per_gpu

    per_block = kv_bytes_per_token_per_gpu(get_model(TWIN_MODEL), TWIN_DTYPE, 1) * BLOCK_SIZE
    return int(KV_SPACE_GIB * 2**30 // per_block)


def twin_flags(launch: CpuLaunch) -> tuple[list[str], list[dict[str, Any]]]:
    """The simulator's flags for a pipeline's CPU launch, and the flags left out with the reason."""
    argv: list[str] = []
    left: list[dict[str, Any]] = []
    for name, value in launch.flags.items():
        if name in MAPPED:
            argv += [name, str(value)]
        elif name == "--enable-prefix-caching":
            argv.append("--prefix-caching" if value else "--no-prefix-caching")
        else:
            reason = NOT_MODELLED.get(name, "no twin setting")
            left.append({"flag": name, "value": value, "reason": reason})
    return argv, left


def twin_device(cpu: str | None = None) -> str:
    """The twin's CPU device for a host, from the ``cpu`` field of a result's metadata
    (``llmlab_loadtest.bench_meta.cpu_model``); this host's when none is given. AVX-512 with
    ``avx512_vp2intersect`` (or family 26) is a Zen 5 part, AVX-512 without it a Zen 4 one. The field named no ISA
    before 2026-12-06 (read as AVX2, the class every earlier fit was made on) and not ``avx512_vp2intersect`` before
    the Zen 4 fit (an AVX-512 field of that time is read as Zen 4; the one Zen 5 run, the calibration that fitted
    ``cpu-local-avx512``, names its device itself)."""
    from llmlab_loadtest.bench_meta import cpu_model

    cpu = cpu_model() if cpu is None else cpu
    if "avx512_vp2intersect" in cpu or "(family 26 " in cpu:
        return TWIN_DEVICE_ZEN5
    return TWIN_DEVICE_ZEN4 if "avx512f" in cpu else TWIN_DEVICE_AVX2


def twin_command(port: int, launch: CpuLaunch, device: str | None = None) -> list[str]:
    from llmlab_testkit.vllm import MODEL_DIR, SERVED_NAME

    argv, _ = twin_flags(launch)
    device = device or twin_device()
    return [
        sys.executable, "-m", "llmlab_engine_sim", "--flavor", "vllm", "--model", SERVED_NAME,
        "--host", "127.0.0.1", "--port", str(port), "--mode", "twin", "--twin-model", TWIN_MODEL,
        "--twin-device", device, "--twin-dtype", TWIN_DTYPE, "--block-size", str(BLOCK_SIZE),
        "--num-gpu-blocks", str(kv_blocks()),
        # the real model's tokenizer and chat template: the same prompt lengths and prefix blocks as vLLM
        "--tokenizer", str(MODEL_DIR),
        # max_tokens decides every length (the real run bans end tokens): never the simulator's own length
        "--output-len", "100000",
        *argv,
    ]  # fmt: skip


def twin_spawner(device: str) -> Spawn:
    """A ``Spawn`` of twin engines on ``device``."""

    def spawn(key: str, port: int, launch: CpuLaunch) -> Any:
        from llmlab_testkit.procs import ManagedProcess

        # the simulator refuses to start outside dev without NATS/keys settings it does not use here
        return ManagedProcess(
            f"twin-{key}",
            twin_command(port, launch, device),
            {"LLMLAB_ENV": "dev"},
            ready_url=f"http://127.0.0.1:{port}/health",
        )

    return spawn


def twin_process(key: str, port: int, launch: CpuLaunch) -> Any:
    """A twin engine of this host's class."""
    return twin_spawner(twin_device())(key, port, launch)


def twin_fields(
    t_start: float, duration: float, command: str, behind: str, device: str | None = None
) -> dict[str, Any]:
    """The metadata fields every experiment on this twin shares (as ``cpu_vllm_fields`` for real vLLM)."""
    import datetime as dt

    from llmlab_testkit.vllm import SERVED_NAME

    return {
        "started": dt.datetime.fromtimestamp(t_start, dt.UTC),
        "duration_s": duration,
        "command": command,
        "simulated": True,
        "model_id": f"{SERVED_NAME} (twin: {TWIN_MODEL}, {TWIN_DTYPE})",
        "engine": f"llmlab-engine-sim --mode twin on {device or twin_device()} {behind}",
    }


# ---- side by side ---------------------------------------------------------------------------------------------


def cells(summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The comparable cells of a summary: A's rungs, B, C and C-no-cache (C's short chats' TTFT added)."""
    out = {f"A batch limit {k}": v for k, v in summary["A"]["walk"].items()}
    out["B"] = summary["B"]
    for key in ("C", "C-no-cache"):
        out[key] = dict(summary[key])
    return out


def error_pct(twin: float | None, real: float | None) -> float | None:
    if twin is None or real is None or real == 0:
        return None
    return round((twin - real) / real * 100, 1)


def side_by_side(twin: dict[str, Any], real: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per cell both runs measured and metric: twin mean, real mean, error %."""
    tc, rc = cells(twin), cells(real)
    rows: list[dict[str, Any]] = []
    for cell in (c for c in tc if c in rc):
        for metric, _ in METRICS:
            if metric not in tc[cell] or metric not in rc[cell]:
                continue
            t, r = tc[cell][metric]["mean"], rc[cell][metric]["mean"]
            rows.append({"cell": cell, "metric": metric, "twin": t, "real": r, "error_pct": error_pct(t, r)})
    return rows


def mean_abs_error(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """Mean |error| per metric over the cells (cells where the real value is 0 have none)."""
    out: dict[str, float | None] = {}
    for metric in dict.fromkeys(r["metric"] for r in rows):
        errs = [abs(r["error_pct"]) for r in rows if r["metric"] == metric and r["error_pct"] is not None]
        out[metric] = round(sum(errs) / len(errs), 1) if errs else None
    return out


def side_table(rows: list[dict[str, Any]]) -> str:
    fmt = dict(METRICS)
    by_cell: dict[str, dict[str, dict[str, Any]]] = {}
    for r in rows:
        by_cell.setdefault(r["cell"], {})[r["metric"]] = r
    metrics = [m for m in fmt if any(m in v for v in by_cell.values())]
    lines = [
        "| cell | " + " | ".join(metrics) + " |",
        "|---|" + "---:|" * len(metrics),
    ]
    for cell, ms in by_cell.items():
        parts = []
        for m in metrics:
            x = ms.get(m)
            if x is None or x["twin"] is None or x["real"] is None:
                parts.append("–")
                continue
            err = "" if x["error_pct"] is None else f" ({x['error_pct']:+.0f}%)"
            parts.append(f"{x['twin']:{fmt[m]}} / {x['real']:{fmt[m]}}{err}")
        lines.append(f"| {cell} | " + " | ".join(parts) + " |")
    mae = mean_abs_error(rows)
    lines += ["", "Mean |error| over the cells: " + ", ".join(f"{k} {v}%" for k, v in mae.items() if v is not None)]
    return "\n".join(lines)


def prompt_tokens_per_request(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Prompt tokens the engine counted per request, by engine (the twin with SmolLM2's tokenizer: these should
    agree with the real run's)."""
    out: dict[str, float] = {}
    for key in ("A", "B", "C", "C-no-cache"):
        rs = [r for r in rows if r["engine"] == key]
        n = sum(r["requests"]["ok"] for r in rs)  # a request refused at admission never reached the engine
        if n:
            out[key] = round(sum(r["engine_counters_delta"]["prompt_tokens_total"] for r in rs) / n, 1)
    return out


def real_to_compare(
    out: Path, name: str, same_run: Callable[[dict[str, Any]], bool], what: str
) -> tuple[dict[str, Any] | None, str, str]:
    """The real run a twin run is compared with: (its rows, or None with why not; the twin's device). The rows
    count only when ``same_run`` says they hold the same workload; the device is then the one fitted on the real
    run's host class (the twin models the host the real run ran on, not necessarily this one), else this host's."""
    path = out / name / "results.json"
    if not path.exists():
        return None, f"no real run at {path}", twin_device()
    whole = json.loads(path.read_text())
    if not same_run(whole["rows"]):
        return None, f"the real run at {path} has other {what}", twin_device()
    return whole["rows"], "", twin_device(str(whole.get("meta", {}).get("cpu", "")))


def run(out: Path, quick: bool, command: str) -> Path:
    s = QUICK if quick else FULL
    sizes = {k: list(v) if isinstance(v, tuple) else v for k, v in vars(s).items()}
    real, why_not, device = real_to_compare(
        out, REAL, lambda doc: doc["sizes"] == sizes, f"sizes ({'quick' if quick else 'full'} here)"
    )
    t_start = time.time()
    launches = launches_of_pipelines()
    rows, servers = execute(s, launches, twin_spawner(device))
    duration = time.time() - t_start
    summary = summarize_runs(rows)
    compared = side_by_side(summary, real["summary"]) if real else []
    tokens = {"twin": prompt_tokens_per_request(rows), "real": prompt_tokens_per_request(real["runs"]) if real else {}}
    return report(
        out, command, s, rows, servers, launches, summary, compared, tokens, why_not, t_start, duration, device
    )


def report(
    out: Path,
    command: str,
    s: Sizes,
    rows: list[dict[str, Any]],
    servers: list[dict[str, Any]],
    launches: dict[str, CpuLaunch],
    summary: dict[str, Any],
    compared: list[dict[str, Any]],
    tokens: dict[str, dict[str, float]],
    why_not: str,
    t_start: float,
    duration: float,
    device: str,
) -> Path:
    blocks = kv_blocks()
    mae = mean_abs_error(compared)
    tok_line = ", ".join(
        f"{k} {tokens['twin'][k]:.0f} (real {tokens['real'][k]:.0f})" if k in tokens["real"] else f"{k} {v:.0f}"
        for k, v in tokens["twin"].items()
    )
    md = [
        "## Side by side: twin / real (error)" if compared else f"## Side by side: not compared ({why_not})",
        "",
    ]
    if compared:
        md += [
            "Each cell: the twin's mean over its rounds / the real run's mean (`results/real_pipelines`), and the "
            "twin's error against the real value.",
            "",
            side_table(compared),
            "",
        ]
    md += [
        f"Prompt tokens per request as each engine counted them: {tok_line}.",
        "",
        "## The twin's run",
        "",
        # (the real run's flags table is real_pipelines'; the twin's own settings follow)
        table(summary, launches).split("\n\n## Flags as launched")[0],
        "",
        "## Twin settings per pipeline",
        "",
        "| pipeline | simulator flags | not modelled |",
        "|---|---|---|",
    ]
    for key, launch in launches.items():
        argv, left = twin_flags(launch)
        not_mod = "; ".join(f"`{x['flag']} {x['value']}`: {x['reason']}" for x in left) or "none"
        md.append(f"| {key} | `{' '.join(argv)}` | {not_mod} |")
    md += [
        "",
        f"All pipelines: `--mode twin --twin-model {TWIN_MODEL} --twin-device {device} --twin-dtype {TWIN_DTYPE} "
        f"--block-size {BLOCK_SIZE} --num-gpu-blocks {blocks}` ({KV_SPACE_GIB} GiB of fp32 KV, as the real "
        "engines had).",
    ]
    meta = metadata(
        **twin_fields(t_start, duration, command, "behind gateway -> NATS -> worker-vllm", device),
        prompt_dataset="as real_pipelines (synthetic, seeded: the same requests)",
        input_length_distribution="as real_pipelines; prompt tokens per request: " + tok_line,
        output_length_distribution=f"fixed: A {s.a_max_tokens}, B {s.b_max_tokens}, C {s.c_max_tokens}, short 4",
        concurrency="as real_pipelines",
        warmup="as real_pipelines",
        sampling_parameters={"temperature": 0},
        rounds=ROUNDS,
        twin={
            "model": TWIN_MODEL,
            "device": device,
            "dtype": TWIN_DTYPE,
            "block_size": BLOCK_SIZE,
            "num_gpu_blocks": blocks,
        },
        compared_with=f"results/{REAL}" if compared else why_not,
    )
    a = summary["A"]
    n_failed = sum(r["requests"]["failed"] for r in rows)
    worst = max((r for r in compared if r["error_pct"] is not None), key=lambda r: abs(r["error_pct"]), default=None)
    note = Note(
        title="Pipelines A, B and C through the engine twin configured as this CPU, beside the real run",
        hypothesis=(
            "The twin, fitted on closed-loop cells of 128-token prompts (TTFT 11.5%, ITL 9.2%, tokens/s 9.1% mean "
            "error on its held-out cells), predicts the pipelines' runs through the whole stack within about 20%: "
            "it models the engine, and the stack adds little on this scale."
        ),
        fixed_conditions=[
            "the same workloads, SLOs, stacks, rounds and order as real_pipelines (the same code drives both)",
            f"twin: {TWIN_MODEL} on {device} (the real run's host class) in {TWIN_DTYPE}, {BLOCK_SIZE}-token "
            f"blocks, {blocks} blocks "
            f"({KV_SPACE_GIB} GiB, the real engines' KV space); end tokens banned on the real side, so lengths match",
            "the twin counts prompts with SmolLM2's own tokenizer and chat template (--tokenizer), so prompt "
            "lengths and prefix blocks are the real engine's (counts in the table)",
        ],
        changed_variable="the engine: the twin instead of vLLM-on-CPU",
        expected="errors within about 20% on TTFT, ITL and throughput; the same A rung chosen; C's hit rates close.",
        actual=(
            f"the twin's walk chose batch limit {a['chosen_batch_limit']}; mean |error| "
            + (", ".join(f"{k} {v}%" for k, v in mae.items() if v is not None) if compared else f"n/a ({why_not})")
            + (
                f"; the largest: {worst['metric']} of {worst['cell']} at {worst['error_pct']:+.0f}%"
                if worst is not None
                else ""
            )
            + ". "
            + (f"{n_failed} requests FAILED (see results.json)." if n_failed else "Every request succeeded.")
        ),
        interpretation=(
            "Where the error is large, the table's cells say which part of the engine the twin gets wrong: queueing "
            "(TTFT at low batch limits), the step time under a big batch (TPOT, ITL) or the prefill of long prompts "
            "(C's TTFT, with the prompt-token counts beside it)."
        ),
        unverified=[
            "every twin figure (SIMULATED)",
            "the flags the twin does not model (listed per pipeline)",
            "the real run is one committed run (two rounds); its own spread is in results/real_pipelines",
        ],
        next_experiment="refit the twin's CPU device with these cells when the error is beyond its calibration's",
    )
    doc = {"runs": rows, "summary": summary, "servers": servers, "side_by_side": compared,
           "mean_abs_error_pct": mae, "prompt_tokens_per_request": tokens, "sizes": vars(s)}  # fmt: skip
    return write_experiment(
        out,
        name=NAME,
        simulated=True,
        rows=doc,
        table_md="\n".join(md),
        note=note,
        command=command,
        meta=meta,
        plot=lambda p: plot(compared, p),
    )


def plot(compared: list[dict[str, Any]], path: Path) -> None:
    plot_against_real(
        compared,
        path,
        ("ttft_ms.p50", "tpot_ms.p95", "output_tok_s"),
        "Pipelines A, B, C: twin against real, per cell (dotted: equal)",
    )


def plot_against_real(compared: list[dict[str, Any]], path: Path, metrics: Sequence[str], title: str) -> None:
    """The twin's value against the real one, per compared cell, for up to three metrics, log-log."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    shown = [r for r in compared if r["metric"] in metrics]
    for metric, marker in zip(metrics, ("o", "s", "^"), strict=False):
        pts = [(r["real"], r["twin"]) for r in shown if r["metric"] == metric and r["real"] and r["twin"]]
        if pts:
            ax.scatter(*zip(*pts, strict=True), marker=marker, label=metric)
    lim = [v for r in shown for v in (r["real"], r["twin"]) if v]
    if lim:
        lo, hi = min(lim) * 0.8, max(lim) * 1.25
        ax.plot([lo, hi], [lo, hi], "k:", lw=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
    ax.set_xlabel("real vLLM on this CPU (MEASURED)")
    ax.set_ylabel("engine twin (SIMULATED)")
    ax.set_title(title)
    if shown:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
