"""Dashboards without Grafana: one PNG per row, one small chart per panel, drawn with matplotlib
(Agg canvas, no pyplot) from Prometheus ``/api/v1/query_range`` over a time range.

Each chart has the panel's title, its unit on the y axis (values formatted in that unit), a legend
of the series' bounded labels (the panel's legend format, else the labels less ``__name__``) and
"no data" when every query came back empty; a query that failed is drawn as "query failed" and
counted, so the command can exit non-zero.

The rendering is pure: :func:`render_row` takes any ``query(expr, start, end, step)`` function;
:class:`PrometheusRange` is the one that asks a Prometheus server.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
import matplotlib.dates as mdates
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator

from . import spec
from .spec import PanelQuery

COLUMNS = 3
MAX_LEGEND = 8
_LEGEND_VAR = re.compile(r"\{\{\s*(\w+)\s*\}\}")


@dataclass(frozen=True)
class Series:
    labels: dict[str, str]
    times: tuple[float, ...]  # unix seconds
    values: tuple[float, ...]


QueryRange = Callable[[str, float, float, float], list[Series]]


class QueryError(RuntimeError):
    """Prometheus answered with an error (bad query, timeout) or not at all."""


class PrometheusRange:
    """``query(expr, start, end, step)`` against ``/api/v1/query_range`` of one server."""

    def __init__(self, base_url: str, timeout: float = 15.0) -> None:
        self._client = httpx.Client(base_url=base_url, timeout=timeout)

    def __call__(self, expr: str, start: float, end: float, step: float) -> list[Series]:
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        try:
            r = self._client.get("/api/v1/query_range", params=params)
            body: dict[str, Any] = r.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise QueryError(f"{type(exc).__name__}: {exc}") from exc
        if body.get("status") != "success":
            raise QueryError(f"{body.get('errorType', r.status_code)}: {body.get('error', r.text[:200])}")
        data = body["data"]
        if data.get("resultType") != "matrix":
            raise QueryError(f"expected a matrix, got {data.get('resultType')}")
        return [
            Series(
                labels=dict(item["metric"]),
                times=tuple(float(t) for t, _ in item["values"]),
                values=tuple(float(v) for _, v in item["values"]),
            )
            for item in data["result"]
        ]

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> PrometheusRange:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def legend(template: str, labels: dict[str, str]) -> str:
    """A series' legend: the panel's legend format filled in, else its labels (less ``__name__``)."""
    text = _LEGEND_VAR.sub(lambda m: labels.get(m.group(1), ""), template).strip() if template else ""
    if text:
        return " ".join(text.split())
    return ", ".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != "__name__") or "value"


def _num(v: float) -> str:
    """Three significant digits, with k/M/G/T from 1000 on (no scientific notation)."""
    for prefix in ("", "k", "M", "G"):
        if abs(v) < 999.5:  # what rounds to 3 digits below 1000
            return f"{v:.3g}{prefix}"
        v /= 1000
    return f"{v:.3g}T"


def _x(times: Sequence[float]) -> list[float]:
    """Unix seconds as matplotlib date numbers (so the x axis shows UTC clock times)."""
    return [float(mdates.date2num(datetime.fromtimestamp(t, UTC))) for t in times]


def _binary(v: float, suffix: str) -> str:
    for prefix in ("", "Ki", "Mi", "Gi", "Ti"):
        if abs(v) < 1024 or prefix == "Ti":
            return f"{_num(v)} {prefix}B{suffix}"
        v /= 1024
    raise AssertionError("unreachable")


def format_value(v: float, unit: str) -> str:
    """``v`` as Grafana would print it in ``unit`` (the units the dashboards use)."""
    if not math.isfinite(v):
        return str(v)
    if unit == spec.SECONDS:
        if v == 0:
            return "0 s"
        if abs(v) < 0.9995e-3:
            return f"{v * 1e6:.3g} µs"
        return f"{v * 1e3:.3g} ms" if abs(v) < 0.9995 else f"{_num(v)} s"
    if unit == spec.RATIO:
        return f"{_num(v * 100)}%"
    if unit == spec.PERCENT:
        return f"{_num(v)}%"
    if unit in (spec.BYTES, spec.BYTES_PER_S):
        return _binary(v, "/s" if unit == spec.BYTES_PER_S else "")
    if unit == spec.USD:
        return f"${_num(v)}"
    if unit == spec.REQ_PER_S:
        return f"{_num(v)} req/s"
    if unit == spec.PER_S:
        return f"{_num(v)}/s"
    if unit == spec.WATT:
        return f"{_num(v)} W"
    if unit.startswith("suffix:"):
        return f"{_num(v)}{unit.removeprefix('suffix:')}"
    return _num(v)


def unit_name(unit: str) -> str:
    """The y-axis label for a Grafana unit id."""
    names = {
        spec.SECONDS: "seconds",
        spec.RATIO: "percent",
        spec.PERCENT: "percent",
        spec.BYTES: "bytes",
        spec.BYTES_PER_S: "bytes/s",
        spec.USD: "USD ($)",
        spec.REQ_PER_S: "requests/s",
        spec.PER_S: "per second",
        spec.WATT: "watts",
        spec.COUNT: "count",
    }
    return names.get(unit, unit.removeprefix("suffix:").strip())


def _draw_panel(ax: Axes, panel: PanelQuery, query: QueryRange, start: float, end: float, step: float) -> str | None:
    """Draw one panel; returns an error line when a query failed."""
    ax.set_title(panel.title, fontsize=9, loc="left")
    ax.set_ylabel(unit_name(panel.unit), fontsize=7)
    ax.tick_params(labelsize=6)
    ax.grid(True, alpha=0.3)
    ax.set_xlim(*_x([start, end]))
    ax.xaxis.set_major_locator(MaxNLocator(5))
    # A short run (a demo, a test) would show one minute under every tick: seconds then.
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S" if end - start < 900 else "%H:%M", tz=UTC))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: format_value(v, panel.unit)))
    ax.yaxis.set_major_locator(MaxNLocator(5))
    errors: list[str] = []
    drawn: list[tuple[str, Series]] = []
    for expr, template in zip(panel.exprs, panel.legends, strict=True):
        try:
            result = query(expr, start, end, step)
        except QueryError as exc:
            errors.append(f"{panel.dashboard} / {panel.row} / {panel.title}: {exc} ({expr})")
            continue
        drawn += [(legend(template, s.labels), s) for s in result if s.times]
    if panel.stacked and drawn:
        _stack(ax, drawn)
    else:
        for name, s in drawn:
            ax.plot(_x(s.times), s.values, linewidth=1.2, label=name)
    if panel.threshold is not None and drawn:
        ax.axhline(panel.threshold, color="red", linestyle="--", linewidth=0.8)
    if errors:
        ax.text(0.5, 0.5, "query failed", transform=ax.transAxes, ha="center", va="center", color="red", fontsize=10)
    elif not drawn:
        ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center", color="grey", fontsize=10)
        ax.set_yticks([])
    if drawn:
        finite = [v for _, s in drawn for v in s.values if math.isfinite(v)]
        if finite:
            low, high = min(0.0, *finite), max(finite)
            # Headroom above the highest value: a flat series would sit on the frame, unseen.
            ax.set_ylim(bottom=low, top=high + 0.08 * (high - low) if high > low else high + 1)
        handles, labels = ax.get_legend_handles_labels()
        more = len(handles) - MAX_LEGEND
        if more > 0:
            handles, labels = (
                handles[:MAX_LEGEND],
                [*labels[: MAX_LEGEND - 1], f"{labels[MAX_LEGEND - 1]} (+{more} more)"],
            )
        ax.legend(handles, labels, fontsize=6, loc="upper left", framealpha=0.7, ncol=2 if len(handles) > 4 else 1)
    return "\n".join(errors) or None


def _stack(ax: Axes, drawn: list[tuple[str, Series]]) -> None:
    """Stacked areas on the union of the series' timestamps (a missing point counts as 0)."""
    grid = sorted({t for _, s in drawn for t in s.times})
    rows = []
    for _, s in drawn:
        by_t = {t: (v if math.isfinite(v) else 0.0) for t, v in zip(s.times, s.values, strict=True)}
        rows.append([by_t.get(t, 0.0) for t in grid])
    ax.stackplot(_x(grid), rows, labels=[n for n, _ in drawn], alpha=0.8)


