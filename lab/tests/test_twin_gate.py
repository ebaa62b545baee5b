"""The twin regression gate: passes on the checked-in baseline, fails on a slower engine."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml
from llmlab_lab import twin_gate as gate

pytestmark = pytest.mark.unit


@pytest.mark.integration
def test_gate_passes_on_the_checked_in_baseline_with_the_budget_rules(capsys: pytest.CaptureFixture[str]) -> None:
    """Catches: overspend left n/a while the config plugs the budget rules in; a budget replay that
    refuses nothing (the gate's tight budgets must bind) or lets a tenant spend past its limit
    (e.g. a reserve that ignores what is already reserved: several requests in flight at once each
    see the same remaining budget)."""
    t0 = time.perf_counter()
    assert gate.main([]) == 0
    assert time.perf_counter() - t0 < 20
    out = capsys.readouterr().out
    assert "PASS" in out and "simulated" in out
    row = next(line.split() for line in out.splitlines() if line.strip().startswith("overspend_usd"))
    assert row[1:] == ["0", "0", "5%", "ok"]  # baseline, current, tolerance, status
    rules = next(line for line in out.splitlines() if "budget rules:" in line)
    assert rules.split("budget rules: ")[1].startswith("0 tokens over a limit") and "quota:user" in rules


def test_without_the_budget_rules_overspend_is_n_a(capsys: pytest.CaptureFixture[str]) -> None:
    """Catches: a gate that claims to check overspend while it has no budget hook (it must say n/a)."""
    assert gate.main(["--no-budget"]) == 0
    out = capsys.readouterr().out
    assert "overspend: n/a (no budget hook plugged in)" in out
    row = next(line.split() for line in out.splitlines() if line.strip().startswith("overspend_usd"))
    assert row[1:] == ["0", "n/a", "5%", "n/a"]


def test_overspend_is_gated_once_a_budget_hook_is_plugged_in(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Catches: an overspend figure the gate computes but never compares with its baseline."""
    cfg = yaml.safe_load(gate.DEFAULT_CONFIG.read_text())
    cfg["baseline"]["overspend_usd"] = 0.0
    cfg["tolerance"]["overspend_usd"] = 0.0
    path = tmp_path / "gate.yaml"
    path.write_text(yaml.safe_dump(cfg))
    seen: list[int] = []

    def hook(seqs: object) -> dict[str, float]:
        seen.append(len(seqs))  # type: ignore[arg-type]
        return {"overspend_usd": 0.25}

    monkeypatch.setattr(gate, "OVERSPEND_HOOK", hook)
    assert gate.main(["--config", str(path)]) == 1
    out = capsys.readouterr().out
    row = next(line.split() for line in out.splitlines() if line.strip().startswith("overspend_usd"))
    assert row[1:3] == ["0", "0.25"] and row[-1] == "REGRESSION"
    requests = len(Path(cfg["trace"]).read_text().splitlines()) - 1  # a header line, then one per request
    assert seen == [requests]  # the hook saw every replayed request of the gate's trace


def test_gate_fails_when_the_engine_gets_slower(capsys: pytest.CaptureFixture[str]) -> None:
    assert gate.main(["--slowdown", "2", "--no-budget"]) == 1
    out = capsys.readouterr().out
    assert "REGRESSION" in out and "goodput_rps" in out.split("FAIL")[1]


def test_update_baseline_then_compare(tmp_path: Path) -> None:
    cfg = yaml.safe_load(gate.DEFAULT_CONFIG.read_text())
    cfg.pop("baseline", None)
    path = tmp_path / "gate.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert gate.main(["--config", str(path), "--no-budget"]) == 1  # no baseline yet
    assert gate.main(["--config", str(path), "--update-baseline", "--no-budget"]) == 0
    written = yaml.safe_load(path.read_text())
    assert written["baseline"]["goodput_rps"] > 0
    # a faster engine is an improvement, not a failure
    assert gate.main(["--config", str(path), "--slowdown", "0.8", "--no-budget"]) == 0


def test_check_directions() -> None:
    assert gate.Check("goodput_rps", 10, 9.4, 0.05, True).status == "REGRESSION"
    assert gate.Check("goodput_rps", 10, 9.6, 0.05, True).status == "ok"
    assert gate.Check("cost_per_1m_tokens_usd", 1.0, 1.06, 0.05, False).status == "REGRESSION"
    assert gate.Check("cost_per_1m_tokens_usd", 1.0, 0.9, 0.05, False).status == "improved"
    assert gate.Check("overspend_usd", None, None, 0.05, False).status == "n/a"
