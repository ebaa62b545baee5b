"""Dashboards as code: the generated JSON is what Grafana needs, reads only documented names, and is
committed up to date; the snapshot draws every row (pure, with a fake query function)."""

from __future__ import annotations

import gc
import json
import re
import shutil
import subprocess
import warnings
from pathlib import Path

import pytest
import yaml
from llmlab_lab.dashboards import __main__ as cli
from llmlab_lab.dashboards import build, promql, snapshot, spec
from llmlab_lab.dashboards.snapshot import QueryError, Series

pytestmark = pytest.mark.unit
REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "infra" / "grafana" / "dashboards"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
SECTION_7_ROWS = ["Service health", "User experience", "GPU efficiency", "Scheduler", "Cache", "Cost"]


def _contract_names() -> set[str]:
    """Backticked names of docs/observability.md, less its own "Dashboards" section (which names
    what the dashboards read, so it cannot vouch for them)."""
    text = (REPO / "docs" / "observability.md").read_text()
    sections = re.split(r"(?m)^(?=## )", text)
    return promql.documented_names("".join(s for s in sections if not s.startswith("## Dashboards")))


def _panels(data: dict) -> list[dict]:
    return [p for p in data["panels"] if p["type"] != "row"]


def test_the_generated_json_parses_and_every_panel_has_a_datasource_a_unit_and_a_target() -> None:
    """Catches: a panel on Grafana's default data source, a panel without a unit, an empty panel."""
    dashboards = build.build_dashboards()
    assert sorted(dashboards) == sorted(d.file for d in spec.DASHBOARDS)
    for name, data in dashboards.items():
        data = json.loads(build.render(data))  # what is committed
        names = [v["name"] for v in data["templating"]["list"]]
        assert names[0] == "datasource" and data["templating"]["list"][0]["query"] == "prometheus", name
        assert data["uid"] and data["title"] and data["schemaVersion"] >= 36
        assert _panels(data), name
        for p in _panels(data):
            where = f"{name}: {p['title']}"
            assert p["datasource"] == DATASOURCE, where
            assert p["fieldConfig"]["defaults"]["unit"], where
            assert p["targets"], where
            for t in p["targets"]:
                assert t["expr"].strip() and t["datasource"] == DATASOURCE, where
            for var in promql.variables(" ".join(t["expr"] for t in p["targets"])) - set(spec.BUILTIN_VARIABLES):
                assert var in names, f"{where} uses ${var}, which the dashboard does not define"
        for var in data["templating"]["list"][1:]:
            assert var["datasource"] == DATASOURCE and var["allValue"] == ".*", var["name"]


def test_the_operations_dashboard_has_the_rows_of_section_7() -> None:
    data = build.build_dashboards()["llmlab-operations.json"]
    assert [p["title"] for p in data["panels"] if p["type"] == "row"] == SECTION_7_ROWS
    cost = [q for q in spec.panels() if q.row == "Cost"]
    used = set().union(*(promql.metric_names(e) for q in cost for e in q.exprs))
    assert {f"llmlab_accounting_gpu_cost_usd_per_{s}" for s in ("hour", "request", "mtok")} <= used


def test_units_are_set_as_grafana_ids() -> None:
    units = {q.unit for q in spec.panels()}
    assert {"s", "percentunit", "bytes", "currencyUSD"} <= units
    grafana_ids = {"s", "percentunit", "percent", "bytes", "Bps", "currencyUSD", "reqps", "ops", "watt", "short"}
    assert all(u in grafana_ids or u.startswith("suffix: ") for u in units), units


def test_ids_and_uids_are_unique_and_panels_do_not_overlap() -> None:
    dashboards = build.build_dashboards()
    uids = [d["uid"] for d in dashboards.values()]
    assert len(uids) == len(set(uids))
    for name, data in dashboards.items():
        ids = [p["id"] for p in data["panels"]]
        assert len(ids) == len(set(ids)) and all(isinstance(i, int) for i in ids), name
        cells: set[tuple[int, int]] = set()
        for p in data["panels"]:
            g = p["gridPos"]
            assert g["x"] >= 0 and g["x"] + g["w"] <= 24, (name, p["title"])
            mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
            assert not cells & mine, f"{name}: {p['title']} overlaps another panel"
            cells |= mine
        titles = [(q.row, q.title) for q in spec.panels() if q.dashboard == name]
        assert len(titles) == len(set(titles)), name


def test_every_metric_name_in_a_query_is_documented_or_a_recording_rule() -> None:
    """Catches: a typo in a metric name (an empty panel forever), a recording rule nobody writes."""
    known = _contract_names() | set(spec.RECORDING_RULES) | set(spec.OTHER_NAMES)
    assert len(known) > 40  # the doc's tables were read
    unknown = []
    for q in spec.panels():
        for expr in q.exprs:
            names = promql.metric_names(expr)
            assert names, f"{q.title}: no metric name found in {expr}"
            unknown += [(q.title, n) for n in names if not promql.is_known(n, known, spec.OTHER_NAME_PREFIXES)]
    for query in spec.VARIABLE_QUERIES.values():
        names = promql.template_metric_names(query)
        assert names
        unknown += [("template", n) for n in names if not promql.is_known(n, known)]
    assert unknown == []
    # rules are read only by their contract names
    used = {n for q in spec.panels() for e in q.exprs for n in promql.metric_names(e) if ":" in n}
    assert used <= set(spec.RECORDING_RULES)


