"""The §11 cost model CLI: scenario table (md + json), plot and metadata under ``--out``.

    python -m llmlab_lab.costmodel_cli --scenarios configs/costmodel.yaml --out results/costmodel
    python -m llmlab_lab.costmodel_cli --run-twin ...   # first re-run the engine-twin throughput sweeps

Throughput comes from sweep files (``sweep:`` of each self-hosted deployment); ``--run-twin`` rewrites
them by replaying the configured trace at each rate through the engine twin (simulated figures).
See lab/COSTMODEL.md.
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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from llmlab_loadtest import bench_meta
from llmlab_twin import trace as tracemod
from llmlab_twin.replay import build_setup, cost_model_for, replay_trace

from llmlab_lab import costmodel as cm

log = logging.getLogger("llmlab_lab.costmodel_cli")


# -- engine-twin sweeps ---------------------------------------------------------------------------------


def run_twin_sweeps(scenarios: Path, repo: Path) -> list[Path]:
    """Replay the configured trace at each rate through each self-hosted deployment's twin (simulated)."""
    # Imported here: the cost model itself must not depend on the simulator package.

    raw = yaml.safe_load(scenarios.read_text())
    t = raw["twin"]
    written = []
    for d in raw["deployments"]:
        tw = d.get("twin")
        if d.get("kind") != "self_hosted" or not tw:
            continue
        points = []
        n_req = prompt = output = 0
        for rate in tw["rates"]:
            trace = tracemod.generate(
                mix=t["mix"],
                arrival=t["arrival"],
                rate=rate,
                duration=t["duration_s"],
                seed=t["seed"],
                shared_share=t["shared_share"],
            )
            setup = build_setup(model=tw["model"], device=tw["device"], dtype=tw["dtype"], workers=tw["workers"])
            cost = cost_model_for("roofline", tw["model"], tw["device"], tw["dtype"], tw.get("engine"))
            summary, _, _ = replay_trace(trace, setup, cost)
            n_req += len(trace.requests)
            prompt += sum(r.prompt_tokens for r in trace.requests)
            output += sum(r.output_tokens for r in trace.requests)
            points.append(
                {
                    "rate_rps": rate,
                    "slo_attainment": summary["slo_attainment"],
                    "slo_attainment_by_class": summary["slo_attainment_by_class"],
                    "total_tokens_per_s": summary["total_tokens_per_s"],
                    "output_tokens_per_s": summary["output_tokens_per_s"],
                    "throughput_rps": summary["throughput_rps"],
                    "ttft_p95_s": summary["ttft_s"]["p95"],
                    "tpot_p95_s": summary["tpot_s"]["p95"],
                    "gpu_busy_fraction": summary["gpu_busy_fraction"],
                    "num_gpu_blocks": summary["config"]["num_gpu_blocks"],
                }
            )
            log.info("%s rate %.2f: SLO attainment %.3f", d["id"], rate, summary["slo_attainment"])
        cmd = (
            f"python -m llmlab_twin.trace gen --mix {t['mix']} --arrival {t['arrival']} --rate RATE "
            f"--duration {t['duration_s']} --seed {t['seed']} --shared-share {t['shared_share']} -o t.jsonl && "
            f"python -m llmlab_lab.twin_replay virtual --trace t.jsonl --model {tw['model']} "
            f"--device {tw['device']} --dtype {tw['dtype']} --workers {tw['workers']}"
            + (f" --engine {tw['engine']}" if tw.get("engine") else "")
            + f"  (RATE in {tw['rates']})"
        )
        out = repo / d["sweep"]
        out.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "simulated": True,
            "what": "SLO attainment vs offered rate through one replica, engine twin in virtual time",
            "deployment": d["id"],
            "twin": tw,
            "trace": t,
            "command": cmd,
            "prompt_tokens_mean": prompt / n_req,
            "output_tokens_mean": output / n_req,
            "requests": n_req,
            "points": points,
        }
        out.write_text(json.dumps(doc, indent=2) + "\n")
        written.append(out)
    return written


# -- report ---------------------------------------------------------------------------------------------


def _usd(x: float | None, digits: int = 2) -> str:
    if x is None or math.isinf(x):
        return "n/a"
    return f"${x:,.{digits}f}"


def _vol(x: float | None) -> str:
    if x is None:
        return "never"
    return f"{x / 1e6:,.2f}M" if x >= 1e6 else f"{x / 1e3:,.0f}k"


