"""The specs of :mod:`.spec` as Grafana dashboard JSON, built with grafanalib.

Layout: each row is a Grafana row panel (expanded) followed by its panels, left to right on the
24-column grid (stat panels 4 units high, time series 8). Panel ids are numbered in order, so the
JSON is the same on every run. Every panel and target reads the templated data source
``${datasource}`` (type prometheus, defaulting to the provisioned uid ``llmlab-prometheus``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import grafanalib.core as g
from grafanalib._gen import DashboardEncoder

from . import spec

DATASOURCE_UID = "llmlab-prometheus"  # infra/grafana/provisioning/datasources/prometheus.yml
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# Grafana 10/11's schema: panel and target data sources as {type, uid} objects.
SCHEMA_VERSION = 39
HEIGHT = {"stat": 4, "timeseries": 8}
REF_IDS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _thresholds(threshold: float | None) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = [{"color": "green", "value": None}]
    if threshold is not None:
        steps.append({"color": "red", "value": threshold})
    return steps


def _targets(p: spec.Panel) -> list[g.Target]:
    return [
        g.Target(
            expr=t.expr,
            legendFormat=t.legend,
            refId=REF_IDS[i],
            datasource=DATASOURCE,
            instant=p.kind == "stat",
        )
        for i, t in enumerate(p.targets)
    ]


def _panel(p: spec.Panel, pid: int, pos: g.GridPos) -> g.Panel:
    common: dict[str, Any] = {
        "title": p.title,
        "description": p.description,
        "dataSource": DATASOURCE,
        "targets": _targets(p),
        "id": pid,
        "gridPos": pos,
        "thresholds": _thresholds(p.threshold),
    }
    if p.kind == "stat":
        return g.Stat(
            **common,
            format=p.unit,
            reduceCalc="lastNotNull",
            noValue="no data",
            colorMode="value" if p.threshold is not None else "none",
        )
    return g.TimeSeries(
        **common,
        unit=p.unit,
        legendDisplayMode="list",
        legendPlacement="bottom",
        tooltipMode="multi",
        tooltipSort="desc",
        fillOpacity=30 if p.stack else 10,
        stacking={"mode": "normal", "group": "A"} if p.stack else {"mode": "none"},
        thresholdsStyleMode="line" if p.threshold is not None else "off",
        valueMin=0,
    )


def _layout(d: spec.Dashboard) -> list[g.Panel]:
    out: list[g.Panel] = []
    pid, y = 1, 0
    for row in d.rows:
        out.append(g.RowPanel(title=row.title, id=pid, gridPos=g.GridPos(h=1, w=24, x=0, y=y)))
        pid, y = pid + 1, y + 1
        x, line_h = 0, 0
        for p in row.panels:
            h = HEIGHT[p.kind]
            if x + p.width > 24:
                x, y, line_h = 0, y + line_h, 0
            out.append(_panel(p, pid, g.GridPos(h=h, w=p.width, x=x, y=y)))
            pid, x, line_h = pid + 1, x + p.width, max(line_h, h)
        y += line_h
    return out


def _templates(d: spec.Dashboard) -> list[g.Template]:
    out = [
        g.Template(
            name="datasource", label="Data source", query="prometheus", type="datasource", default=DATASOURCE_UID
        )
    ]
    for name in d.variables:
        out.append(
            g.Template(
                name=name,
                label=name,
                query=spec.VARIABLE_QUERIES[name],
                dataSource=DATASOURCE,
                includeAll=True,
                multi=True,
                allValue=".*",
                default="All",
                refresh=g.REFRESH_ON_TIME_RANGE_CHANGE,
            )
        )
    return out


def grafanalib_dashboard(d: spec.Dashboard) -> g.Dashboard:
    return g.Dashboard(
        title=d.title,
        uid=d.uid,
        description=d.description,
        tags=list(d.tags),
        panels=_layout(d),
        templating=g.Templating(list=_templates(d)),
        time=g.Time("now-1h", "now"),
        refresh="30s",
        timezone="utc",
        graphTooltip=g.GRAPH_TOOLTIP_MODE_SHARED_CROSSHAIR,
        schemaVersion=SCHEMA_VERSION,
    )


def dashboard_json(d: spec.Dashboard) -> dict[str, Any]:
    """The Grafana JSON of one dashboard (plain dicts and lists)."""
    data: dict[str, Any] = json.loads(json.dumps(grafanalib_dashboard(d).to_json_data(), cls=DashboardEncoder))
    data.pop("rows", None)  # the pre-5.0 layout; panels carry the rows here
    for var in data["templating"]["list"]:
        if var["type"] == "query":
            # "All" selected: Grafana sends allValue (.*) for it.
            var["current"] = {"selected": True, "text": ["All"], "value": ["$__all"]}
            var["definition"] = var["query"]
        else:
            var["current"] = {"selected": False, "text": "Prometheus", "value": DATASOURCE_UID}
    return data


def build_dashboards(dashboards: tuple[spec.Dashboard, ...] = spec.DASHBOARDS) -> dict[str, dict[str, Any]]:
    """File name -> Grafana dashboard JSON, for every dashboard."""
    return {d.file: dashboard_json(d) for d in dashboards}


def render(data: dict[str, Any]) -> str:
    """The committed text of one dashboard: sorted keys, two-space indent, final newline."""
    return json.dumps(data, sort_keys=True, indent=2) + "\n"


def write_dashboards(out_dir: Path) -> list[Path]:
    """Write every dashboard's JSON under ``out_dir``; returns the files written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, data in build_dashboards().items():
        path = out_dir / name
        path.write_text(render(data))
        paths.append(path)
    return paths


def stale_files(out_dir: Path) -> list[str]:
    """What differs between ``out_dir`` and the code: missing, changed, or extra ``*.json`` files."""
    expected = {name: render(data) for name, data in build_dashboards().items()}
    problems = []
    for name, text in expected.items():
        path = out_dir / name
        if not path.is_file():
            problems.append(f"{path}: missing")
        elif path.read_text() != text:
            problems.append(f"{path}: differs from what the code generates")
    for path in sorted(out_dir.glob("*.json")):
        if path.name not in expected:
            problems.append(f"{path}: not generated by the code (remove it)")
    return problems
