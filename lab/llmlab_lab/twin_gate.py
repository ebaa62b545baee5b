"""Regression gate: replay a fixed small trace through the twin (virtual time, **simulated**) and
compare goodput, SLO attainment (overall and per class), cost per 1M tokens and overspend with the
baseline in ``configs/twin-gate.yaml``; exit 1 when any is worse than its tolerance allows.

    python -m llmlab_lab.twin_gate                    # check (exit 0 / 1)
    python -m llmlab_lab.twin_gate --update-baseline  # accept the current figures
    python -m llmlab_lab.twin_gate --slowdown 2       # what a 2x slower engine would do

Overspend comes from the budget rules: with ``budget:`` in the config, every replayed request goes
through the budget service's own ledger on Redis (``LLMLAB_REDIS_URL``, default 127.0.0.1:6379;
:mod:`llmlab_lab.twin_budget`), and the tokens charged beyond any scope's limit are gated like cost
(with the rules as shipped: 0). ``--no-budget`` (or no ``budget:``) replays without and says ``n/a``;
:data:`OVERSPEND_HOOK` replaces the hook (tests).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from llmlab_common.catalog import load_catalog
from llmlab_common.settings import DEFAULT_CATALOG
from llmlab_twin import trace as tracemod
from llmlab_twin.replay import (
    OverspendHook,
    build_setup,
    cost_model_for,
    load_slo_classes,
    replay_trace,
)
from llmlab_twin.sched import ScaledCost, StepCostModel

log = logging.getLogger(__name__)

DEFAULT_CONFIG = Path("configs") / "twin-gate.yaml"
OVERSPEND_HOOK: OverspendHook | None = None

# metric -> True if higher is better
DIRECTIONS: dict[str, bool] = {
    "goodput_rps": True,
    "slo_attainment": True,
    "cost_per_1m_tokens_usd": False,
    "overspend_usd": False,
    "ttft_p95_s": False,
}


@dataclass
class Check:
    metric: str
    baseline: float | None
    current: float | None
    tolerance: float
    higher_is_better: bool

    @property
    def status(self) -> str:
        if self.baseline is None or self.current is None:
            return "n/a"
        b, c, tol = self.baseline, self.current, self.tolerance
        if self.higher_is_better:
            if c < b * (1 - tol) - 1e-12:
                return "REGRESSION"
            return "improved" if c > b * (1 + tol) + 1e-12 else "ok"
        if c > b * (1 + tol) + 1e-12:
            return "REGRESSION"
        return "improved" if c < b * (1 - tol) - 1e-12 else "ok"


def gate_metrics(summary: dict[str, Any]) -> dict[str, float | None]:
    out: dict[str, float | None] = {
        "goodput_rps": summary["goodput_rps"],
        "slo_attainment": summary["slo_attainment"],
        "cost_per_1m_tokens_usd": summary["cost_per_1m_tokens_usd"],
        "ttft_p95_s": summary["ttft_s"]["p95"],
    }
    for cls, v in summary["slo_attainment_by_class"].items():
        out[f"slo_attainment.{cls}"] = v["attainment"]
    ov = summary.get("overspend")
    out["overspend_usd"] = ov.get("overspend_usd") if isinstance(ov, dict) else None
    return out


def load_config(path: str | Path) -> dict[str, Any]:
    with open(path) as f:
        data = yaml.safe_load(f)
    if not isinstance(data, dict) or "trace" not in data or "setup" not in data:
        raise ValueError(f"{path}: needs 'trace' and 'setup' (and 'baseline' once updated)")
    return data


def budget_overspend_hook(config: dict[str, Any], model: str) -> OverspendHook | None:
    """The budget rules for the replay (None without ``budget:`` in the config); overspend priced at
    the catalog's output list price of the model (the dearest one when the catalog has no match)."""
    from llmlab_lab.twin_budget import budget_hook, parse_overrides  # needs Redis: only when asked

    spec = config.get("budget")
    if not spec:
        return None
    catalog = load_catalog(config.get("catalog") or DEFAULT_CATALOG)
    prices = [p.output_per_mtok_usd for p in catalog.prices.models if model.lower() in p.model.lower()]
    price = prices[0] if prices else max(p.output_per_mtok_usd for p in catalog.prices.models)
    redis_url = os.environ.get("LLMLAB_REDIS_URL", "redis://127.0.0.1:6379/0")
    return budget_hook(catalog, redis_url, price, parse_overrides(spec.get("overrides")))


