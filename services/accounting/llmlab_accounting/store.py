"""ClickHouse adapter: the schema, batched inserts and read-only queries, through clickhouse-connect
on an embedded chdb directory (the default) or a ClickHouse server (``store_dsn``).

clickhouse-connect has no async client and chdb runs in-process, so callers run these methods in a
worker thread (``asyncio.to_thread``); one lock serialises them (neither client is thread-safe).

Single writer: chdb allows one process per data directory. Before opening it this process takes
an exclusive ``flock`` on ``<data_dir>/accounting.lock`` (non-blocking): a second process is refused
with :class:`StoreLocked` naming the holder's pid. The kernel drops the lock when the holder's file
descriptor closes, so it is released on any exit, SIGKILL included.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import clickhouse_connect

log = logging.getLogger(__name__)

ATTEMPTS_TABLE = "attempts_raw"
REQUESTS_TABLE = "requests_raw"
ATTRIBUTION_TABLE = "gpu_attribution"
PERIODS_TABLE = "gpu_periods"


class StoreLocked(RuntimeError):
    pass


class WriterLock:
    """An exclusive, non-blocking ``flock`` held for the life of the process (or until release)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> WriterLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise StoreLocked(
                f"{self.path.parent} is owned by another process (pid {holder}); chdb allows one process "
                "per data directory: query it through that process (POST /admin/v1/query) instead"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def schema_statements() -> list[str]:
    text = resources.files("llmlab_accounting").joinpath("schema.sql").read_text()
    text = re.sub(r"--[^\n]*", "", text)
    return [s.strip() for s in text.split(";") if s.strip()]


@dataclass(frozen=True)
class QueryResult:
    columns: list[str]
    types: list[str]
    rows: list[list[Any]]


class ClickHouseStore:
    def __init__(self, client: Any, lock: WriterLock | None = None) -> None:
        self.client = client
        self.lock = lock
        self._mutex = threading.Lock()

    @classmethod
    def open(cls, dsn: str = "", data_dir: Path | None = None) -> ClickHouseStore:
        """A server when ``dsn`` is set, else chdb in ``data_dir`` (after taking the writer lock)."""
        if dsn:
            return cls(clickhouse_connect.get_client(dsn=dsn))
        if data_dir is None:
            raise ValueError("either a DSN or a chdb data directory is needed")
        data_dir = Path(data_dir).resolve()
        lock = WriterLock(data_dir / "accounting.lock").acquire()
        try:
            client = clickhouse_connect.get_client(dsn=f"chdb://{data_dir}")
        except Exception:
            lock.release()
            raise
        return cls(client, lock)

    def close(self) -> None:
        with self._mutex:
            with contextlib.suppress(Exception):
                self.client.close()
            if self.lock is not None:
                self.lock.release()

    def ensure_schema(self) -> None:
        with self._mutex:
            for stmt in schema_statements():
                self.client.command(stmt)

    # -- writes (blocking: call through asyncio.to_thread) --------------------------------------
    def insert_json(self, table: str, lines: Iterable[bytes]) -> None:
        """Insert JSONEachRow lines: ClickHouse parses the block natively (much faster than
        building its native format row by row in Python)."""
        block = b"\n".join(lines)
        if block:
            with self._mutex:
                self.client.raw_insert(table, insert_block=block, fmt="JSONEachRow")

    # -- reads ------------------------------------------------------------------------------------
    def query(
        self,
        sql: str,
        parameters: dict[str, Any] | None = None,
        *,
        readonly: bool = True,
        max_rows: int | None = None,
        timeout_s: int | None = None,
    ) -> QueryResult:
        settings: dict[str, Any] = {}
        if readonly:
            settings["readonly"] = 1
        if max_rows is not None:
            settings["max_result_rows"] = max_rows
            settings["result_overflow_mode"] = "throw"
        if timeout_s is not None:
            settings["max_execution_time"] = timeout_s
        with self._mutex:
            r = self.client.query(sql, parameters=parameters or None, settings=settings or None)
        return QueryResult(list(r.column_names), [t.name for t in r.column_types], [list(row) for row in r.result_rows])

    def scalar(self, sql: str, parameters: dict[str, Any] | None = None) -> Any:
        rows = self.query(sql, parameters).rows
        return rows[0][0] if rows else None
