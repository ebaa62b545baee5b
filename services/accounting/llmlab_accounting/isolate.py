"""Poison isolation for inserts: a batch the store refuses while it is otherwise healthy is split
until the rows it refuses on their own are found; those go to the dead letters and the rest is
inserted. A store that is down is not "refusing rows": the caller keeps the batch and retries.

Pure logic over two callables (insert a batch, probe the store), so it is tested without a store.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

import pyarrow as pa

from llmlab_accounting.service import Batch

Kind = Literal["attempt", "request"]


@dataclass(frozen=True)
class Refused:
    kind: Kind
    row: int  # index in the batch's attempts or requests table
    why: str


class StoreDown(Exception):
    """The insert failed and the store does not answer a probe either: retry the whole batch."""


def _only(kind: Kind, table: pa.Table) -> Batch:
    empty = Batch.of([], [])
    return Batch(table, empty.requests) if kind == "attempt" else Batch(empty.attempts, table)


async def insert_isolating(
    insert: Callable[[Batch], Awaitable[None]],
    healthy: Callable[[], Awaitable[bool]],
    batch: Batch,
) -> list[Refused]:
    """Insert ``batch``; the rows the store refuses alone (twice, with a healthy probe between)
    are returned instead of inserted. Raises :class:`StoreDown` when the store does not answer."""
    try:
        await insert(batch)
        return []
    except Exception as exc:
        if not await healthy():
            raise StoreDown(str(exc)) from exc
    out: list[Refused] = []
    for kind, table in (("attempt", batch.attempts), ("request", batch.requests)):
        if table.num_rows:
            out += await _bisect(insert, healthy, kind, table, 0)  # type: ignore[arg-type]
    return out


async def _bisect(
    insert: Callable[[Batch], Awaitable[None]],
    healthy: Callable[[], Awaitable[bool]],
    kind: Kind,
    table: pa.Table,
    offset: int,
) -> list[Refused]:
    try:
        await insert(_only(kind, table))
        return []
    except Exception as exc:
        if not await healthy():
            raise StoreDown(str(exc)) from exc
        if table.num_rows == 1:
            try:  # once more: a transient failure on a healthy store is not poison
                await insert(_only(kind, table))
                return []
            except Exception as again:
                if not await healthy():
                    raise StoreDown(str(again)) from again
                return [Refused(kind, offset, str(again)[:500])]
    half = table.num_rows // 2
    left = await _bisect(insert, healthy, kind, table.slice(0, half), offset)
    return left + await _bisect(insert, healthy, kind, table.slice(half), offset + half)