def run_gate(
    config: dict[str, Any], *, cost: StepCostModel | None = None, slowdown: float = 1.0, budget: bool = True
) -> tuple[dict[str, Any], dict[str, float | None]]:
    """Replay the gate's trace; returns (summary, gated metrics)."""
    trace = tracemod.load(config["trace"])  # relative to the working directory, like every configs/ path
    s = dict(config["setup"])
    cost_name = s.pop("cost_model", "roofline")
    setup = build_setup(**s)
    if cost is None:
        cost = cost_model_for(cost_name, setup.model, setup.device, setup.dtype)
    if slowdown != 1.0:
        cost = ScaledCost(cost, slowdown)
    catalog = config.get("catalog")
    slo = load_slo_classes(catalog or None)
    hook = OVERSPEND_HOOK or (budget_overspend_hook(config, setup.model) if budget else None)
    summary, _, _ = replay_trace(trace, setup, cost, slo=slo, overspend_hook=hook)
    return summary, gate_metrics(summary)


def compare(config: dict[str, Any], metrics: dict[str, float | None]) -> list[Check]:
    baseline: dict[str, Any] = config.get("baseline") or {}
    tolerances: dict[str, Any] = config.get("tolerance") or {}
    default_tol = float(tolerances.get("default", 0.05))
    checks: list[Check] = []
    for name, current in metrics.items():
        root = name.split(".")[0]
        higher = DIRECTIONS.get(root, True)
        tol = float(tolerances.get(name, tolerances.get(root, default_tol)))
        b = baseline.get(name)
        checks.append(Check(name, None if b is None else float(b), current, tol, higher))
    return checks


def render(checks: Sequence[Check], summary: dict[str, Any]) -> str:
    lines = [
        "twin regression gate (simulated: engine twin, virtual time)",
        f"  trace: {summary['requests']} requests, simulated {summary['simulated_duration_s']:.1f} s, "
        f"{summary['workers']} x {summary['device']} {summary['model']}, replay {summary.get('replay_wall_s')} s wall",
        f"  {'metric':<34}{'baseline':>14}{'current':>14}{'tol':>7}  status",
    ]

    def fmt(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.6g}"

    for c in checks:
        lines.append(f"  {c.metric:<34}{fmt(c.baseline):>14}{fmt(c.current):>14}{c.tolerance:>7.0%}  {c.status}")
    ov = summary.get("overspend")
    if ov == "n/a":
        lines.append("  overspend: n/a (no budget hook plugged in)")
    elif isinstance(ov, dict) and "refused" in ov:
        lines.append(
            f"  budget rules: {ov['overspend_tokens']} tokens over a limit, {ov['charged_tokens']} charged, "
            f"{ov['clamped']} clamped, refused {ov['refused'] or 0} ({ov['rules']})"
        )
    return "\n".join(lines) + "\n"


def update_baseline(path: str | Path, config: dict[str, Any], metrics: dict[str, float | None]) -> None:
    config = dict(config)
    config["baseline"] = {k: v for k, v in metrics.items() if v is not None}
    header = (
        "# Regression gate of the engine twin (python -m llmlab_lab.twin_gate). Figures are SIMULATED.\n"
        "# baseline: written by --update-baseline; tolerance: relative, per metric (default for the rest).\n"
    )
    with open(path, "w") as f:
        f.write(header)
        yaml.safe_dump(config, f, sort_keys=False)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m llmlab_lab.twin_gate", description=__doc__.split("\n")[0])
    p.add_argument("--config", default=str(DEFAULT_CONFIG))
    p.add_argument("--update-baseline", action="store_true")
    p.add_argument("--slowdown", type=float, default=1.0, help="scale every step time (demonstrates a regression)")
    p.add_argument("--json", help="also write the summary and checks here")
    p.add_argument("--no-budget", action="store_true", help="replay without the budget rules (overspend n/a)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    config = load_config(args.config)
    summary, metrics = run_gate(config, slowdown=args.slowdown, budget=not args.no_budget)
    if args.update_baseline:
        update_baseline(args.config, config, metrics)
        sys.stdout.write(f"baseline updated in {args.config}\n")
        config = load_config(args.config)
    checks = compare(config, metrics)
    sys.stdout.write(render(checks, summary))
    if args.json:
        report = {"simulated": True, "summary": summary, "checks": [vars(c) | {"status": c.status} for c in checks]}
        Path(args.json).write_text(json.dumps(report, indent=2, default=str) + "\n")
    failed = [c.metric for c in checks if c.status == "REGRESSION"]
    if failed:
        sys.stdout.write(f"FAIL: regression beyond tolerance in {', '.join(failed)}\n")
        return 1
    if not config.get("baseline"):
        sys.stdout.write("no baseline yet: run with --update-baseline\n")
        return 1
    sys.stdout.write("PASS\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
