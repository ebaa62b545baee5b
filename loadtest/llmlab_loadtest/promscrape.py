"""Prometheus text scrapes for the benchmarks: counters and histograms read before and after a run,
their difference, and quantiles of a histogram's observations between two scrapes (linear
interpolation inside a bucket, as PromQL's ``histogram_quantile`` does)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

import httpx

# One sample: name, its labels as a sorted tuple, value.
Sample = tuple[str, tuple[tuple[str, str], ...]]
Scrape = dict[Sample, float]

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse(text: str) -> Scrape:
    out: Scrape = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if m is None:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        labels = tuple(sorted(_LABEL.findall(m.group(2) or "")))
        out[(m.group(1), labels)] = value
    return out


def scrape(base: str, timeout: float = 10.0) -> Scrape:
    """``base``/metrics parsed; empty when it does not answer (a benchmark reports the gap, it does not stop)."""
    try:
        return parse(httpx.get(base + "/metrics", timeout=timeout).text)
    except httpx.HTTPError:
        return {}


def delta(before: Scrape, after: Scrape) -> Scrape:
    """What each series gained between two scrapes (a series new in ``after`` counts from 0)."""
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


def total(s: Scrape, name: str, where: Mapping[str, str] | None = None) -> float:
    """Sum of a metric's series whose labels include ``where``."""
    want = set((where or {}).items())
    return sum(v for (n, labels), v in s.items() if n == name and want <= set(labels))


def by_label(s: Scrape, name: str, label: str) -> dict[str, float]:
    """A metric's series summed per value of one label."""
    out: dict[str, float] = {}
    for (n, labels), v in s.items():
        if n == name:
            key = dict(labels).get(label, "")
            out[key] = out.get(key, 0.0) + v
    return out


def buckets(s: Scrape, histogram: str) -> list[tuple[float, float]]:
    """Cumulative ``(le, count)`` of a histogram, its label sets added, in order of ``le``."""
    acc: dict[float, float] = {}
    for (n, labels), v in s.items():
        if n == histogram + "_bucket":
            le = dict(labels).get("le")
            if le is not None:
                bound = math.inf if le in ("+Inf", "inf") else float(le)
                acc[bound] = acc.get(bound, 0.0) + v
    return sorted(acc.items())


def percentiles_ms(cumulative: list[tuple[float, float]]) -> dict[str, float | None]:
    """p50, p95 and p99 (ms, 0.1 ms) of a histogram in seconds; None without observations."""
    out: dict[str, float | None] = {}
    for q in (0.5, 0.95, 0.99):
        v = quantile(cumulative, q)
        out[f"p{int(q * 100)}"] = None if v is None else round(v * 1e3, 1)
    return out


def sum_count(s: Scrape, histogram: str, where: Mapping[str, str] | None = None) -> tuple[float, float]:
    """A histogram's ``_sum`` and ``_count``, its label sets that include ``where`` added."""
    return total(s, histogram + "_sum", where), total(s, histogram + "_count", where)


def selector(text: str) -> tuple[str, dict[str, str]]:
    """``name{label="value",...}`` (PromQL's equality matchers only) as the name and its labels."""
    name, _, rest = text.partition("{")
    return name, dict(_LABEL.findall(rest))


def quantile(cumulative: list[tuple[float, float]], q: float) -> float | None:
    """The ``q`` quantile of cumulative buckets (PromQL ``histogram_quantile``): linear inside the
    bucket that holds it, the lower bound 0 for the first; the highest finite bound when it falls in
    the +Inf bucket. None without observations."""
    if not cumulative or cumulative[-1][1] <= 0:
        return None
    rank = q * cumulative[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in cumulative:
        if count >= rank:
            if math.isinf(bound):
                return lower_bound
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = bound, count
    return lower_bound
