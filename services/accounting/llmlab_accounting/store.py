"""ClickHouse adapter: the schema, batched inserts and read-only queries, through clickhouse-connect
on an embedded chdb directory (the default) or a ClickHouse server (``store_dsn``).

clickhouse-connect has no async client and chdb runs in-process, so callers run these methods in a
worker thread (``asyncio.to_thread``); one lock serialises them (neither client is thread-safe).

chdb holds the GIL while it runs a statement, so in a service an insert or a long report query
would stall its event loop (NATS, HTTP): the service runs its chdb store in a child process
(:class:`StoreProcess`), which it talks to through a pipe; the CLIs use :class:`ClickHouseStore`
in-process.

Single writer: chdb allows one process per data directory. Before opening it this process takes
an exclusive ``flock`` on ``<data_dir>/accounting.lock`` (non-blocking): a second process is refused
with :class:`StoreLocked` naming the holder's pid. The kernel drops the lock when the holder's file
descriptor closes, so it is released on any exit, SIGKILL included.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import fcntl
import logging
import multiprocessing
import os
import re
import signal
import threading
from collections.abc import Iterable, Iterator
from concurrent.futures.process import BrokenProcessPool
from importlib import resources
from pathlib import Path
from typing import Any

import clickhouse_connect
import pyarrow as pa

from llmlab_accounting.ports import QueryResult

log = logging.getLogger(__name__)


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


class ClickHouseStore:
    def __init__(self, client: Any, lock: WriterLock | None = None, dsn: str = "") -> None:
        self.client = client
        self.lock = lock
        self.dsn = dsn  # where a client of its own for an untrusted query connects (query_isolated)
        self._mutex = threading.Lock()

    @classmethod
    def open(cls, dsn: str = "", data_dir: Path | None = None) -> ClickHouseStore:
        """A server when ``dsn`` is set, else chdb in ``data_dir`` (after taking the writer lock)."""
        if dsn:
            return cls(clickhouse_connect.get_client(dsn=dsn), dsn=dsn)
        if data_dir is None:
            raise ValueError("either a DSN or a chdb data directory is needed")
        data_dir = Path(data_dir).resolve()
        lock = WriterLock(data_dir / "accounting.lock").acquire()
        dsn = f"chdb://{data_dir}"
        try:
            client = clickhouse_connect.get_client(dsn=dsn)
        except Exception:
            lock.release()
            raise
        return cls(client, lock, dsn)

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
    def insert_arrow(self, table: str, data: pa.Table) -> None:
        """Insert an Arrow table (the ingest path: no text for ClickHouse to parse)."""
        if data.num_rows:
            with self._mutex:
                self.client.insert_arrow(table, data)

    def insert_json(self, table: str, lines: Iterable[bytes]) -> None:
        """Insert JSONEachRow lines (small, infrequent writes such as attribution rows)."""
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

    @contextlib.contextmanager
    def _own_client(self) -> Iterator[Any]:
        """A client of its own on the same store (chdb: another handle on this process's engine,
        with its own session state; a server: another HTTP session), closed on exit."""
        client = clickhouse_connect.get_client(dsn=self.dsn)
        try:
            yield client
        finally:
            with contextlib.suppress(Exception):
                client.close()

    def query_isolated(
        self,
        sql: str,
        parameters: dict[str, Any] | None = None,
        *,
        max_rows: int,
        timeout_s: int,
        max_memory_bytes: int,
    ) -> QueryResult:
        """An untrusted read-only query (the admin endpoint's) on a client of its own, opened for
        it and closed after it. clickhouse-connect applies some statements' settings with ``SET``
        and restores them after; a statement it takes for an insert (``WITH ... INSERT``) fails
        between the two and leaves its session read-only for good. On the ingest client that
        stopped every later insert; here it dies with the throwaway client. Under ``readonly=1``
        ClickHouse also refuses the statement's own ``SETTINGS`` and the file/url table functions."""
        settings = {
            "readonly": 1,
            "max_result_rows": max_rows,
            "result_overflow_mode": "throw",
            "max_execution_time": timeout_s,
            "max_memory_usage": max_memory_bytes,
        }
        with self._mutex, self._own_client() as client:
            r = client.query(sql, parameters=parameters or None, settings=settings)
        return QueryResult(list(r.column_names), [t.name for t in r.column_types], [list(row) for row in r.result_rows])


# -- the store in a child process ----------------------------------------------------------------
_child_store: ClickHouseStore | None = None
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Linux: the kernel kills this process when its parent dies (SIGKILL included), so the
    writer lock never outlives the service. (A pool worker would otherwise wait forever.)"""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _child_open(data_dir: str) -> int:
    global _child_store
    _die_with_parent()
    _child_store = ClickHouseStore.open(data_dir=Path(data_dir))
    return os.getpid()


def _child_call(method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if _child_store is None:
        raise RuntimeError("the store process has no open store")
    return getattr(_child_store, method)(*args, **kwargs)


class StoreProcess:
    """A :class:`ClickHouseStore` on a chdb directory, run by one child process: calls block the
    calling thread (use ``asyncio.to_thread``) and run one at a time, in order. The child takes
    the writer lock; it dies with this process."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.restarts = 0
        self._pool, self.pid = self._start()

    def _start(self) -> tuple[concurrent.futures.ProcessPoolExecutor, int]:
        # One worker, spawned by this first submit from the calling thread (the parent-death
        # signal follows the thread that forks: open from the main thread).
        pool = concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
        try:
            return pool, pool.submit(_child_open, str(self.data_dir)).result()
        except BaseException:
            pool.shutdown(wait=True)
            raise

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return self._pool.submit(_child_call, method, args, kwargs).result()
        except BrokenProcessPool:
            # The child died (OOM-killed, a chdb crash): its writer lock went with it. Start a new
            # one on the same directory and run the call there, once; a second death is raised.
            log.error("the chdb process %d died; starting a new one", self.pid)
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool, self.pid = self._start()
            self.restarts += 1
            return self._pool.submit(_child_call, method, args, kwargs).result()

    def ensure_schema(self) -> None:
        self._call("ensure_schema")

    def insert_arrow(self, table: str, data: pa.Table) -> None:
        if data.num_rows:
            self._call("insert_arrow", table, data)

    def insert_json(self, table: str, lines: Iterable[bytes]) -> None:
        self._call("insert_json", table, list(lines))

    def query(self, sql: str, parameters: dict[str, Any] | None = None, **options: Any) -> QueryResult:
        """:meth:`ClickHouseStore.query` in the child (``readonly``, ``max_rows``, ``timeout_s``)."""
        result: QueryResult = self._call("query", sql, parameters, **options)
        return result

    def scalar(self, sql: str, parameters: dict[str, Any] | None = None) -> Any:
        return self._call("scalar", sql, parameters)

    def query_isolated(self, sql: str, parameters: dict[str, Any] | None = None, **limits: int) -> QueryResult:
        """:meth:`ClickHouseStore.query_isolated` in the child (``max_rows``, ``timeout_s``, ``max_memory_bytes``)."""
        result: QueryResult = self._call("query_isolated", sql, parameters, **limits)
        return result

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._call("close")
        self._pool.shutdown(wait=True, cancel_futures=True)