def test_a_misspelt_metric_name_is_caught() -> None:
    known = _contract_names() | set(spec.RECORDING_RULES)
    expr = 'sum by (pool) (rate(llmlab_worker_atempts_total{pool=~".*"}[5m]))'
    assert promql.metric_names(expr) == {"llmlab_worker_atempts_total"}
    assert not promql.is_known("llmlab_worker_atempts_total", known)
    assert not promql.is_known("llmlab:gateway_ttft_seconds:p99_5m", known)
    assert promql.is_known("llmlab_gateway_ttft_seconds_bucket", known)


def test_metric_names_skips_functions_labels_keywords_and_durations() -> None:
    expr = (
        "histogram_quantile(0.95, sum by (le, step) (rate(llmlab_gateway_admission_seconds_bucket"
        '{step!="route"}[5m] offset 1m))) / on (step) group_left count(up == 0) or vector(1e3)'
    )
    assert promql.metric_names(expr) == {"llmlab_gateway_admission_seconds_bucket", "up"}
    assert promql.metric_names("llmlab:gateway_5xx:ratio_rate5m > bool 0.02") == {"llmlab:gateway_5xx:ratio_rate5m"}


def test_documented_names_expands_the_elided_families() -> None:
    text = "| `llmlab_x_cost_usd_per_hour`, `..._per_request`, `..._per_mtok` | gauge |\n`llmlab_y_total{reason}`"
    assert promql.documented_names(text) == {
        "llmlab_x_cost_usd_per_hour",
        "llmlab_x_cost_usd_per_request",
        "llmlab_x_cost_usd_per_mtok",
        "llmlab_y_total",
    }


def test_variables_become_regex_matchers_for_raw_prometheus() -> None:
    """Catches: a query that only works inside Grafana (a variable left in, or used outside =~)."""
    assert promql.substitute('x{model=~"$model",pool=~"${pool}"} [[model]]') == 'x{model=~".*",pool=~".*"} .*'
    assert promql.substitute('x{pool=~"$pool"}', {"pool": "vllm"}) == 'x{pool=~"vllm"}'
    for d in spec.DASHBOARDS:
        for row in d.rows:
            for p in row.panels:
                for t in p.targets:
                    assert "$" not in re.sub(r'=~"\$(?:model|pool)"|\[\$__range\]', "", t.expr), t.expr
                    assert promql.variables(t.expr) <= set(d.variables) | set(spec.BUILTIN_VARIABLES), t.expr
    assert "[90000ms]" in " ".join(e for q in spec.panels(range_s=90) for e in q.exprs)  # $__range
    for q in spec.panels():
        assert all("$" not in e and "[[" not in e for e in q.exprs), q.title
        assert q.shape in ("matrix", "vector") and q.queries == q.exprs


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Prometheus) not installed")
def test_promtool_parses_every_query(tmp_path: Path) -> None:
    """Catches: PromQL that Prometheus rejects (every raw query as a recording rule, checked offline)."""
    rules = [
        {"record": f"dashboard:query_{i}", "expr": e} for i, e in enumerate(e for q in spec.panels() for e in q.exprs)
    ]
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    proc = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_committed_json_is_what_the_code_generates() -> None:
    """Catches: a dashboard edited in code but not regenerated (run make dashboards)."""
    assert build.stale_files(COMMITTED) == []


