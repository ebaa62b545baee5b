"""The outbox's batching per gateway (pure: no NATS)."""

from __future__ import annotations

import pytest
from llmlab_common.messages import split_batch
from llmlab_common.subjects import Topology
from llmlab_worker.outbox import Outbox

pytestmark = pytest.mark.unit

T = Topology("ns")


def test_one_drain_sends_one_batch_per_gateway_in_order_and_lone_messages_as_they_are() -> None:
    box = Outbox(batch_subject=T.batch_subject_for)
    box.put(T.token_subject("gw1", "a"), b'{"m":1}')
    box.put(T.token_subject("gw2", "c"), b'{"m":2}')
    box.put(T.token_subject("gw1", "b"), b'{"m":3}')
    box.put("ns.ctl.other", b"x")
    box.put(T.token_subject("gw1", "a"), b'{"m":4}')
    out = box.drain()
    assert ("ns.ctl.other", b"x") in out and (T.token_subject("gw2", "c"), b'{"m":2}') in out
    batches = [(s, p) for s, p in out if s == T.token_batch_subject("gw1")]
    assert batches == [(T.token_batch_subject("gw1"), b'{"m":1}\n{"m":3}\n{"m":4}')]
    assert len(out) == 3
    assert box.drain() == []


def test_batches_are_bounded_and_a_lone_tail_keeps_its_own_subject() -> None:
    box = Outbox(batch_subject=T.batch_subject_for, max_batch_bytes=20)
    for i in range(5):
        box.put(T.token_subject("gw1", f"r{i}"), b"%d" % i * 8)  # 8 bytes each: two per batch
    out = box.drain()
    assert [s for s, _ in out] == [T.token_batch_subject("gw1")] * 2 + [T.token_subject("gw1", "r4")]
    assert [line for _, p in out[:2] for line in split_batch(p)] == [b"%d" % i * 8 for i in range(4)]
    assert out[2][1] == b"4" * 8
