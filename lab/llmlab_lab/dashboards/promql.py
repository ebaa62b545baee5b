"""PromQL helpers for the dashboards: Grafana variables replaced for raw Prometheus, and the metric
names an expression reads (so a typo in a panel fails a unit test instead of drawing an empty chart).

The extraction is deliberately small: it knows the PromQL the dashboards use (selectors, label
matchers, range selectors, functions, aggregations with ``by``/``without``, binary operators with
``on``/``ignoring``/``group_*``) and not the whole grammar. ``promtool check rules`` parses every
query for real in the tests where the binary exists.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

# Grafana's three variable syntaxes: $name, ${name} (also ${name:format}) and the deprecated [[name]].
_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENT = re.compile(r"(?<![\w:.])[A-Za-z_:][\w:]*")
_LABEL_VALUES = re.compile(r"label_values\(\s*([A-Za-z_:][\w:]*)\s*(?:\{[^}]*\})?\s*,")
KEYWORDS = frozenset(
    {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left", "group_right"}
    | {"inf", "nan", "Inf", "NaN", "atan2", "start", "end"}
)
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def variables(expr: str) -> set[str]:
    """The Grafana variables an expression uses."""
    return {next(g for g in m.groups() if g) for m in _VARIABLE.finditer(expr)}


def substitute(expr: str, values: Mapping[str, str] | None = None) -> str:
    """``expr`` with every Grafana variable replaced: by ``values[name]`` where given, else by ``.*``.

    The dashboards use variables only as regex matchers (``model=~"$model"``), so ``.*`` is what
    Grafana's "All" sends (each template sets ``allValue: .*``) and the query stays valid PromQL.
    """
    values = values or {}

    def repl(m: re.Match[str]) -> str:
        name = next(g for g in m.groups() if g)
        return values.get(name, ".*")

    return _VARIABLE.sub(repl, expr)


def metric_names(expr: str) -> set[str]:
    """The metric (and recording-rule) names an expression selects; functions, keywords, label
    names in groupings and durations are not names."""
    text = _STRING.sub('""', expr)
    text = _MATCHERS.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    names = set()
    for m in _IDENT.finditer(text):
        word = m.group(0)
        if word in KEYWORDS:
            continue
        rest = text[m.end() :].lstrip()
        if rest.startswith("("):  # a function or an aggregation
            continue
        names.add(word)
    return names


def template_metric_names(query: str) -> set[str]:
    """The metric a Grafana ``label_values(metric, label)`` template query reads."""
    return set(_LABEL_VALUES.findall(query))


def is_known(name: str, known: Iterable[str], prefixes: Iterable[str] = ()) -> bool:
    """Whether ``name`` is in ``known`` (or is a histogram series of a known family: ``_bucket``,
    ``_sum``, ``_count``), or starts with one of ``prefixes``."""
    known = set(known)
    if name in known or any(name.startswith(p) for p in prefixes):
        return True
    return any(name.endswith(s) and name[: -len(s)] in known for s in HISTOGRAM_SUFFIXES)


_BACKTICKED = re.compile(r"`(\.\.\._[a-z0-9_]+|[A-Za-z_][\w:]*)(?:\{[^}`]*\})?`")


def documented_names(markdown: str) -> set[str]:
    """Every backticked name in a Markdown text (docs/observability.md): ``name`` and
    ``name{label}``; ``..._per_request`` after ``x_per_hour`` is ``x_per_request``."""
    names: set[str] = set()
    last = ""
    for token in _BACKTICKED.findall(markdown):
        if token.startswith("..._"):
            tail = token[len("...") :]  # "_per_request"
            cut = last.rfind("_" + tail.split("_")[1] + "_")
            if last and cut > 0:
                names.add(last[:cut] + tail)
            continue
        names.add(token)
        last = token
    return names
