"""``python -m llmlab_accounting.explain REQUEST_ID`` (``make explain-latency REQUEST_ID=...``):
where one request's time went, from its rows in the ``attempts`` view (see
:mod:`llmlab_accounting.latency` for each phase and how it is measured).

``--slowest`` picks the completed request with the longest time from acceptance to its last
token among the last ``--since-minutes`` (default 60). The SQL goes where ``llmlab_accounting.query``
sends it: the running service (``--url``), a ClickHouse server (``--dsn``) or the chdb directory.

Examples::

    python -m llmlab_accounting.explain --url http://127.0.0.1:8086 chatcmpl-…
    python -m llmlab_accounting.explain --url http://127.0.0.1:8086 --slowest --json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys

from llmlab_accounting.latency import COLUMNS, WALL_SQL, render, split
from llmlab_accounting.query import Runner, add_target_args, open_runner

# Request ids are NATS subject tokens (llmlab_common.subjects.check_token): nothing to escape.
_REQUEST_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def slowest_request(runner: Runner, since_minutes: float) -> str | None:
    r = runner.query(
        "SELECT request_id FROM attempts WHERE outcome = 'completed' AND dispatch_offset_s IS NOT NULL "
        f"AND ended_at >= now64(3) - toIntervalSecond({int(since_minutes * 60)}) "
        f"ORDER BY {WALL_SQL} DESC LIMIT 1"
    )
    return str(r.rows[0][0]) if r.rows else None


def attempt_rows(runner: Runner, request_id: str) -> list[dict[str, object]]:
    if not _REQUEST_ID.match(request_id):
        raise ValueError(f"not a request id: {request_id!r}")
    cols = ", ".join(COLUMNS)
    r = runner.query(f"SELECT {cols} FROM attempts WHERE request_id = '{request_id}' ORDER BY attempt")
    return [dict(zip(r.columns, row, strict=True)) for row in r.rows]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_target_args(p)
    p.add_argument("request_id", nargs="?", help="the X-Request-Id the gateway answered with")
    p.add_argument("--slowest", action="store_true", help="explain the slowest completed request instead")
    p.add_argument("--since-minutes", type=float, default=60.0)
    p.add_argument("--json", action="store_true", help="print the split as JSON")
    args = p.parse_args(argv)
    if not args.request_id and not args.slowest:
        p.error("give a REQUEST_ID or --slowest")
    runner = open_runner(args)
    try:
        rid = args.request_id or slowest_request(runner, args.since_minutes)
        if rid is None:
            sys.stderr.write(f"no completed request in the last {args.since_minutes:g} minutes" + "\n")
            return 1
        try:
            rows = attempt_rows(runner, rid)
        except ValueError as exc:
            sys.stderr.write(str(exc) + "\n")
            return 2
    finally:
        runner.close()
    s = split(rid, rows)
    if s is None:
        sys.stderr.write(f"no attempt rows for request {rid} (not ingested yet, or unknown)" + "\n")
        return 1
    if args.json:
        out = dataclasses.asdict(s) | {"accounted_s": s.accounted_s}
        sys.stdout.write(json.dumps(out, default=str) + "\n")
    else:
        sys.stdout.write(render(s) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
