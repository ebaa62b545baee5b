"""Events → Arrow tables of rows, in the event loop or in worker processes.

Validation (pydantic), the row mapping and building the columns are most of the CPU an event costs.
With ``decode_processes`` > 0 chunks go to that many worker processes (``spawn``: the service has
threads), which return Arrow tables (cheap to pickle), so the event loop only moves bytes and acks.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import logging
import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
from llmlab_common.catalog import Catalog, load_catalog
from llmlab_common.messages import AttemptEvent, RequestEvent
from pydantic import ValidationError

from llmlab_accounting.columns import ATTEMPT_SCHEMA, REQUEST_SCHEMA, columns_to_arrow, to_arrow
from llmlab_accounting.domain import RequestRow, attempt_columns, request_row
from llmlab_accounting.service import Batch

log = logging.getLogger(__name__)
Item = tuple[bool, bytes]  # (is an attempt event, else a request event; the message body)


@dataclass
class Decoded:
    attempts: list[pa.Table] = field(default_factory=list)  # one table per decoded chunk
    requests: list[pa.Table] = field(default_factory=list)
    bad: list[tuple[int, str]] = field(default_factory=list)  # (index in the input, why)
    ended_at: list[float] = field(default_factory=list)  # a sample, for the ingest-lag histogram
    # The input index each row came from, in row order: a row the store refuses is traced back
    # to its message (dead-lettered) instead of failing its whole batch.
    attempt_src: list[int] = field(default_factory=list)
    request_src: list[int] = field(default_factory=list)

    def extend(self, other: Decoded, offset: int = 0) -> None:
        self.attempts += other.attempts
        self.requests += other.requests
        self.bad += [(i + offset, why) for i, why in other.bad]
        self.attempt_src += [i + offset for i in other.attempt_src]
        self.request_src += [i + offset for i in other.request_src]
        if len(self.ended_at) < 50:
            self.ended_at += other.ended_at

    def batch(self) -> Batch:
        return Batch(_concat(self.attempts, ATTEMPT_SCHEMA), _concat(self.requests, REQUEST_SCHEMA), self.ended_at)


def _concat(tables: list[pa.Table], schema: pa.Schema) -> pa.Table:
    return tables[0] if len(tables) == 1 else pa.concat_tables(tables) if tables else schema.empty_table()


def decode(items: Sequence[Item], catalog: Catalog) -> Decoded:
    """Validate and map ``items``; one that fails (malformed, or a value no column holds) is
    listed in ``bad`` with why, and never takes the rest of its chunk with it."""
    attempts: list[AttemptEvent] = []
    attempt_src: list[int] = []
    requests: list[RequestRow] = []  # refusals are few: row by row
    request_src: list[int] = []
    bad: list[tuple[int, str]] = []
    for i, (is_attempt, data) in enumerate(items):
        try:
            if is_attempt:
                attempts.append(AttemptEvent.model_validate_json(data))
                attempt_src.append(i)
            else:
                requests.append(request_row(RequestEvent.model_validate_json(data), catalog))
                request_src.append(i)
        except ValidationError as exc:
            bad.append((i, str(exc)[:500]))
        except Exception as exc:  # a value the row mapping cannot take (say, a time out of range)
            bad.append((i, f"unmappable: {exc}"[:500]))
    att_tables, att_kept = _tables(
        attempts, attempt_src, lambda evs: columns_to_arrow(attempt_columns(evs, catalog), ATTEMPT_SCHEMA), bad
    )
    req_tables, req_kept = _tables(requests, request_src, lambda rows: to_arrow(rows, REQUEST_SCHEMA), bad)
    kept = set(att_kept)
    ended = [e.ended_at for e, i in zip(attempts, attempt_src, strict=True) if i in kept][:50]
    return Decoded(att_tables, req_tables, bad, ended, att_kept, req_kept)


def _tables(
    rows: Sequence[Any], src: list[int], build: Callable[[Sequence[Any]], pa.Table], bad: list[tuple[int, str]]
) -> tuple[list[pa.Table], list[int]]:
    """One table of ``rows``; if a value does not fit its column (a count past the integer type,
    a time past DateTime64), the rows one by one, listing those that fail in ``bad``."""
    if not rows:
        return [], []
    try:
        return [build(rows)], src
    except Exception:
        tables, kept = [], []
        for row, i in zip(rows, src, strict=True):
            try:
                tables.append(build([row]))
                kept.append(i)
            except Exception as exc:
                bad.append((i, f"value out of range: {exc}"[:500]))
        return ([pa.concat_tables(tables)] if tables else []), kept


def tune_gc() -> None:
    """Decoding allocates ~10 objects per event and frees them by reference counting (no cycles),
    yet each burst of allocations triggers collections that walk every live object: at 20k
    events/s that doubled the cost of validating an event. Freeze what start-up built and
    collect the young generation rarely. Called once a process is set up."""
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)


_catalog: Catalog | None = None


def _init_worker(catalog_path: str) -> None:
    global _catalog
    _catalog = load_catalog(catalog_path)
    tune_gc()


def _decode_in_worker(items: Sequence[Item]) -> Decoded:
    assert _catalog is not None
    return decode(items, _catalog)


class Decoder:
    def __init__(self, catalog: Catalog, catalog_path: Path, processes: int = 0, min_parallel: int = 256) -> None:
        self.catalog = catalog
        self.processes = processes
        self.min_parallel = min_parallel  # smaller batches: not worth the inter-process copy
        self.catalog_path = catalog_path
        self.restarts = 0
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        if processes > 0:
            self._pool = self._new_pool()

    def _new_pool(self) -> concurrent.futures.ProcessPoolExecutor:
        return concurrent.futures.ProcessPoolExecutor(
            self.processes,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_init_worker,
            initargs=(str(self.catalog_path),),
        )

    async def decode(self, items: Sequence[Item]) -> Decoded:
        if self._pool is None or len(items) < self.min_parallel:
            return decode(items, self.catalog)
        loop = asyncio.get_running_loop()
        step = -(-len(items) // self.processes)
        chunks = [items[i : i + step] for i in range(0, len(items), step)]
        pool = self._pool
        try:
            parts = await asyncio.gather(*(loop.run_in_executor(pool, _decode_in_worker, c) for c in chunks))
        except BrokenProcessPool:
            # A decode process died (OOM-killed, say): the pool is unusable from then on. Start a
            # new one for the next chunks and decode this one here, so ingest goes on.
            log.error("a decode process died; starting new ones (this chunk decoded in the event loop)")
            if self._pool is pool:
                pool.shutdown(wait=False, cancel_futures=True)
                self._pool = self._new_pool()
                self.restarts += 1
            return decode(items, self.catalog)
        out = Decoded()
        for k, part in enumerate(parts):
            out.extend(part, k * step)
        return out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
