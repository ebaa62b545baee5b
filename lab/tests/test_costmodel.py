"""The §11 cost model: the worked example of COSTMODEL.md, formulas, break-even and crossover solving."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from llmlab_lab import costmodel as cm
from llmlab_lab.costmodel_cli import main
from pydantic import ValidationError

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = REPO / "configs" / "costmodel.yaml"
DOC = REPO / "lab" / "COSTMODEL.md"

# The worked example (h100x1, base case, 3M user requests/month), computed by hand in COSTMODEL.md.
# Each value is written there exactly as below; the test checks both the CLI and the document.
HAND = {
    "capacity_rps_per_replica": (8.1778, "8.1778"),
    "capacity_tokens_per_s_per_replica": (18297, "18,297"),
    "utilisation": (0.1495, "0.1495"),
    "gpu_hourly_cost": (3.065, "3.065"),
    "effective_tokens_per_hour": (9.655e6, "9.655M"),
    "cost_per_1m_tokens": (0.3175, "0.3175"),
    "input_token_cost": (0.0005988, "0.0005988"),
    "output_token_cost": (0.0000976, "0.0000976"),
    "retry_overhead": (0.00001405, "0.00001405"),
    "cost_per_served_request": (0.0007164, "0.0007164"),
    "gpu_monthly": (2237.45, "2,237.45"),
    "idle_gpu_monthly": (1902.9, "1,902.9"),
    "fixed_monthly": (2102.04, "2,102.04"),
    "monthly_cost": (4358.64, "4,358.64"),
    "cost_per_user_request": (0.001453, "0.001453"),
    "revenue_per_user_request": (0.00067123, "0.00067123"),
    "gross_margin_per_user_request": (0.00066485, "0.00066485"),
}
HAND_API_MONTHLY = (1338.81, "1,338.81")
HAND_BREAK_EVEN = (6.527e6, "6.527M")
HAND_CHEAPER_FROM = (38.64e6, "38.64M")
HAND_STAYS_FROM = (71.43e6, "71.43M")
# The API's side of the worked example (step 10): prompt tokens at $0.10/1M, output tokens at $0.20/1M.
HAND_API = {
    "input_token_cost": (0.000192382, "0.000192382"),
    "output_token_cost": (0.000062724, "0.000062724"),
    "cost_per_served_request": (0.00026629, "0.00026629"),
}


def _close(actual: float, expected: float, digits_text: str) -> bool:
    # The document rounds to the digits it shows: allow half a unit of its last digit (and 0.05% at least).
    mantissa = digits_text.replace(",", "").rstrip("M")
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    unit = 10.0**-decimals * (1e6 if digits_text.endswith("M") else 1.0)
    return abs(actual - expected) <= max(unit / 2 + 1e-15, abs(expected) * 5e-4)


@pytest.fixture(scope="module")
def cli_out(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("costmodel")
    assert main(["--scenarios", str(SCENARIOS), "--out", str(out), "--repo", str(REPO)]) == 0
    for name in ("costmodel.md", "costmodel.json", "costmodel.png", "command.txt"):
        assert (out / name).stat().st_size > 0, name
    data: dict[str, Any] = json.loads((out / "costmodel.json").read_text())
    return data


@pytest.mark.unit
def test_cli_reproduces_the_worked_example(cli_out: dict[str, Any]) -> None:
    doc = DOC.read_text()
    row = next(r for r in cli_out["rows"] if (r["deployment"], r["case"], r["traffic"]) == ("h100x1", "base", "medium"))
    b = row["breakdown"]
    assert b["replicas"] == 1 and b["user_requests_per_month"] == 3e6
    for key, (value, text) in HAND.items():
        assert text in doc, f"COSTMODEL.md does not show {key} = {text}"
        assert _close(b[key], value, text), (key, b[key], value)
    assert HAND_API_MONTHLY[1] in doc and _close(row["api_monthly_cost"], *HAND_API_MONTHLY)
    ans = next(a for a in cli_out["answers"] if (a["deployment"], a["case"]) == ("h100x1", "base"))
    for got, (value, text) in (
        (row["break_even_simple"], HAND_BREAK_EVEN),
        (ans["break_even"]["first"], HAND_BREAK_EVEN),
        (ans["self_hosting_cheaper_from"]["first"], HAND_CHEAPER_FROM),
        (ans["self_hosting_cheaper_from"]["stays_from"], HAND_STAYS_FROM),
    ):
        assert text in doc and _close(got, value, text), (got, value)


@pytest.mark.unit
def test_api_bills_prompt_and_output_tokens_at_their_own_prices(cli_out: dict[str, Any]) -> None:
    """Catches: the external API's input and output prices swapped (or one used for both)."""
    row = next(
        r for r in cli_out["rows"] if (r["deployment"], r["case"], r["traffic"]) == ("api-llama-8b", "base", "medium")
    )
    doc = DOC.read_text()
    for key, (value, text) in HAND_API.items():
        assert text in doc and _close(row["breakdown"][key], value, text), (key, row["breakdown"][key], value)


