"""``python -m llmlab_accounting.query``: run read-only SQL against the accounting store.

Where the SQL goes, first match wins:

* ``--url http://host:8086`` (or ``LLMLAB_ACCOUNTING_URL``): the running accounting service's
  ``POST /admin/v1/query`` with the admin key (``--admin-key`` / ``LLMLAB_ACCOUNTING_ADMIN_KEY``,
  default the dev key). In embedded mode the service owns the chdb directory: this is the way in.
* ``--dsn``: a ClickHouse server, through clickhouse-connect (``http://user:pass@host:8123/db``).
* ``--data-dir``: the chdb directory itself, when no service holds it (refused otherwise).

Examples::

    python -m llmlab_accounting.query --url http://127.0.0.1:8086 "SELECT count() FROM attempts"
    python -m llmlab_accounting.query --data-dir .run/accounting/chdb -f reports/sql/top_spenders.sql
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from pathlib import Path
from typing import Any, Protocol

import httpx

from llmlab_accounting.ports import QueryResult
from llmlab_accounting.settings import DEFAULT_DATA_DIR, DEV_ADMIN_KEY
from llmlab_accounting.store import ClickHouseStore


class Runner(Protocol):
    def query(self, sql: str) -> QueryResult: ...

    def close(self) -> None: ...


class HttpRunner:
    def __init__(self, base_url: str, admin_key: str, timeout_s: float = 60) -> None:
        self.client = httpx.Client(
            base_url=base_url.rstrip("/"), headers={"Authorization": f"Bearer {admin_key}"}, timeout=timeout_s
        )

    def query(self, sql: str) -> QueryResult:
        r = self.client.post("/admin/v1/query", json={"sql": sql})
        if r.status_code != 200:
            raise RuntimeError(f"query failed ({r.status_code}): {r.text[:2000]}")
        body = r.json()
        return QueryResult(body["columns"], body["types"], body["rows"])

    def close(self) -> None:
        self.client.close()


class StoreRunner:
    def __init__(self, store: ClickHouseStore) -> None:
        self.store = store

    def query(self, sql: str) -> QueryResult:
        return self.store.query(sql, readonly=True)

    def close(self) -> None:
        self.store.close()


def service_up(url: str) -> bool:
    try:
        return httpx.get(url.rstrip("/") + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def add_target_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default=os.environ.get("LLMLAB_ACCOUNTING_URL"), help="accounting service base URL")
    p.add_argument("--admin-key", default=os.environ.get("LLMLAB_ACCOUNTING_ADMIN_KEY", DEV_ADMIN_KEY))
    p.add_argument("--dsn", default=os.environ.get("LLMLAB_ACCOUNTING_STORE_DSN", ""), help="ClickHouse server DSN")
    p.add_argument(
        "--data-dir",
        type=Path,
        default=Path(os.environ.get("LLMLAB_ACCOUNTING_DATA_DIR", DEFAULT_DATA_DIR)),
        help="chdb directory (only when no service holds it)",
    )


def open_runner(args: argparse.Namespace) -> Runner:
    if args.url:
        return HttpRunner(args.url, args.admin_key)
    if args.dsn:
        return StoreRunner(ClickHouseStore.open(args.dsn))
    store = ClickHouseStore.open(data_dir=args.data_dir)
    store.ensure_schema()  # an empty directory still answers (empty tables)
    return StoreRunner(store)


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def to_markdown(r: QueryResult) -> str:
    lines = ["| " + " | ".join(r.columns) + " |", "|" + "---|" * len(r.columns)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in r.rows]
    return "\n".join(lines) + "\n"


def write_csv(r: QueryResult, out: Any) -> None:
    w = csv.writer(out)
    w.writerow(r.columns)
    w.writerows([[_cell(v) for v in row] for row in r.rows])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_target_args(p)
    p.add_argument("sql", nargs="?", help="the SQL (or -f FILE)")
    p.add_argument("-f", "--file", type=Path)
    p.add_argument("--format", choices=("md", "csv", "json"), default="md")
    args = p.parse_args(argv)
    sql = args.file.read_text() if args.file else args.sql
    if not sql:
        p.error("give SQL or -f FILE")
    runner = open_runner(args)
    try:
        r = runner.query(sql)
    finally:
        runner.close()
    if args.format == "md":
        sys.stdout.write(to_markdown(r))
    elif args.format == "csv":
        write_csv(r, sys.stdout)
    else:
        sys.stdout.write(json.dumps({"columns": r.columns, "rows": r.rows}, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