def build(cfg: cm.Config) -> dict[str, Any]:
    """Every scenario row, the crossovers, break-evens and notes (the JSON the md and plot come from)."""
    api = next(d for d in cfg.deployments if d.kind == "external_api")
    rows = []
    for dep in cfg.deployments:
        for case in cfg.cases:
            for level, volume in cfg.traffic.items():
                b = cm.evaluate(cfg, dep, case, volume) if _servable(dep) else None
                a = cm.evaluate(cfg, api, case, volume)
                rows.append(
                    {
                        "deployment": dep.id,
                        "case": case,
                        "traffic": level,
                        "user_requests_per_month": volume,
                        "breakdown": b.model_dump() if b else None,
                        "api_monthly_cost": a.monthly_cost,
                        "saving_vs_api": (a.monthly_cost - b.monthly_cost) if b else None,
                        "break_even_simple": cm.simple_break_even(b) if b else None,
                    }
                )
    answers = []
    for dep in cfg.deployments:
        for case in cfg.cases:
            be = cm.break_even(cfg, dep, case) if _servable(dep) else None
            cross = cm.self_vs_api(cfg, dep, api, case) if dep.kind == "self_hosted" else None
            answers.append(
                {
                    "deployment": dep.id,
                    "case": case,
                    "self_hosting_cheaper_from": cross.model_dump() if cross else None,
                    "break_even": be.model_dump() if be else None,
                }
            )
    return {
        "simulated_throughput": True,
        "as_of": cfg.as_of.isoformat(),
        "month_hours": cfg.month_hours,
        "volume_range": list(cfg.volume_range),
        "workload": cfg.workload.model_dump(),
        "revenue": cfg.revenue.model_dump(),
        "traffic": cfg.traffic,
        "cases": {k: v.model_dump() for k, v in cfg.cases.items()},
        "deployments": [_dep_summary(cfg, d) for d in cfg.deployments],
        "rows": rows,
        "answers": answers,
    }


def _servable(dep: cm.Deployment) -> bool:
    return dep.kind == "external_api" or cm.capacity_tokens_per_s(dep) > 0


def _dep_summary(cfg: cm.Config, d: cm.Deployment) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": d.id,
        "kind": d.kind,
        "title": d.title,
        "quality": d.quality,
        "quality_note": d.quality_note,
        "overrides": d.overrides,
    }
    if d.kind == "self_hosted":
        assert d.throughput is not None and d.gpu_price is not None
        pts = sorted(d.throughput.points, key=lambda p: p.rate_rps)
        out.update(
            gpu=d.gpu,
            gpus_per_replica=d.gpus_per_replica,
            gpu_price=d.gpu_price.model_dump(mode="json"),
            slo_target=d.slo_target,
            capacity_rps=d.throughput.capacity_rps(d.slo_target),
            capacity_tokens_per_s=cm.capacity_tokens_per_s(d),
            best_slo_attainment=max(p.slo_attainment for p in pts),
            slo_attainment_at_lowest_rate=pts[0].slo_attainment,
            throughput_source=d.throughput.source,
            simulated=d.throughput.simulated,
        )
    else:
        assert d.input_price_per_mtok is not None and d.output_price_per_mtok is not None
        out.update(
            model=d.model,
            input_price_per_mtok=d.input_price_per_mtok.model_dump(mode="json"),
            output_price_per_mtok=d.output_price_per_mtok.model_dump(mode="json"),
        )
    return out