@pytest.mark.unit
def test_every_scenario_answers_and_every_price_is_dated(cli_out: dict[str, Any]) -> None:
    deps = {d["id"]: d for d in cli_out["deployments"]}
    assert {d["kind"] for d in deps.values()} == {"self_hosted", "external_api"}
    for d in deps.values():
        prices = [d["gpu_price"]] if d["kind"] == "self_hosted" else [d["input_price_per_mtok"]]
        for p in prices:
            assert p["as_of"] and p["source"]
        assert d["quality_note"]
        if d["kind"] == "self_hosted":
            assert d["simulated"] and "replay virtual" in d["throughput_source"]  # the command that made the sweep
    self_hosted = [d for d in deps.values() if d["kind"] == "self_hosted"]
    answers = [a for a in cli_out["answers"] if a["deployment"] in {d["id"] for d in self_hosted}]
    assert len(answers) == len(self_hosted) * len(cli_out["cases"])
    for a in answers:
        x = a["self_hosting_cheaper_from"]
        assert x["first"] is not None or x["why"].startswith("never"), a
    assert {r["traffic"] for r in cli_out["rows"]} == {"low", "medium", "high"}
    assert cli_out["metadata"]["simulated"] is True and "command_line" in cli_out["metadata"]


# -- the formulas on a small inline config ------------------------------------------------------------


def _config(**case: Any) -> cm.Config:
    dated = {"as_of": "2026-12-02", "source": "test"}
    thr = {
        "source": "test sweep",
        "simulated": True,
        "prompt_tokens_mean": 900,
        "output_tokens_mean": 100,
        "points": [
            {"rate_rps": 1, "slo_attainment": 1.0, "total_tokens_per_s": 1000},
            {"rate_rps": 10, "slo_attainment": 0.97, "total_tokens_per_s": 10000},
            {"rate_rps": 20, "slo_attainment": 0.77, "total_tokens_per_s": 12000},
        ],
    }
    return cm.Config(
        as_of="2026-12-02",
        volume_range=(1e3, 1e9),
        workload=cm.Workload(prompt_tokens_mean=900, output_tokens_mean=100, source="test"),
        revenue=cm.Revenue(input_per_mtok=2.0, output_per_mtok=2.0, source="test"),
        traffic={"x": 1e6},
        cases={"base": cm.CaseInputs(**case)},
        deployments=[
            cm.Deployment(
                id="gpu",
                kind="self_hosted",
                title="t",
                quality_note="q",
                gpu="G",
                gpu_price=cm.Dated(usd=1.0, **dated),
                throughput=cm.Throughput(**thr),
            ),
            cm.Deployment(
                id="api",
                kind="external_api",
                title="t",
                quality_note="q",
                model="m",
                input_price_per_mtok=cm.Dated(usd=1.0, **dated),
                output_price_per_mtok=cm.Dated(usd=1.0, **dated),
            ),
        ],
    )


@pytest.mark.unit
def test_capacity_interpolates_where_attainment_crosses_the_target() -> None:
    t = _config().deployment("gpu").throughput
    assert t is not None
    assert t.capacity_rps(0.95) == pytest.approx(11.0)  # 10 + (0.97 - 0.95) / 0.20 x 10
    assert t.capacity_rps(0.99) == pytest.approx(1 + 0.01 / 0.03 * 9)
    assert t.capacity_rps(1.0) == 1.0
    assert t.attainment_at(15) == pytest.approx(0.87)
    assert t.attainment_at(0.1) == 1.0 and t.attainment_at(99) == 0.77


