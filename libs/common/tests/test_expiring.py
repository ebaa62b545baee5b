"""The bounded expiring map (and set) under the key caches of the gateway and the budget."""

from __future__ import annotations

import pytest
from llmlab_common.expiring import ExpiringMap, ExpiringSet

pytestmark = pytest.mark.unit


def test_entries_expire_and_the_oldest_put_go_first_past_the_size() -> None:
    now = [0.0]
    m: ExpiringMap[str] = ExpiringMap(ttl_s=10.0, size=2, clock=lambda: now[0])
    m.put("a", "A")
    m.put("b", "B")
    m.put("a", "A2")  # put again: the newest, so "b" is now the oldest
    m.put("c", "C")
    assert (m.get("a"), m.get("b"), m.get("c"), len(m)) == ("A2", None, "C", 2)
    now[0] = 9.9
    assert m.get("a") == "A2"
    now[0] = 10.0
    assert m.get("a") is None and len(m) == 1  # expired, and dropped when read
    m.discard("c")
    assert m.get("c") is None and len(m) == 0


def test_a_set_with_no_ttl_keeps_nothing() -> None:
    s = ExpiringSet(ttl_s=0.0, size=10)
    s.add("k")
    assert "k" not in s and len(s) == 0
    s = ExpiringSet(ttl_s=1.0, size=10)
    s.add("k")
    assert "k" in s and "other" not in s