def test_check_detects_a_stale_a_missing_and_an_extra_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["generate", "--out", str(tmp_path)]) == 0
    assert cli.main(["check", "--out", str(tmp_path)]) == 0
    first = tmp_path / spec.DASHBOARDS[0].file
    data = json.loads(first.read_text())
    data["panels"][1]["targets"][0]["expr"] = "up"
    first.write_text(build.render(data))
    (tmp_path / "old.json").write_text("{}\n")
    (tmp_path / spec.DASHBOARDS[1].file).unlink()
    capsys.readouterr()
    assert cli.main(["check", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "differs" in err and "missing" in err and "old.json" in err and "make dashboards" in err


def test_the_provisioning_files_point_at_the_dashboards_and_the_datasource_uid() -> None:
    ds = yaml.safe_load((REPO / "infra/grafana/provisioning/datasources/prometheus.yml").read_text())
    (source,) = ds["datasources"]
    assert source["uid"] == build.DATASOURCE_UID and source["url"] == "http://prometheus:9090"
    assert source["type"] == "prometheus"
    prov = yaml.safe_load((REPO / "infra/grafana/provisioning/dashboards/llmlab.yml").read_text())
    (provider,) = prov["providers"]
    assert provider["type"] == "file" and provider["options"]["path"] == "/var/lib/grafana/dashboards"


# -- snapshot (pure: fake query functions) ------------------------------------------------------------

START, END, STEP = 1_780_000_000.0, 1_780_000_600.0, 10.0


def _series(labels: dict[str, str], base: float) -> Series:
    times = tuple(START + i * STEP for i in range(61))
    return Series(labels, times, tuple(base * (1 + 0.3 * ((i % 12) / 12)) for i in range(61)))


def _fake(expr: str, start: float, end: float, step: float) -> list[Series]:
    """Data for every query, in a magnitude that fits its unit; none for the DCGM families."""
    assert (start, end, step) == (START, END, STEP)
    if "DCGM" in expr:
        return []
    if "failing" in expr:
        raise QueryError("bad_data: parse error")
    base = 0.2 if ("seconds" in expr or "ratio" in expr) else 40.0
    return [_series({"pool": "vllm", "model": "m1", "job": "gateway"}, base), _series({"pool": "sglang"}, base * 2)]


def test_a_row_is_drawn_with_titles_units_legends_and_no_data() -> None:
    """Catches: an empty panel drawn as a blank chart (it must say no data), a missing legend or unit."""
    rows = [q for q in spec.panels() if q.row == "GPU efficiency"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fig, errors = snapshot.row_figure("ops / GPU efficiency", rows, _fake, START, END, STEP)
    assert errors == [] and [str(w.message) for w in caught] == []
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title(loc="left") for ax in axes] == [q.title for q in rows]
    for ax, q in zip(axes, rows, strict=True):
        texts = [t.get_text() for t in ax.texts]
        assert ax.get_ylabel() == snapshot.unit_name(q.unit)
        if any("DCGM" in e for e in q.exprs) and all("DCGM" in e for e in q.exprs):
            assert texts == ["no data"], q.title
        else:
            assert "no data" not in texts
            legend = ax.get_legend()
            first = snapshot.legend(q.legends[0], {"pool": "vllm", "model": "m1", "job": "gateway"})
            assert legend is not None and legend.get_texts()[0].get_text() == first, q.title


def test_a_failed_query_is_drawn_and_reported() -> None:
    q = spec.PanelQuery("d.json", "r", "Broken", ("failing_metric",), ("",), "matrix", spec.SECONDS)
    fig, errors = snapshot.row_figure("d / r", [q], _fake, START, END, STEP)
    assert len(errors) == 1 and "Broken" in errors[0] and "parse error" in errors[0]
    assert [t.get_text() for t in fig.axes[0].texts] == ["query failed"]


def test_snapshot_writes_one_png_per_row(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Finalise what earlier tests left to the garbage collector first: its ResourceWarnings
    # ("unclosed transport") would otherwise land among the warnings recorded here.
    gc.collect()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        paths, errors = snapshot.snapshot(_fake, START, END, tmp_path, step=STEP)
    assert errors == [] and [str(w.message) for w in caught] == []
    rows = {(q.dashboard, q.row) for q in spec.panels()}
    assert len(paths) == len(rows) == sum(len(d.rows) for d in spec.DASHBOARDS)
    assert tmp_path / "llmlab-operations--service-health.png" in paths
    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""


def test_legends_and_values_are_formatted() -> None:
    assert snapshot.legend("{{pool}} {{engine}}", {"pool": "vllm", "engine": "vllm"}) == "vllm vllm"
    assert snapshot.legend("", {"__name__": "x", "pool": "a", "code": "ok"}) == "code=ok, pool=a"
    assert snapshot.legend("{{missing}}", {}) == "value"
    assert snapshot.format_value(0.25, spec.SECONDS) == "250 ms"
    assert snapshot.format_value(2.5, spec.SECONDS) == "2.5 s"
    assert snapshot.format_value(0.02, spec.RATIO) == "2%"
    assert snapshot.format_value(3 * 1024**3, spec.BYTES) == "3 GiB"
    assert snapshot.format_value(0.0012, spec.USD) == "$0.0012"
    assert snapshot.format_value(12, spec.TOKENS_PER_S) == "12 tok/s"
    assert snapshot.unit_name(spec.TOKENS_PER_S) == "tok/s"


def test_the_time_range_options() -> None:
    assert cli.parse_duration("10m") == 600 and cli.parse_duration("1.5h") == 5400
    assert cli.parse_time("1780000000") == 1_780_000_000
    assert cli.parse_time("2026-05-28T20:26:40Z") == cli.parse_time("2026-05-28T20:26:40")
    with pytest.raises(SystemExit):
        cli.main(["snapshot", "--prometheus", "http://127.0.0.1:9", "--start", "10", "--out", "x"])
    with pytest.raises(SystemExit):
        cli.main(["snapshot", "--prometheus", "http://127.0.0.1:9", "--last", "ten", "--out", "x"])
