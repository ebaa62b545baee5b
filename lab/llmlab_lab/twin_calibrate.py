"""Calibrate the roofline's EfficiencyParams against published serving measurements.

    python -m llmlab_lab.twin_calibrate gpu [--points configs/twin-calibration-points.yaml] [--out-dir results]

Writes results/twin-calibration-gpu.{json,md,png}. Per device, the parameters (compute_eff, bw_eff,
step_overhead_s) are fitted on the points marked `split: fit` and the error is reported on every point, the
held-out ones apart. Predictions are model outputs (simulated); the measured values are the published ones.

Steady-state batch model (not a scheduler: the twin's scheduler does the full thing):
  * concurrent sequences B = min(concurrency or max_num_seqs, KV tokens // footprint), the KV tokens from
    kvcalc.plan; footprint = ISL + OSL for TensorRT-LLM (guaranteed-no-evict reserves the whole request) and
    ISL + OSL/2 for vLLM (paged blocks allocated as tokens arrive; average over a request's life).
  * each step decodes B tokens and, on average, prefills B * ISL / OSL prompt tokens (a request finishes every
    OSL/B steps and one enters); context per decode seq is ISL + OSL/2; prefill attention is ISL^2/2 per prompt.
  * output tokens/s = B / step_seconds; ITL = TPOT = step_seconds of that mixed step;
    at concurrency 1: TTFT = one prefill step of ISL, ITL = a decode step at context ISL + OSL/2.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import math
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

import yaml
from llmlab_loadtest import bench_meta
from llmlab_twin.hwcatalog import (
    CatalogError,
    DeviceSpec,
    ModelSpec,
    config_dir,
    get_device,
    get_model,
)
from llmlab_twin.kvcalc import plan
from llmlab_twin.roofline import EfficiencyParams, RooflineCostModel, StepBatch, params_for
from pydantic import BaseModel, ConfigDict, ValidationError

log = logging.getLogger(__name__)

Metric = Literal["output_throughput_tok_s", "ttft_s", "itl_s", "tpot_s"]
KvRule = Literal["vllm", "trtllm"]

# Engine defaults the published rows do not state (assumptions, named in TWIN.md).
ENGINE_DEFAULTS: dict[str, dict[str, Any]] = {
    "TensorRT-LLM": {"kv_rule": "trtllm", "gpu_mem_util": 0.90, "max_num_seqs": 2048},
    "vLLM": {"kv_rule": "vllm", "gpu_mem_util": 0.90, "max_num_seqs": 256},
    "SGLang": {"kv_rule": "vllm", "gpu_mem_util": 0.88, "max_num_seqs": 1024},
}


@dataclass(frozen=True)
class MeasuredPoint:
    """One measured operating point, engine-agnostic: what fit_from_points consumes (GPU or this CPU)."""

    metric: Metric
    value: float
    input_len: int
    output_len: int
    concurrency: int | None = None  # None: offline / infinite request rate
    dtype: str = "bf16"
    kv_dtype: str | None = None
    tp: int = 1
    max_num_seqs: int = 256
    kv_rule: KvRule = "vllm"
    gpu_mem_util: float = 0.9
    label: str = ""


# ---- steady-state predictions ------------------------------------------------------------------------------


def concurrent_seqs(model: ModelSpec, device: DeviceSpec, pt: MeasuredPoint) -> int:
    """Sequences running at once: the concurrency (or max_num_seqs) capped by what the KV cache holds."""
    kv = plan(
        model,
        device,
        dtype=pt.dtype,
        kv_dtype=pt.kv_dtype,
        gpu_mem_util=pt.gpu_mem_util,
        tp=pt.tp,
        context=pt.input_len + pt.output_len,
        rule=pt.kv_rule,
    )
    footprint = pt.input_len + pt.output_len if pt.kv_rule == "trtllm" else pt.input_len + pt.output_len / 2
    cap = int(kv.max_tokens // footprint)
    want = pt.max_num_seqs if pt.concurrency is None else min(pt.concurrency, pt.max_num_seqs)
    return max(0, min(want, cap))


def steady_step(b: int, isl: int, osl: int) -> StepBatch:
    arrivals = b / osl  # requests admitted per step in steady state
    return StepBatch(
        prefill_tokens=round(arrivals * isl),
        prefill_context_tokens=round(arrivals * isl * isl / 2),
        decode_seqs=b,
        decode_context_tokens=round(b * (isl + osl / 2)),
    )


def predict(cm: RooflineCostModel, pt: MeasuredPoint) -> float:
    """The model's value for `pt.metric` (seconds or tokens/s); nan when not even one request fits."""
    b = concurrent_seqs(cm.model, cm.device, pt)
    if b < 1:
        return math.nan
    isl, osl = pt.input_len, pt.output_len
    if pt.metric == "ttft_s":
        if b == 1:
            return cm.step_seconds(StepBatch(isl, isl * isl // 2, 0, 0))
        # A new prompt shares its step with the other B-1 decoding sequences.
        return cm.step_seconds(StepBatch(isl, isl * isl // 2, b - 1, round((b - 1) * (isl + osl / 2))))
    if b == 1:
        step = cm.step_seconds(StepBatch(0, 0, 1, round(isl + osl / 2)))
    else:
        step = cm.step_seconds(steady_step(b, isl, osl))
    if pt.metric == "output_throughput_tok_s":
        if b == 1:  # one request at a time: prefill then OSL decode steps
            ttft = cm.step_seconds(StepBatch(isl, isl * isl // 2, 0, 0))
            return osl / (ttft + (osl - 1) * step)
        return b / step
    return step  # itl_s / tpot_s


# ---- fitting -----------------------------------------------------------------------------------------------


def _nelder_mead(
    f: Callable[[list[float]], float], x0: list[float], step: float = 0.5, iters: int = 400
) -> list[float]:
    """Minimal Nelder-Mead (no scipy in .venv); 3 parameters, smooth-enough loss."""
    n = len(x0)
    simplex = [list(x0)] + [[x + (step if i == j else 0.0) for j, x in enumerate(x0)] for i in range(n)]
    vals = [f(x) for x in simplex]
    for _ in range(iters):
        order = sorted(range(n + 1), key=vals.__getitem__)
        simplex = [simplex[i] for i in order]
        vals = [vals[i] for i in order]
        if abs(vals[-1] - vals[0]) < 1e-10:
            break
        centroid = [sum(p[j] for p in simplex[:-1]) / n for j in range(n)]
        worst = simplex[-1]
        refl = [c + (c - w) for c, w in zip(centroid, worst, strict=True)]
        fr = f(refl)
        if fr < vals[0]:
            exp = [c + 2 * (c - w) for c, w in zip(centroid, worst, strict=True)]
            fe = f(exp)
            simplex[-1], vals[-1] = (exp, fe) if fe < fr else (refl, fr)
        elif fr < vals[-2]:
            simplex[-1], vals[-1] = refl, fr
        else:
            con = [c + 0.5 * (w - c) for c, w in zip(centroid, worst, strict=True)]
            fc = f(con)
            if fc < vals[-1]:
                simplex[-1], vals[-1] = con, fc
            else:
                best = simplex[0]
                simplex = [best] + [[b + 0.5 * (x - b) for b, x in zip(best, p, strict=True)] for p in simplex[1:]]
                vals = [vals[0]] + [f(p) for p in simplex[1:]]
    return simplex[min(range(n + 1), key=vals.__getitem__)]


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def _logit(p: float) -> float:
    return math.log(p / (1 - p))


def _params_from(x: Sequence[float], base: EfficiencyParams) -> EfficiencyParams:
    # Efficiencies live in (0, 1) and the overhead is positive: optimise unconstrained transforms.
    return replace(base, compute_eff=_sigmoid(x[0]), bw_eff=_sigmoid(x[1]), step_overhead_s=math.exp(x[2]))


def log_error(cm: RooflineCostModel, pt: MeasuredPoint) -> float:
    pred = predict(cm, pt)
    if not math.isfinite(pred) or pred <= 0:
        return 10.0  # a point the model cannot serve counts as a large miss, not a crash
    return math.log(pred / pt.value)


def fit_from_points(
    points: Sequence[MeasuredPoint],
    model: ModelSpec | str,
    device: DeviceSpec | str,
    *,
    base: EfficiencyParams | None = None,
) -> EfficiencyParams:
    """Fit compute_eff, bw_eff and step_overhead_s to measured points (any mix of throughput/TTFT/ITL/TPOT)
    of one model on one device, minimising the mean squared log error; other fields keep `base`'s values."""
    m = get_model(model) if isinstance(model, str) else model
    d = get_device(device) if isinstance(device, str) else device
    base = base or EfficiencyParams()
    if not points:
        raise ValueError("fit_from_points needs at least one point")

    def loss(x: list[float]) -> float:
        p = _params_from(x, base)
        total = 0.0
        for pt in points:
            cm = RooflineCostModel(m, d, dtype=pt.dtype, kv_dtype=pt.kv_dtype, tp=pt.tp, params=p)
            total += log_error(cm, pt) ** 2
        return total / len(points)

    # Coarse grid first: the loss has flat regions (a parameter that binds no point), so one start can stall.
    starts = [[_logit(c), _logit(b), math.log(o)] for c in (0.3, 0.6) for b in (0.5, 0.85) for o in (1e-3, 1e-2, 5e-2)]
    best_x = min(starts, key=loss)
    x = _nelder_mead(loss, best_x)
    x = _nelder_mead(loss, x, step=0.2)  # restart: Nelder-Mead collapses its simplex early on flat losses
    return _params_from(x, base)


# ---- published points --------------------------------------------------------------------------------------


class _Source(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str
    title: str
    date: str
    engine: str
    engine_version: str


class CalibrationPoint(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str
    source: str
    device: str
    gpu_count: int
    tp: int
    model: str
    dtype: str
    kv_dtype: str | None = None
    input_len: int
    output_len: int
    concurrency: int | None
    metric: Metric
    value: float
    # fit: the device's efficiencies (TensorRT-LLM tables); fit_engine: the engine's own per-step overhead on
    # top of the device fit (one engine, few points); holdout: only to report error.
    split: Literal["fit", "fit_engine", "holdout"]
    confidence: Literal["high", "medium", "low"]
    max_num_seqs: int | None = None
    gpu_mem_util: float | None = None


class _PointsFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: Literal[1]
    sources: dict[str, _Source]
    points: list[CalibrationPoint]


def load_points(path: str | Path | None = None) -> tuple[dict[str, _Source], list[CalibrationPoint]]:
    p = Path(path) if path else config_dir() / "twin-calibration-points.yaml"
    try:
        data = _PointsFile.model_validate(yaml.safe_load(p.read_text()))
    except (OSError, yaml.YAMLError, ValidationError) as exc:
        raise CatalogError(f"{p}: {exc}") from exc
    for pt in data.points:
        if pt.source not in data.sources:
            raise CatalogError(f"{p}: point {pt.id} cites unknown source {pt.source!r}")
    return data.sources, data.points


def to_measured(pt: CalibrationPoint, engine: str) -> MeasuredPoint:
    d = ENGINE_DEFAULTS.get(engine, ENGINE_DEFAULTS["vLLM"])
    return MeasuredPoint(
        metric=pt.metric,
        value=pt.value,
        input_len=pt.input_len,
        output_len=pt.output_len,
        concurrency=pt.concurrency,
        dtype=pt.dtype,
        kv_dtype=pt.kv_dtype,
        tp=pt.tp,
        max_num_seqs=pt.max_num_seqs or d["max_num_seqs"],
        kv_rule=d["kv_rule"],
        gpu_mem_util=pt.gpu_mem_util or d["gpu_mem_util"],
        label=pt.id,
    )


def calibrate_gpu(points_path: str | Path | None = None) -> dict[str, Any]:
    """Fit per device on the `fit` points, predict every point, return the report dict."""
    sources, points = load_points(points_path)
    by_device: dict[str, list[CalibrationPoint]] = {}
    for pt in points:
        by_device.setdefault(pt.device, []).append(pt)
    fitted: dict[str, dict[str, Any]] = {}
    device_params: dict[str, EfficiencyParams] = {}
    rows: list[dict[str, Any]] = []
    pending: list[tuple[CalibrationPoint, DeviceSpec]] = []
    for dev_name, dev_points in by_device.items():
        device = get_device(dev_name)
        fit_pts = [p for p in dev_points if p.split == "fit"]
        models = {p.model for p in fit_pts}
        if len(models) > 1:
            raise CatalogError(f"{dev_name}: fit points mix models {sorted(models)}; fit one model per device")
        if fit_pts:
            params = fit_from_points(
                [to_measured(p, sources[p.source].engine) for p in fit_pts], fit_pts[0].model, device
            )
            fitted[dev_name] = {"fit_model": fit_pts[0].model, "n_fit": len(fit_pts), **asdict(params)}
        elif device.efficiency is not None:
            params = params_for(device)  # the stored parameters (e.g. a sibling device's fit)
            log.info("%s: no fit points; predicting with its stored efficiency", dev_name)
        else:
            params = EfficiencyParams()
            log.warning("%s: no fit points; predicting with default EfficiencyParams", dev_name)
        device_params[dev_name] = params
        pending += [(p, device) for p in dev_points]
    engines = fit_engine_overheads(
        [p for p in points if p.split == "fit_engine"], sources, {d: get_device(d) for d in by_device}, device_params
    )
    for p, device in pending:
        dev_name = device.name
        engine = sources[p.source].engine
        params = device_params[dev_name]
        if engine in engines:
            params = replace(params, step_overhead_s=engines[engine])
        m = get_model(p.model)
        mp = to_measured(p, engine)
        cm = RooflineCostModel(m, device, dtype=p.dtype, kv_dtype=p.kv_dtype, tp=p.tp, params=params)
        pred = predict(cm, mp)
        b = concurrent_seqs(m, device, mp)
        rows.append(
            {
                "id": p.id,
                "source": p.source,
                "engine": sources[p.source].engine,
                "device": dev_name,
                "model": p.model,
                "tp": p.tp,
                "dtype": p.dtype,
                "isl": p.input_len,
                "osl": p.output_len,
                "metric": p.metric,
                "split": p.split,
                "confidence": p.confidence,
                "measured": p.value,
                "predicted_simulated": pred,
                "error_pct": 100.0 * (pred - p.value) / p.value if math.isfinite(pred) else None,
                "concurrent_seqs_simulated": b,
                "params_fitted_on": fitted.get(dev_name, {}).get(
                    "fit_model", "stored" if device.efficiency is not None else "defaults"
                ),
            }
        )
    return {
        "sources": {k: v.model_dump() for k, v in sources.items()},
        "fitted": fitted,
        "engine_step_overhead_s": engines,
        "points": rows,
    }


def fit_engine_overheads(
    points: Sequence[CalibrationPoint],
    sources: dict[str, _Source],
    devices: dict[str, DeviceSpec],
    device_params: dict[str, EfficiencyParams],
) -> dict[str, float]:
    """Per engine, the per-step overhead that best fits its ``fit_engine`` points with each device's fitted
    efficiencies kept (a one-parameter log-space grid search: the TensorRT-LLM max-load fit leaves a
    per-step overhead that a lightly loaded vLLM step does not pay)."""
    out: dict[str, float] = {}
    by_engine: dict[str, list[CalibrationPoint]] = {}
    for p in points:
        by_engine.setdefault(sources[p.source].engine, []).append(p)
    grid = [1e-5 * (1.02**i) for i in range(600)]  # 10 µs .. ~1.5 s
    for engine, pts in by_engine.items():

        def loss(o: float, pts: list[CalibrationPoint] = pts, engine: str = engine) -> float:
            total = 0.0
            for p in pts:
                params = replace(device_params.get(p.device, EfficiencyParams()), step_overhead_s=o)
                cm = RooflineCostModel(
                    get_model(p.model), devices[p.device], dtype=p.dtype, kv_dtype=p.kv_dtype, tp=p.tp, params=params
                )
                total += log_error(cm, to_measured(p, engine)) ** 2
            return total

        out[engine] = min(grid, key=loss)
    return out


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean/max absolute % error per (device, group), groups: fit; holdout 8B TP1; holdout 70B; others."""

    def group(r: dict[str, Any]) -> str:
        if r["split"] == "fit":
            return "fit"
        if r["split"] == "fit_engine":
            return f"fit {r['engine']} step overhead"
        if r["engine"] != "TensorRT-LLM":
            return f"holdout {r['engine']} {r['metric']}"
        return f"holdout {r['model']} tp{r['tp']}"

    groups: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        err = r["error_pct"]
        groups.setdefault((r["device"], group(r)), []).append(abs(err) if err is not None else math.inf)
    out = []
    for (dev, g), errs in sorted(groups.items()):
        out.append(
            {
                "device": dev,
                "group": g,
                "n": len(errs),
                "mape_pct": sum(errs) / len(errs),
                "max_abs_err_pct": max(errs),
                "within_10pct": sum(e <= 10 for e in errs),
            }
        )
    return out


# ---- output ------------------------------------------------------------------------------------------------


def write_outputs(report: dict[str, Any], out_dir: Path, command: str, started: dt.datetime, dur: float) -> None:
    meta = bench_meta.metadata_block(
        started=started,
        duration_s=dur,
        engine="roofline twin (llmlab_twin.roofline) vs published TensorRT-LLM/vLLM numbers",
        model_id="meta-llama/Llama-3.1-8B-Instruct (fit), meta-llama/Llama-3.1-70B-Instruct (held out)",
        concurrency="offline / infinite request rate (published rows); 1 for the vLLM ITL point",
        warmup="n/a (no run: fitted to published measurements)",
        prompt_dataset="synthetic fixed ISL/OSL (trtllm-bench prepare_dataset, stdev 0), as published",
        input_length_distribution="fixed per row: 128, 500, 1000, 2048, 5000, 20000",
        output_length_distribution="fixed per row: 128, 500, 1000, 2000, 2048, 4096",
        sampling_parameters="as published (not stated per row)",
        command=command,
        simulated=True,
        gpu="none here: predictions are simulated; measurements are published on H100/H200/L40S/A100",
        engine_version="n/a (model); published engines: TensorRT-LLM 0.17, vLLM < 0.6",
        simulated_note=(
            "`predicted_simulated` values are roofline model outputs (simulated), not measurements; "
            "`measured` values are the published numbers cited in `sources`."
        ),
    )
    report = {"meta": meta, "summary": summarise(report["points"]), **report}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "twin-calibration-gpu.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    (out_dir / "twin-calibration-gpu.md").write_text(render_md(report))
    _plot(report, out_dir / "twin-calibration-gpu.png")


def render_md(report: dict[str, Any]) -> str:
    lines = [
        "# Engine twin: roofline calibration against published GPU numbers",
        "",
        "Predicted values are **simulated** (roofline model output); measured values are published (sources below).",
        f"Command: `{report['meta']['command_line']}` (date {report['meta']['date']}, "
        f"git {report['meta']['git_commit'][:12]}).",
        "",
        "## Fitted parameters (per device, on the `fit` points)",
        "",
        "| device | fitted on | n | compute_eff | bw_eff | step_overhead_ms |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for dev, f in report["fitted"].items():
        lines.append(
            f"| {dev} | {f['fit_model']} | {f['n_fit']} | {f['compute_eff']:.3f} | {f['bw_eff']:.3f} | "
            f"{1e3 * f['step_overhead_s']:.2f} |"
        )
    lines += [
        "",
        "## Error summary (|predicted - measured| / measured)",
        "",
        "| device | group | n | mean abs err % | max abs err % | within 10% |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for s in report["summary"]:
        lines.append(
            f"| {s['device']} | {s['group']} | {s['n']} | {s['mape_pct']:.1f} | {s['max_abs_err_pct']:.1f} | "
            f"{s['within_10pct']}/{s['n']} |"
        )
    lines += [
        "",
        "## Every point",
        "",
        "| id | split | metric | measured | predicted (simulated) | err % | B (simulated) |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for r in report["points"]:
        err = "n/a" if r["error_pct"] is None else f"{r['error_pct']:+.1f}"
        lines.append(
            f"| {r['id']} | {r['split']} | {r['metric']} | {r['measured']:.4g} | "
            f"{r['predicted_simulated']:.4g} | {err} | {r['concurrent_seqs_simulated']} |"
        )
    lines += ["", "## Sources", ""]
    for k, s in report["sources"].items():
        lines.append(f"- `{k}`: [{s['title']}]({s['url']}) ({s['date']}, {s['engine']} {s['engine_version']})")
    return "\n".join(lines) + "\n"


def _plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 6))
    colors = {"H200": "tab:purple", "H100-SXM": "tab:blue", "L40S": "tab:green", "A100-80GB": "tab:orange"}
    thr = [r for r in report["points"] if r["metric"] == "output_throughput_tok_s" and r["error_pct"] is not None]
    for r in thr:
        ax.scatter(
            r["measured"],
            r["predicted_simulated"],
            c=colors.get(r["device"], "gray"),
            marker="o" if r["split"] == "fit" else ("^" if r["model"].endswith("70B") else "x"),
            s=28,
        )
    lo = min(min(r["measured"], r["predicted_simulated"]) for r in thr) * 0.8
    hi = max(max(r["measured"], r["predicted_simulated"]) for r in thr) * 1.2
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
    ax.fill_between([lo, hi], [lo * 0.9, hi * 0.9], [lo * 1.1, hi * 1.1], color="gray", alpha=0.15, label="±10%")
    for dev, c in colors.items():
        ax.scatter([], [], c=c, label=dev)
    ax.scatter([], [], c="k", marker="o", label="fit (8B TP1)")
    ax.scatter([], [], c="k", marker="x", label="held out (8B TP1)")
    ax.scatter([], [], c="k", marker="^", label="held out (70B, TP1-4)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("published output tokens/s (TensorRT-LLM 0.17, offline max load)")
    ax.set_ylabel("roofline prediction, tokens/s (SIMULATED)")
    ax.set_title("Engine twin calibration: simulated vs published")
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def efficiency_yaml(fitted: dict[str, dict[str, Any]]) -> str:
    """The `efficiency:` blocks to paste into configs/hardware.yaml."""
    out = []
    for dev, f in fitted.items():
        out.append(
            f"# {dev}\n    efficiency:\n      compute_eff: {f['compute_eff']:.4f}\n      bw_eff: {f['bw_eff']:.4f}\n"
            f"      step_overhead_s: {f['step_overhead_s']:.6f}\n"
            f"      source: results/twin-calibration-gpu.json (fit on {f['n_fit']} {f['fit_model']} points)"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m llmlab_lab.twin_calibrate", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gpu", help="fit per device on published GPU points, report held-out error")
    g.add_argument("--points", default=None, help="default: configs/twin-calibration-points.yaml")
    g.add_argument("--out-dir", default="results")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    started = dt.datetime.now(dt.UTC)
    t0 = time.perf_counter()
    report = calibrate_gpu(args.points)
    command = "python -m llmlab_lab.twin_calibrate " + shlex.join(argv if argv is not None else sys.argv[1:])
    write_outputs(report, Path(args.out_dir), command, started, time.perf_counter() - t0)
    for s in summarise(report["points"]):
        sys.stdout.write(
            f"{s['device']:<10} {s['group']:<32} n={s['n']:<3} mean|err| {s['mape_pct']:6.1f}%  "
            f"max {s['max_abs_err_pct']:6.1f}%  within10% {s['within_10pct']}/{s['n']}\n"
        )
    sys.stdout.write(efficiency_yaml(report["fitted"]) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