@pytest.mark.unit
def test_self_hosted_cost_decomposes_and_idle_is_paid() -> None:
    cfg = _config(retry_rate=0.1, reask_rate=0.2, engineer_hours_per_month=10, engineer_usd_per_hour=50)
    b = cm.evaluate(cfg, cfg.deployment("gpu"), "base", 1e6)
    # 1e6 x 1.2 x 1.1 attempts of 1000 tokens over 730 h: 502.3 tokens/s of 11,000 capacity
    assert b.utilisation == pytest.approx(1.32e9 / (730 * 3600) / 11000)
    assert b.replicas == 1 and b.gpu_monthly == pytest.approx(730.0)
    assert b.served_requests_per_month * b.cost_per_served_request == pytest.approx(b.gpu_monthly)
    assert b.monthly_cost == pytest.approx(730.0 + 500.0)
    assert b.idle_gpu_monthly == pytest.approx(730.0 * (1 - b.utilisation))
    # tutorial formula: hourly / (tok/s x 3600 x util x success) x 1e6
    assert b.cost_per_1m_tokens == pytest.approx(1.0 / (11000 * 3600 * b.utilisation / 1.1) * 1e6)


@pytest.mark.unit
def test_crossover_is_exact_per_replica_segment() -> None:
    cfg = _config(engineer_hours_per_month=10, engineer_usd_per_hour=50)
    gpu, api = cfg.deployment("gpu"), cfg.deployment("api")
    # self: 730 GPU + 500 engineer; api: 500 engineer + 1e-3 $/request -> equal at 730k (a replica holds 28.9M)
    x = cm.self_vs_api(cfg, gpu, api, "base")
    assert x.first == pytest.approx(7.3e5) and x.stays_from == pytest.approx(7.3e5)
    per_replica = 11000 * 730 * 3600 / 1000
    assert cm.evaluate(cfg, gpu, "base", per_replica * 1.01).replicas == 2
    be = cm.break_even(cfg, gpu, "base")  # revenue 2e-3 $/request
    assert be.first == pytest.approx(1230.0 / 2e-3)


@pytest.mark.unit
def test_never_is_explained() -> None:
    cfg = _config(peak_to_average=1.0)
    gpu, api = cfg.deployment("gpu"), cfg.deployment("api")
    dear = gpu.model_copy(update={"gpu_price": cm.Dated(usd=1e3, as_of="2026-12-02", source="t")})
    x = cm.self_vs_api(cfg, dear, api, "base")
    assert x.first is None and x.why.startswith("never within")
    pts = [cm.SweepPoint(rate_rps=1, slo_attainment=0.5, total_tokens_per_s=1)]
    assert gpu.throughput is not None
    bad = gpu.model_copy(update={"throughput": gpu.throughput.model_copy(update={"points": pts})})
    x = cm.self_vs_api(cfg, bad, api, "base")
    assert x.first is None and "SLO attainment stays below" in x.why
    with pytest.raises(ValueError, match="never reaches"):
        cm.evaluate(cfg, bad, "base", 1e6)
    assert math.isfinite(cm.evaluate(cfg, api, "base", 1e6).monthly_cost)


@pytest.mark.unit
def test_config_refuses_incomplete_deployments_and_unknown_inputs() -> None:
    with pytest.raises(ValidationError, match="needs gpu_price and throughput"):
        cm.Deployment(id="x", kind="self_hosted", title="t", quality_note="q")
    with pytest.raises(ValidationError, match="input/output prices"):
        cm.Deployment(id="x", kind="external_api", title="t", quality_note="q")
    with pytest.raises(ValidationError):
        cm.CaseInputs(retry_rat=0.1)
    cfg = _config()
    with pytest.raises(ValidationError):
        cfg.inputs(cfg.deployment("gpu").model_copy(update={"overrides": {"*": {"nope": 1}}}), "base")
