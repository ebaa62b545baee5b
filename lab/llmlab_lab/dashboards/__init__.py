"""Grafana dashboards as code for llm-inference-lab (tutorial §7).

Library: grafanalib (pinned in lab/pyproject.toml). It is small (pure Python over attrs), writes
the classic dashboard JSON that every Grafana since 8 imports and provisions from files, and its
panel classes (``TimeSeries``, ``Stat``, ``RowPanel``) cover what these dashboards need. The newer
grafana-foundation-sdk (also on PyPI) is a generated builder API, one module per panel kind and a
release line per Grafana version: more than two dashboards call for, and not what the rest of the
field's examples use.

- :mod:`.spec`: what the dashboards show, as plain data (rows, panels, PromQL targets, units), and
  :func:`panels`, the raw queries (variables replaced by ``.*``) that tests and the snapshot send
  to Prometheus;
- :mod:`.build`: the Grafana JSON (:func:`build_dashboards`), written to and checked against
  ``infra/grafana/dashboards/``;
- :mod:`.grafana_import`: upload into a running Grafana with grafana-client;
- :mod:`.snapshot`: PNGs of every row from Prometheus, for machines without Grafana.

Command line: ``python -m llmlab_lab.dashboards generate|check|import|snapshot|queries``
(docs/observability.md, "Dashboards").
"""

from __future__ import annotations

from .build import build_dashboards, render, stale_files, write_dashboards
from .promql import metric_names, substitute
from .spec import DASHBOARDS, PanelQuery, panels

__all__ = [
    "DASHBOARDS",
    "PanelQuery",
    "build_dashboards",
    "metric_names",
    "panels",
    "render",
    "stale_files",
    "substitute",
    "write_dashboards",
]
