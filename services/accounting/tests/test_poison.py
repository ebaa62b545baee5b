"""Poison isolation: an event whose values no column holds, or a row the store refuses, is
dead-lettered alone; the rest of its batch is stored and ingest goes on."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from llmlab_accounting.decode import decode
from llmlab_accounting.domain import attempt_row
from llmlab_accounting.isolate import Refused, StoreDown, insert_isolating
from llmlab_accounting.service import Batch
from llmlab_common.catalog import Catalog
from llmlab_common.messages import AttemptEvent
from llmlab_testkit.e2e import edited_json

pytestmark = pytest.mark.unit


def _poisoned(ev: AttemptEvent, **changes: object) -> bytes:
    return edited_json(ev.model_dump_json(), **changes)


def test_a_value_no_column_holds_fails_only_its_event(
    catalog: Catalog, attempt_factory: Callable[..., AttemptEvent]
) -> None:
    """Catches: one out-of-range value (a token count past int64, a time past DateTime64) raising
    out of decode() for its whole chunk: on dd4f538 that killed the commit loop, and recovery
    re-read the same message on every restart."""
    good = [attempt_factory(f"r{i}").model_dump_json().encode() for i in range(4)]
    huge_count = _poisoned(attempt_factory("p1"), usage__prompt_tokens=10**20)
    far_future = _poisoned(attempt_factory("p2"), ended_at=1e300)
    items = [(True, good[0]), (True, huge_count), (True, good[1]), (True, far_future), (True, good[2])]
    items += [(True, b'{"not": "an event"}'), (True, good[3])]
    d = decode(items, catalog)
    assert sorted(i for i, _ in d.bad) == [1, 3, 5]
    assert d.attempt_src == [0, 2, 4, 6]
    table = d.batch().attempts
    assert table.column("request_id").to_pylist() == ["r0", "r1", "r2", "r3"]


class FakeStore:
    """Refuses any insert holding a row whose request_id is in ``poison``; ``down`` fails all."""

    def __init__(self, poison: set[str], down: bool = False, flaky: int = 0) -> None:
        self.poison, self.down, self.flaky = poison, down, flaky
        self.rows: list[str] = []

    async def insert(self, batch: Batch) -> None:
        ids = batch.attempts.column("request_id").to_pylist() + batch.requests.column("request_id").to_pylist()
        if self.down or self.poison & set(ids):
            raise RuntimeError("refused")
        if self.flaky:
            self.flaky -= 1
            raise RuntimeError("transient")
        self.rows += ids

    async def healthy(self) -> bool:
        return not self.down


def _batch(catalog: Catalog, attempt_factory: Callable[..., AttemptEvent], n: int) -> Batch:
    return Batch.of([attempt_row(attempt_factory(f"r{i}"), catalog) for i in range(n)])


async def test_bisection_finds_the_refused_rows_and_stores_the_rest(
    catalog: Catalog, attempt_factory: Callable[..., AttemptEvent]
) -> None:
    store = FakeStore({"r3", "r11"})
    try:
        refused = await insert_isolating(store.insert, store.healthy, _batch(catalog, attempt_factory, 16))
    except StoreDown:
        pytest.fail("rows refused by a healthy store were taken for the store being down (retried forever)")
    assert [(r.kind, r.row) for r in refused] == [("attempt", 3), ("attempt", 11)]
    assert sorted(store.rows) == sorted(f"r{i}" for i in range(16) if i not in (3, 11))


async def test_a_store_that_is_down_is_not_a_poison_row(
    catalog: Catalog, attempt_factory: Callable[..., AttemptEvent]
) -> None:
    """Catches: dead-lettering a whole batch because the store was down (its rows are good)."""
    store = FakeStore(set(), down=True)
    with pytest.raises(StoreDown):
        await insert_isolating(store.insert, store.healthy, _batch(catalog, attempt_factory, 8))
    assert store.rows == []


async def test_a_transient_failure_on_a_healthy_store_dead_letters_nothing(
    catalog: Catalog, attempt_factory: Callable[..., AttemptEvent]
) -> None:
    """A failure that goes away on retry (the batch, then its halves) costs no row."""
    store = FakeStore(set(), flaky=1)
    refused = await insert_isolating(store.insert, store.healthy, _batch(catalog, attempt_factory, 5))
    assert refused == [] and sorted(store.rows) == [f"r{i}" for i in range(5)]


async def test_requests_and_attempts_are_bisected_apart(
    catalog: Catalog, attempt_factory: Callable[..., AttemptEvent], refusal_factory: Callable[..., object]
) -> None:
    from llmlab_accounting.domain import request_row

    store = FakeStore({"bad-refusal"})
    rows = [attempt_row(attempt_factory(f"r{i}"), catalog) for i in range(3)]
    reqs = [request_row(refusal_factory(rid), catalog) for rid in ("ok-refusal", "bad-refusal")]  # type: ignore[arg-type]
    refused = await insert_isolating(store.insert, store.healthy, Batch.of(rows, reqs))
    assert refused == [Refused("request", 1, "refused")]
    assert sorted(store.rows) == ["ok-refusal", "r0", "r1", "r2"]
