"""How busy the machine was during each test: the measurement behind ``scripts/test-tiers.sh``.

A pytest plugin, opt-in: ``LLMLAB_CPUWATCH_OUT=/tmp/tests.jsonl pytest -p llmlab_testkit.cpuwatch``.
Per test (setup, call and teardown together) it appends one JSON line: the node id, the wall time
and the cores busy over it, read from ``/proc/stat`` (every process of the machine, the services
a test starts included; on a host running nothing else that is the test's own load).
``python -m llmlab_testkit.cpuwatch FILE [--markers DIR]`` sums a file by test file, and by tier
when DIR holds ``<tier>.txt`` lists of node ids (``pytest -m <tier> --collect-only -q``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

OUT_ENV = "LLMLAB_CPUWATCH_OUT"


def read_stat(text: str) -> tuple[int, int]:
    """(all jiffies, idle jiffies) from the first line of ``/proc/stat`` (idle includes iowait)."""
    fields = [int(x) for x in text.split("\n", 1)[0].split()[1:9]]
    return sum(fields), fields[3] + fields[4]


def busy_cores(before: tuple[int, int], after: tuple[int, int], cores: int) -> float:
    """Cores busy on average between two readings of :func:`read_stat`."""
    total = after[0] - before[0]
    if total <= 0:
        return 0.0
    return (total - (after[1] - before[1])) / total * cores


def _now() -> tuple[int, int]:
    return read_stat(Path("/proc/stat").read_text())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    out = os.environ.get(OUT_ENV)
    if not out:
        yield
        return
    t0, s0 = time.monotonic(), _now()
    yield
    t1, s1 = time.monotonic(), _now()
    row = {"id": item.nodeid, "wall": round(t1 - t0, 3), "busy": round(busy_cores(s0, s1, os.cpu_count() or 1), 3)}
    with open(out, "a") as f:
        f.write(json.dumps(row) + "\n")


def summarize(rows: Iterable[dict[str, Any]], key: Callable[[dict[str, Any]], str]) -> list[dict[str, Any]]:
    """Rows grouped by ``key(row)``: tests, wall seconds, core-seconds and mean busy cores, the
    longest group first."""
    groups: dict[str, dict[str, Any]] = {}
    for r in rows:
        k = key(r)
        g = groups.setdefault(k, {"group": k, "tests": 0, "wall_s": 0.0, "core_s": 0.0})
        g["tests"] += 1
        g["wall_s"] += r["wall"]
        g["core_s"] += r["wall"] * r["busy"]
    for g in groups.values():
        g["busy_cores"] = g["core_s"] / g["wall_s"] if g["wall_s"] else 0.0
    return sorted(groups.values(), key=lambda g: -g["wall_s"])


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m llmlab_testkit.cpuwatch", description=__doc__)
    p.add_argument("file", type=Path, help="the JSON lines the plugin wrote")
    p.add_argument("--markers", type=Path, help="a folder of <tier>.txt node-id lists (the first naming a test wins)")
    p.add_argument("--top", type=int, default=25, help="test files to list")
    a = p.parse_args(argv)
    rows = [json.loads(line) for line in a.file.read_text().splitlines() if line.strip()]
    out = []
    if a.markers:
        tier_of: dict[str, str] = {}
        for lst in sorted(a.markers.glob("*.txt")):
            for node in lst.read_text().split():
                tier_of.setdefault(node, lst.stem)
        out.append(("tier", summarize(rows, lambda r: tier_of.get(r["id"], "(none)"))))
    out.append(("file", summarize(rows, lambda r: r["id"].split("::", 1)[0])[: a.top]))
    whole = summarize(rows, lambda r: "all")[0]
    lines = [f"{whole['tests']} tests, {whole['wall_s']:.0f} s, {whole['busy_cores']:.2f} cores busy on average"]
    for title, groups in out:
        lines.append(f"\nby {title}:")
        for g in groups:
            lines.append(f"{g['wall_s']:8.1f} s  {g['busy_cores']:4.2f} cores  {g['tests']:4d} tests  {g['group']}")
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
