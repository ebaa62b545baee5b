"""Command line of the dashboards (run from the repository root).

python -m llmlab_lab.dashboards generate [--out infra/grafana/dashboards]
python -m llmlab_lab.dashboards check [--out infra/grafana/dashboards]       # exit 1 when stale
python -m llmlab_lab.dashboards import --url URL [--token TOKEN] [--folder NAME]   # or GRAFANA_TOKEN
python -m llmlab_lab.dashboards snapshot --prometheus URL [--start TS --end TS | --last 10m] --out DIR
python -m llmlab_lab.dashboards queries                                       # every panel's raw PromQL (JSON)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

DEFAULT_OUT = Path("infra") / "grafana" / "dashboards"
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _out(line: object) -> None:
    sys.stdout.write(f"{line}\n")


def _err(line: object) -> None:
    sys.stderr.write(f"{line}\n")


def parse_duration(text: str) -> float:
    m = _DURATION.match(text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"not a duration (like 30s, 10m, 2h): {text!r}")
    return float(m.group(1)) * _SECONDS[m.group(2)]


def parse_time(text: str) -> float:
    """Unix seconds, or an ISO 8601 / RFC 3339 time (a time without a zone is UTC)."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        t = datetime.fromisoformat(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a unix time or ISO 8601 time: {text!r}") from exc
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    return t.timestamp()


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m llmlab_lab.dashboards", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="write the dashboards' JSON")
    g.add_argument("--out", type=Path, default=DEFAULT_OUT)
    c = sub.add_parser("check", help="exit 1 when the committed JSON differs from what the code generates")
    c.add_argument("--out", type=Path, default=DEFAULT_OUT)
    i = sub.add_parser("import", help="upload the dashboards into a running Grafana (overwrite)")
    i.add_argument("--url", required=True, help="Grafana's base URL, e.g. http://127.0.0.1:3000")
    i.add_argument("--token", default=None, help="service-account token (default: env GRAFANA_TOKEN)")
    i.add_argument("--folder", default=None, help="folder title (default: llm-inference-lab)")
    i.add_argument("--timeout", type=float, default=10.0)
    s = sub.add_parser("snapshot", help="PNG per dashboard row from Prometheus (no Grafana needed)")
    s.add_argument("--prometheus", required=True, help="Prometheus base URL, e.g. http://127.0.0.1:9090")
    s.add_argument("--start", type=parse_time, default=None, help="unix seconds or ISO 8601 (with --end)")
    s.add_argument("--end", type=parse_time, default=None, help="unix seconds or ISO 8601 (with --start)")
    s.add_argument("--last", type=parse_duration, default=None, help="the range ending now (default 10m)")
    s.add_argument("--step", type=parse_duration, default=None, help="query step (default: range / 240)")
    s.add_argument("--out", type=Path, required=True)
    sub.add_parser("queries", help="print every panel's raw PromQL, shape and unit as JSON")
    return ap


def _time_range(args: argparse.Namespace, ap: argparse.ArgumentParser) -> tuple[float, float]:
    if (args.start is None) != (args.end is None):
        ap.error("--start and --end go together")
    if args.start is not None:
        if args.last is not None:
            ap.error("give --start/--end or --last, not both")
        if args.end <= args.start:
            ap.error("--end must be after --start")
        return float(args.start), float(args.end)
    end = time.time()
    return end - (args.last or 600.0), end


def main(argv: Sequence[str] | None = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    if args.command == "generate":
        from .build import write_dashboards

        for path in write_dashboards(args.out):
            _out(path)
        return 0
    if args.command == "check":
        from .build import stale_files

        problems = stale_files(args.out)
        for line in problems:
            _err(f"stale: {line}")
        if problems:
            _err("regenerate with: make dashboards")
            return 1
        _out(f"{args.out}: up to date")
        return 0
    if args.command == "import":
        from grafana_client.client import GrafanaException

        from .build import build_dashboards
        from .grafana_import import DEFAULT_FOLDER, import_dashboards

        token = args.token or os.environ.get("GRAFANA_TOKEN") or None
        try:
            lines = import_dashboards(
                args.url, build_dashboards(), token=token, folder=args.folder or DEFAULT_FOLDER, timeout=args.timeout
            )
        except (GrafanaException, OSError) as exc:
            _err(f"import into {args.url} failed: {type(exc).__name__}: {exc}")
            return 1
        for line in lines:
            _out(line)
        return 0
    if args.command == "snapshot":
        from .snapshot import PrometheusRange, snapshot

        start, end = _time_range(args, ap)
        with PrometheusRange(args.prometheus) as query:
            paths, errors = snapshot(query, start, end, args.out, step=args.step)
        for path in paths:
            _out(path)
        for line in errors:
            _err(f"query failed: {line}")
        return 1 if errors else 0
    if args.command == "queries":
        from .spec import panels

        _out(json.dumps([dataclasses.asdict(p) for p in panels()], indent=2))
        return 0
    raise AssertionError(args.command)


if __name__ == "__main__":
    sys.exit(main())
