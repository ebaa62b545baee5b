"""The Prometheus rules, their unit tests and the Alertmanager config, checked by the real tools.

``promtool check rules`` on infra/prometheus/rules/, ``promtool test rules`` on
infra/prometheus/tests/ (hand-calculated recording values; every alert firing and silent),
``promtool check config`` on infra/prometheus/prometheus.yml, ``amtool check-config`` on
infra/alertmanager/alertmanager.yml and its routing by severity. Plus what the tools cannot see:
every alert of alerts.yml has a firing and a silent unit test case (a new alert without a test
fails here), every metric a rule reads is a family of docs/observability.md (a typo in a metric
name passes promtool and its unit tests alike, and never fires), and the TTFT alert's threshold is
the catalog's interactive SLO.

The binaries come from Debian's ``prometheus`` and ``prometheus-alertmanager`` packages
(``make prom-tools``, which ``make test`` runs: scripts/ensure-prometheus.sh); a test skips only
when its binary is not installed at all.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
PROM_DIR = REPO / "infra" / "prometheus"
RULES = [PROM_DIR / "rules" / "recording.yml", PROM_DIR / "rules" / "alerts.yml"]
RULE_TESTS = sorted((PROM_DIR / "tests").glob("*.yml"))
PROMETHEUS_FILE = PROM_DIR / "prometheus.yml"
ALERTMANAGER_FILE = REPO / "infra" / "alertmanager" / "alertmanager.yml"
OBSERVABILITY_DOC = REPO / "docs" / "observability.md"
CATALOG = REPO / "configs" / "catalog.yaml"

RECORDING_RULES = {
    "llmlab:gateway_requests:rate5m",
    "llmlab:gateway_5xx:ratio_rate5m",
    "llmlab:gateway_ttft_seconds:p50_5m",
    "llmlab:gateway_ttft_seconds:p95_5m",
    "llmlab:gateway_tpot_seconds:p95_5m",
    "llmlab:gateway_e2e_seconds:p95_5m",
    "llmlab:worker_itl_seconds:p95_5m",
    "llmlab:worker_nats_queue_seconds:p95_5m",
    "llmlab:worker_engine_queue_seconds:p95_5m",
    "llmlab:gateway_completion_tokens:rate5m",
    "llmlab:router_queue_pending_messages:max",
    "llmlab:accounting_events_stream:fullness_ratio",
}
ALERTS = {
    "LLMLabHigh5xxRatio",
    "LLMLabTTFTOverSLO",
    "LLMLabQueueWaitRising",
    "LLMLabBudgetSettlementLag",
    "LLMLabAccountingLag",
    "LLMLabDeadLetters",
    "LLMLabChargesLost",
    "LLMLabPoolNoReadyWorker",
    "LLMLabEventStreamNearFull",
    "LLMLabGPUMemoryNearFull",
    "LLMLabTargetDown",
    "LLMLabProcessRestarting",
}
ANNOTATIONS = {"summary", "description", "runbook"}


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed: run `make prom-tools` (scripts/ensure-prometheus.sh)")
    return path


def run(cmd: list[str], cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=120)


def rules_of(path: Path) -> list[dict[str, Any]]:
    doc = yaml.safe_load(path.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def alert_rules() -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for r in rules_of(RULES[1])}


def test_rule_files_pass_promtool_check() -> None:
    r = run([tool("promtool"), "check", "rules", *map(str, RULES)])
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"SUCCESS: {len(RECORDING_RULES)} rules found" in r.stdout, r.stdout
    assert f"SUCCESS: {len(ALERTS)} rules found" in r.stdout, r.stdout


def test_rule_unit_tests_pass() -> None:
    """Catches: a recording rule computing other values than the hand calculation in
    infra/prometheus/tests/recording_test.yml, an alert firing at another threshold or after
    another `for` than its cases say, an annotation or label changed without its test."""
    assert RULE_TESTS, "no promtool unit tests in infra/prometheus/tests/"
    r = run([tool("promtool"), "test", "rules", *map(str, RULE_TESTS)])
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("SUCCESS") == len(RULE_TESTS), r.stdout


def test_rule_unit_tests_fail_on_a_wrong_threshold(tmp_path: Path) -> None:
    """The unit tests can fail: the 5xx alert's threshold moved from 2% to 3% makes them fail."""
    (tmp_path / "rules").mkdir()
    shutil.copytree(PROM_DIR / "tests", tmp_path / "tests")
    shutil.copy(RULES[0], tmp_path / "rules" / RULES[0].name)
    text = RULES[1].read_text()
    assert "llmlab:gateway_5xx:ratio_rate5m > 0.02" in text
    (tmp_path / "rules" / RULES[1].name).write_text(text.replace("ratio_rate5m > 0.02", "ratio_rate5m > 0.03"))
    r = run([tool("promtool"), "test", "rules", *map(str, sorted((tmp_path / "tests").glob("*.yml")))])
    assert r.returncode != 0, r.stdout
    assert "LLMLabHigh5xxRatio" in r.stdout + r.stderr


def test_prometheus_config_passes_promtool_check() -> None:
    """prometheus.yml with its rule_files (resolved relative to the file, as in the container) and
    the alerting section; compose hostnames are fine for a check."""
    r = run([tool("promtool"), "check", "config", str(PROMETHEUS_FILE)])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS: 2 rule files found" in r.stdout, r.stdout
    prom = yaml.safe_load(PROMETHEUS_FILE.read_text())
    assert prom["rule_files"] == ["rules/*.yml"]
    targets = [t for am in prom["alerting"]["alertmanagers"] for sc in am["static_configs"] for t in sc["targets"]]
    assert targets == ["alertmanager:9093"]


