"""What the accounting domain needs of a store, with no ClickHouse client in sight: the tables'
names, a query's result and the :class:`Store` protocol (:class:`~llmlab_accounting.store.ClickHouseStore`
in-process for a server, :class:`~llmlab_accounting.store.StoreProcess` for embedded chdb)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa

ATTEMPTS_TABLE = "attempts_raw"
REQUESTS_TABLE = "requests_raw"
ATTRIBUTION_TABLE = "gpu_attribution"
PERIODS_TABLE = "gpu_periods"
HEARTBEATS_TABLE = "worker_heartbeats"


@dataclass(frozen=True)
class QueryResult:
    columns: list[str]
    types: list[str]
    rows: list[list[Any]]


class Store(Protocol):
    """What the service needs of a store."""

    def ensure_schema(self) -> None: ...
    def insert_arrow(self, table: str, data: pa.Table) -> None: ...
    def insert_json(self, table: str, lines: Iterable[bytes]) -> None: ...
    def query(
        self,
        sql: str,
        parameters: dict[str, Any] | None = None,
        *,
        readonly: bool = True,
        max_rows: int | None = None,
        timeout_s: int | None = None,
    ) -> QueryResult: ...
    def scalar(self, sql: str, parameters: dict[str, Any] | None = None) -> Any: ...
    def query_isolated(
        self,
        sql: str,
        parameters: dict[str, Any] | None = None,
        *,
        max_rows: int,
        timeout_s: int,
        max_memory_bytes: int,
    ) -> QueryResult: ...
    def close(self) -> None: ...
