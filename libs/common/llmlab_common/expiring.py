"""Bounded maps and sets whose entries expire: the negative caches of API keys (the budget's
unknown keys, the gateway's just-refused keys) and the gateway's last admission per key share it."""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


class ExpiringMap(Generic[V]):
    """Entries leave ``ttl_s`` after they were put (``ttl_s`` <= 0: nothing is kept); past
    ``size`` entries the oldest put go first. ``clock`` is monotonic seconds (read at each call,
    so a test can move it)."""

    def __init__(self, ttl_s: float, size: int, clock: Callable[[], float] | None = None) -> None:
        self.ttl_s, self.size = ttl_s, size
        self.clock = clock or (lambda: time.monotonic())
        self._entries: dict[Hashable, tuple[float, V]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Hashable) -> V | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry[0] > self.clock():
            return entry[1]
        del self._entries[key]
        return None

    def discard(self, key: Hashable) -> None:
        self._entries.pop(key, None)

    def put(self, key: Hashable, value: V) -> None:
        if self.ttl_s <= 0:
            return
        self._entries.pop(key, None)  # re-put: it becomes the newest
        while len(self._entries) >= self.size:
            del self._entries[next(iter(self._entries))]  # insertion order: the oldest
        self._entries[key] = (self.clock() + self.ttl_s, value)


class ExpiringSet(ExpiringMap[bool]):
    """An :class:`ExpiringMap` of members only."""

    def __contains__(self, item: Hashable) -> bool:
        return self.get(item) is not None

    def add(self, item: Hashable) -> None:
        self.put(item, True)