def row_figure(
    title: str, panels: Sequence[PanelQuery], query: QueryRange, start: float, end: float, step: float
) -> tuple[Figure, list[str]]:
    """One row as a figure: its panels in a grid of :data:`COLUMNS`; and the failed queries."""
    cols = min(COLUMNS, max(1, len(panels)))
    rows = max(1, math.ceil(len(panels) / cols))
    width, height = 5.2 * cols, 2.9 * rows + 0.8
    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False)
    # Fixed margins (inches turned into fractions): no layout engine, so no layout warnings.
    fig.subplots_adjust(
        left=0.7 / width, right=1 - 0.15 / width, top=1 - 0.75 / height, bottom=0.3 / height, wspace=0.32, hspace=0.42
    )
    span = f"{datetime.fromtimestamp(start, UTC):%Y-%m-%d %H:%M:%S} to {datetime.fromtimestamp(end, UTC):%H:%M:%S} UTC"
    fig.suptitle(
        f"{title}    ({span}, step {step:g} s)", fontsize=11, x=0.7 / width, y=1 - 0.12 / height, ha="left", va="top"
    )
    errors = []
    for i, ax in enumerate(axes.flat):
        if i >= len(panels):
            ax.set_visible(False)
            continue
        err = _draw_panel(ax, panels[i], query, start, end, step)
        if err:
            errors.append(err)
    return fig, errors


def render_row(
    title: str, panels: Sequence[PanelQuery], query: QueryRange, start: float, end: float, step: float, path: Path
) -> list[str]:
    """One PNG for one row (:func:`row_figure`) at ``path``; returns the failed queries."""
    fig, errors = row_figure(title, panels, query, start, end, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return errors


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def default_step(start: float, end: float) -> float:
    """About 240 points per chart, at least 1 s."""
    return float(max(1, round((end - start) / 240)))


def snapshot(
    query: QueryRange,
    start: float,
    end: float,
    out_dir: Path,
    step: float | None = None,
    queries: Sequence[PanelQuery] | None = None,
) -> tuple[list[Path], list[str]]:
    """Every row of every dashboard as ``<dashboard>--<row>.png`` under ``out_dir``; returns the
    files written and the queries that failed."""
    if end <= start:
        raise ValueError("end must be after start")
    step = step or default_step(start, end)
    groups: dict[tuple[str, str], list[PanelQuery]] = {}
    for p in queries if queries is not None else spec.panels(range_s=end - start):
        groups.setdefault((p.dashboard, p.row), []).append(p)
    titles = {d.file: d.title for d in spec.DASHBOARDS}
    paths, errors = [], []
    for (dashboard, row), members in groups.items():
        path = out_dir / f"{Path(dashboard).stem}--{slug(row)}.png"
        errors += render_row(f"{titles.get(dashboard, dashboard)} / {row}", members, query, start, end, step, path)
        paths.append(path)
    return paths, errors