def test_alertmanager_config_passes_amtool_and_routes_by_severity() -> None:
    amtool = tool("amtool")
    r = run([amtool, "check-config", str(ALERTMANAGER_FILE)])
    assert r.returncode == 0, r.stdout + r.stderr
    for labels, receiver in (
        (["severity=critical", "alertname=LLMLabHigh5xxRatio"], "critical"),
        (["severity=warning", "alertname=LLMLabDeadLetters"], "default"),
        (["alertname=SomethingElse"], "default"),
    ):
        r = run([amtool, "config", "routes", "test", f"--config.file={ALERTMANAGER_FILE}", *labels])
        assert r.returncode == 0, r.stdout + r.stderr
        assert r.stdout.strip() == receiver, (labels, r.stdout)
    am = yaml.safe_load(ALERTMANAGER_FILE.read_text())
    assert am["route"]["group_by"] == ["alertname", "pool", "model"]
    (target_down,) = [i for i in am["inhibit_rules"] if 'alertname="LLMLabTargetDown"' in i["source_matchers"]]
    assert target_down["equal"] == ["job"]
    # Without it a missing job label (aggregated alerts) would count as equal: any target down
    # would silence the 5xx and SLO alerts.
    assert 'job=~".+"' in target_down["target_matchers"]


def test_the_rule_names_are_the_contract() -> None:
    """Dashboards read the recording rules by name; docs/observability.md lists the alerts."""
    assert {r["record"] for r in rules_of(RULES[0])} == RECORDING_RULES
    assert set(alert_rules()) == ALERTS
    assert {g["name"] for g in yaml.safe_load(RULES[0].read_text())["groups"]} == {"llmlab-recording"}
    assert {g["name"] for g in yaml.safe_load(RULES[1].read_text())["groups"]} == {"llmlab-alerts"}


def test_every_alert_has_severity_and_annotations() -> None:
    for name, rule in alert_rules().items():
        assert rule.get("labels", {}).get("severity") in {"critical", "warning"}, name
        assert set(rule.get("annotations", {})) == ANNOTATIONS, name
        assert all(str(v).strip() for v in rule["annotations"].values()), name


def test_every_alert_has_a_firing_and_a_silent_unit_test_case() -> None:
    """Catches: an alert added to alerts.yml without a promtool test that shows it firing (with
    its labels and annotations) and one that shows it silent."""
    firing: dict[str, list[dict[str, Any]]] = {}
    silent: set[str] = set()
    for path in RULE_TESTS:
        doc = yaml.safe_load(path.read_text())
        for case in doc.get("tests", []):
            for check in case.get("alert_rule_test", []):
                if check.get("exp_alerts"):
                    firing.setdefault(check["alertname"], []).extend(check["exp_alerts"])
                else:
                    silent.add(check["alertname"])
    alerts = alert_rules()
    assert set(firing) | silent <= set(alerts), "tests name alerts that alerts.yml does not have"
    missing_firing = sorted(set(alerts) - set(firing))
    missing_silent = sorted(set(alerts) - silent)
    assert not missing_firing, f"alerts without a firing case in infra/prometheus/tests/: {missing_firing}"
    assert not missing_silent, f"alerts without a silent case in infra/prometheus/tests/: {missing_silent}"
    for name, expected in firing.items():
        for exp in expected:
            assert exp.get("exp_labels", {}).get("severity") == alerts[name]["labels"]["severity"], name
            assert set(exp.get("exp_annotations", {})) == ANNOTATIONS, name


METRIC = re.compile(r"\b(llmlab_[a-z0-9_]+|DCGM_FI_[A-Z0-9_]+|process_[a-z_]+)\b")


def test_every_metric_a_rule_reads_is_a_documented_family() -> None:
    """Catches: a rule reading a misspelt or renamed metric (it evaluates to nothing, its unit
    tests feed the same misspelt name, and the alert never fires)."""
    sections = re.split(r"(?m)^(?=## )", OBSERVABILITY_DOC.read_text())
    families = [s for s in sections if s.startswith("## Metric families")]
    assert families, "docs/observability.md has no '## Metric families' section"
    documented = set(METRIC.findall(families[0]))  # not the Alerts section, which names what the rules read
    assert len(documented) > 30, "the doc's tables were not read"
    for rule in rules_of(RULES[0]) + rules_of(RULES[1]):
        for name in METRIC.findall(rule["expr"]):
            family = re.sub(r"_(bucket|count|sum)$", "", name)
            what = rule.get("record") or rule.get("alert")
            assert family in documented, f"{what} reads {name}: not a family in docs/observability.md"


def test_ttft_alert_threshold_is_the_catalog_slo() -> None:
    slo = yaml.safe_load(CATALOG.read_text())["slo_classes"]["interactive"]["ttft_p95_s"]
    expr = alert_rules()["LLMLabTTFTOverSLO"]["expr"].strip()
    m = re.fullmatch(r"llmlab:gateway_ttft_seconds:p95_5m > ([0-9.]+)", expr)
    assert m, expr
    assert float(m.group(1)) == float(slo), (
        f"LLMLabTTFTOverSLO fires above {m.group(1)} s, the catalog's SLO is {slo} s"
    )
