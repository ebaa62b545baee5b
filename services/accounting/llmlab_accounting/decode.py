"""Events → JSONEachRow lines, in the event loop or in worker processes.

Validation (pydantic), the row mapping and serialisation are most of the CPU an event costs; one
Python process parses about 10-15k events/s. With ``decode_processes`` > 0 batches are split over
that many worker processes (``spawn``: the service has threads), so the event loop only moves
bytes and acks."""

from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from llmlab_common.catalog import Catalog, load_catalog
from llmlab_common.messages import AttemptEvent, RequestEvent
from pydantic import ValidationError

from llmlab_accounting.domain import attempt_row, request_row

Item = tuple[bool, bytes]  # (is an attempt event, else a request event; the message body)


@dataclass
class Decoded:
    attempts: list[bytes] = field(default_factory=list)
    requests: list[bytes] = field(default_factory=list)
    bad: list[tuple[int, str]] = field(default_factory=list)  # (index in the input, why)
    ended_at: list[float] = field(default_factory=list)  # a sample, for the ingest-lag histogram

    def extend(self, other: Decoded, offset: int) -> None:
        self.attempts += other.attempts
        self.requests += other.requests
        self.bad += [(i + offset, why) for i, why in other.bad]
        self.ended_at += other.ended_at


def decode(items: Sequence[Item], catalog: Catalog) -> Decoded:
    out = Decoded()
    for i, (is_attempt, data) in enumerate(items):
        try:
            if is_attempt:
                row = attempt_row(AttemptEvent.model_validate_json(data), catalog)
                out.attempts.append(orjson.dumps(row))
                if len(out.ended_at) < 50:
                    out.ended_at.append(row["ended_at"])
            else:
                out.requests.append(orjson.dumps(request_row(RequestEvent.model_validate_json(data), catalog)))
        except ValidationError as exc:
            out.bad.append((i, str(exc)[:500]))
    return out


_catalog: Catalog | None = None


def _init_worker(catalog_path: str) -> None:
    global _catalog
    _catalog = load_catalog(catalog_path)


def _decode_in_worker(items: Sequence[Item]) -> Decoded:
    assert _catalog is not None
    return decode(items, _catalog)


class Decoder:
    def __init__(self, catalog: Catalog, catalog_path: Path, processes: int = 0, min_parallel: int = 256) -> None:
        self.catalog = catalog
        self.processes = processes
        self.min_parallel = min_parallel  # smaller batches: not worth the inter-process copy
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        if processes > 0:
            self._pool = concurrent.futures.ProcessPoolExecutor(
                processes,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_init_worker,
                initargs=(str(catalog_path),),
            )

    async def decode(self, items: Sequence[Item]) -> Decoded:
        if self._pool is None or len(items) < self.min_parallel:
            return decode(items, self.catalog)
        loop = asyncio.get_running_loop()
        step = -(-len(items) // self.processes)
        chunks = [items[i : i + step] for i in range(0, len(items), step)]
        parts = await asyncio.gather(*(loop.run_in_executor(self._pool, _decode_in_worker, c) for c in chunks))
        out = Decoded()
        for k, part in enumerate(parts):
            out.extend(part, k * step)
        return out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