def markdown(cfg: cm.Config, rep: dict[str, Any], command: str) -> str:
    L: list[str] = [
        "# Cost model (§11): self-hosting vs an external API",
        "",
        f"Prices as of {cfg.as_of} (each dated below). Throughput is **simulated** by the engine twin "
        "(sweep files below) unless a source says measured. Volumes are user requests per month; a month is "
        f"{cfg.month_hours:.0f} h. Command: `{command}`",
        "",
        "## When does self-hosting beat the external API?",
        "",
        "| deployment | case | cheaper than the API from | and stays cheaper from | break-even vs revenue | why |",
        "|---|---|---:|---:|---:|---|",
    ]
    for a in rep["answers"]:
        x, be = a["self_hosting_cheaper_from"], a["break_even"]
        L.append(
            f"| {a['deployment']} | {a['case']} | {_vol(x['first']) if x else '(the API itself)'} | "
            f"{_vol(x['stays_from']) if x and x['first'] is not None else '-'} | "
            f"{_vol(be['first']) if be else 'never'} | {(x or {}).get('why') or (be or {}).get('why') or ''} |"
        )
    L += [
        "",
        "## Scenario table",
        "",
        "Util = average load / provisioned SLO capacity; SLO = twin attainment at the average load per replica.",
        "",
        "| deployment | case | traffic | requests/mo | replicas | util | SLO | GPU $/h | $/1M tok | $/request | "
        "monthly | API monthly | saving vs API | margin/request |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rep["rows"]:
        b = r["breakdown"]
        if b is None:
            L.append(
                f"| {r['deployment']} | {r['case']} | {r['traffic']} | {_vol(r['user_requests_per_month'])} | "
                "- | - | below target | - | - | - | - | "
                f"{_usd(r['api_monthly_cost'], 0)} | - | - |"
            )
            continue
        util = f"{b['utilisation']:.2f}" if b["utilisation"] is not None else "-"
        slo = f"{b['slo_attainment_avg']:.3f}" if b["slo_attainment_avg"] is not None else "n/a"
        L.append(
            f"| {r['deployment']} | {r['case']} | {r['traffic']} | {_vol(r['user_requests_per_month'])} | "
            f"{b['replicas'] or '-'} | {util} | {slo} | {_usd(b['gpu_hourly_cost'])} | "
            f"{_usd(b['cost_per_1m_tokens'], 3)} | {_usd(b['cost_per_user_request'], 6)} | "
            f"{_usd(b['monthly_cost'], 0)} | {_usd(r['api_monthly_cost'], 0)} | {_usd(r['saving_vs_api'], 0)} | "
            f"{_usd(b['gross_margin_per_user_request'], 6)} |"
        )
    L += ["", "## Deployments: throughput, prices, quality and SLO", ""]
    for d in rep["deployments"]:
        L.append(f"### {d['id']}: {d['title']}")
        L.append("")
        if d["kind"] == "self_hosted":
            gp = d["gpu_price"]
            L += [
                f"- GPU price: ${gp['usd']}/h per {d['gpu']} x {d['gpus_per_replica']} per replica, as of "
                f"{gp['as_of']} ({gp['source']})",
                f"- Capacity at SLO attainment >= {d['slo_target']}: {d['capacity_rps']:.2f} req/s = "
                f"{d['capacity_tokens_per_s']:,.0f} tokens/s per replica "
                f"({'simulated' if d['simulated'] else 'measured'}"
                f"; {d['throughput_source']})",
                f"- SLO attainment at the lowest swept rate: {d['slo_attainment_at_lowest_rate']:.3f}",
            ]
        else:
            ip, op = d["input_price_per_mtok"], d["output_price_per_mtok"]
            L.append(
                f"- {d['model']}: ${ip['usd']}/1M input, ${op['usd']}/1M output tokens, as of {ip['as_of']} "
                f"({ip['source']})"
            )
        q = f"catalog quality {d['quality']}; " if d["quality"] is not None else ""
        L += [f"- Quality and SLO: {q}{d['quality_note']}", ""]
    L += ["## Cases (hidden costs of §11.3 as inputs)", "", "| input | " + " | ".join(cfg.cases) + " |"]
    L.append("|---|" + "---:|" * len(cfg.cases))
    for field in cm.CaseInputs.model_fields:
        L.append(f"| {field} | " + " | ".join(f"{getattr(c, field):g}" for c in cfg.cases.values()) + " |")
    L += [
        "",
        "Per-deployment overrides of these inputs are listed in the JSON (`deployments[].overrides`).",
        f"Workload: {cfg.workload.prompt_tokens_mean:.1f} prompt + {cfg.workload.output_tokens_mean:.1f} output "
        f"tokens per request ({cfg.workload.source}). Revenue: ${cfg.revenue.input_per_mtok}/1M input, "
        f"${cfg.revenue.output_per_mtok}/1M output ({cfg.revenue.source}).",
        "",
    ]
    return "\n".join(L)


def plot(cfg: cm.Config, rep: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    cases = list(cfg.cases)
    fig, axes = plt.subplots(1, len(cases), figsize=(6 * len(cases), 5), sharey=True)
    lo, hi = cfg.volume_range
    vols = np.logspace(math.log10(lo), math.log10(min(hi, 1e9)), 400)
    for ax, case in zip(np.atleast_1d(axes), cases, strict=False):
        for dep in cfg.deployments:
            if not _servable(dep):
                continue
            y = [cm.evaluate(cfg, dep, case, float(v)).monthly_cost for v in vols]
            style = {"color": "black", "lw": 2.5, "ls": "--"} if dep.kind == "external_api" else {"lw": 1.5}
            (line,) = ax.plot(vols, y, label=dep.id, **style)
            ans = next(a for a in rep["answers"] if a["deployment"] == dep.id and a["case"] == case)
            x = ans["self_hosting_cheaper_from"]
            if x and x["first"] is not None and x["first"] <= vols[-1]:
                # hollow: first volume where it is cheaper; filled: from here on it stays cheaper
                f = x["first"]
                ax.plot([f], [cm.evaluate(cfg, dep, case, f).monthly_cost], "o", mfc="none", color=line.get_color())
                v = x["stays_from"] or f
                y_v = cm.evaluate(cfg, dep, case, v).monthly_cost
                ax.plot([v], [y_v], "o", color=line.get_color(), ms=8)
                ax.annotate(
                    f"{_vol(v)}/mo",
                    (v, y_v),
                    fontsize=8,
                    xytext=(5, -12),
                    textcoords="offset points",
                    color=line.get_color(),
                )
        for level, v in cfg.traffic.items():
            ax.axvline(v, color="grey", lw=0.5, ls=":")
            ax.text(v, 0.02, f" {level}", fontsize=7, color="grey", transform=ax.get_xaxis_transform())
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"{case} case (throughput simulated)")
        ax.set_xlabel("user requests per month")
        ax.grid(True, which="both", alpha=0.2)
    np.atleast_1d(axes)[0].set_ylabel("monthly cost, USD")
    np.atleast_1d(axes)[0].legend(fontsize=8)
    fig.suptitle(
        "Monthly cost vs user requests (simulated throughput, unverified prices); "
        "hollow: first cheaper than the API, filled: stays cheaper from here"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _metadata(started: dt.datetime, duration: float, command: str, cfg: cm.Config) -> dict[str, Any] | None:
    meta: dict[str, Any] = bench_meta.metadata_block(
        started=started,
        duration_s=duration,
        engine="n/a (cost model: arithmetic over dated prices and the engine twin's throughput sweeps)",
        model_id=", ".join(sorted({d.title for d in cfg.deployments})),
        concurrency="n/a (open-loop trace rates per sweep point, see the sweep files)",
        warmup="n/a (virtual time)",
        prompt_dataset=cfg.workload.source,
        input_length_distribution=f"mean {cfg.workload.prompt_tokens_mean:.1f} tokens (tutorial §8.3 mix)",
        output_length_distribution=f"mean {cfg.workload.output_tokens_mean:.1f} tokens (tutorial §8.3 mix)",
        sampling_parameters="n/a",
        command=command,
        simulated=True,
    )
    meta["simulated_note"] = "Throughput and SLO attainment are simulated by the engine twin; prices are unverified."
    return meta


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    p = argparse.ArgumentParser(prog="python -m llmlab_lab.costmodel_cli", description=__doc__.split("\n")[0])
    p.add_argument("--scenarios", default="configs/costmodel.yaml")
    p.add_argument("--out", default="results/costmodel")
    p.add_argument("--repo", default=".", help="where sweep paths and configs/ are resolved (default: .)")
    p.add_argument("--run-twin", action="store_true", help="first re-run the engine-twin throughput sweeps")
    p.add_argument("--no-plot", action="store_true")
    args = p.parse_args(argv)
    started = dt.datetime.now(dt.UTC)
    t0 = time.perf_counter()
    repo = Path(args.repo)
    scenarios = Path(args.scenarios)
    if args.run_twin:
        for f in run_twin_sweeps(scenarios, repo):
            log.info("wrote %s", f)
    cfg = cm.load_config(scenarios, repo=repo)
    rep = build(cfg)
    command = "python -m llmlab_lab.costmodel_cli " + shlex.join(list(argv) if argv is not None else sys.argv[1:])
    rep["metadata"] = _metadata(started, time.perf_counter() - t0, command, cfg)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "costmodel.json").write_text(json.dumps(rep, indent=2, default=str) + "\n")
    (out / "costmodel.md").write_text(markdown(cfg, rep, command))
    (out / "command.txt").write_text(command + "\n")
    if not args.no_plot:
        plot(cfg, rep, out / "costmodel.png")
    for a in rep["answers"]:
        x = a["self_hosting_cheaper_from"]
        if x is None:
            continue
        if x["first"] is None:
            log.info("%s/%s: self-hosting is %s", a["deployment"], a["case"], x["why"])
        else:
            log.info(
                "%s/%s: self-hosting cheaper than the API from %s/month, and stays cheaper from %s",
                a["deployment"],
                a["case"],
                _vol(x["first"]),
                _vol(x["stays_from"]) if x["stays_from"] is not None else "(not within range)",
            )
    log.info("wrote %s/costmodel.{md,json,png}, command.txt", out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
