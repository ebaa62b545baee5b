"""A bounded set whose members expire: the negative caches of API keys (the budget's unknown
keys, the gateway's just-refused keys) share it."""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable


class ExpiringSet:
    """Members leave ``ttl_s`` after they were added (``ttl_s`` <= 0: nothing is kept); past
    ``size`` members the oldest added go first. ``clock`` is monotonic seconds (read at each call,
    so a test can move it)."""

    def __init__(self, ttl_s: float, size: int, clock: Callable[[], float] | None = None) -> None:
        self.ttl_s, self.size = ttl_s, size
        self.clock = clock or (lambda: time.monotonic())
        self._until: dict[Hashable, float] = {}

    def __len__(self) -> int:
        return len(self._until)

    def __contains__(self, item: Hashable) -> bool:
        until = self._until.get(item)
        if until is None:
            return False
        if until > self.clock():
            return True
        del self._until[item]
        return False

    def discard(self, item: Hashable) -> None:
        self._until.pop(item, None)

    def add(self, item: Hashable) -> None:
        if self.ttl_s <= 0:
            return
        while len(self._until) >= self.size:
            del self._until[next(iter(self._until))]  # insertion order: the oldest
        self._until[item] = self.clock() + self.ttl_s
