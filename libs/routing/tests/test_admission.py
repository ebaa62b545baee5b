"""Admission's wait prediction from heartbeats (pure unit tests; the expected waits are worked out
by hand from the stated policy)."""

from __future__ import annotations

import pytest
from llmlab_common.messages import Heartbeat
from llmlab_routing.admission import predict_wait
from llmlab_routing.state import LiveState

pytestmark = pytest.mark.unit


def hb(wid: str, slots: int, busy: int, queued: int | None, service: float | None, at: float = 0.0) -> Heartbeat:
    return Heartbeat(
        worker_id=wid,
        pool="p",
        engine="vllm",
        models=[],
        max_concurrency=slots,
        in_flight=busy,
        ready=True,
        interval_s=1,
        sent_at=at,
        queued_by_priority=None if queued is None else [queued, 0, 0, 0],
        mean_service_s=service,
    )


def test_a_free_slot_means_no_wait_whatever_the_history() -> None:
    est = predict_wait([hb("a", 4, 3, 0, None)])
    assert est is not None and est.seconds == 0.0


def test_with_every_slot_busy_the_queue_ahead_drains_at_slots_per_service_time() -> None:
    # 2 workers x 1 slot, both busy, 4 waiting, each attempt holds a slot 2 s: a slot frees every
    # second, and this request is the 5th in line: 5 s.
    est = predict_wait([hb("a", 1, 1, 4, 2.0, at=10.0), hb("b", 1, 1, 3, 2.0, at=9.0)])
    assert est is not None and est.seconds == pytest.approx(5.0)
    assert (est.slots, est.busy, est.queued) == (2, 2, 4)  # the latest queue reading counts


def test_service_time_is_weighted_by_each_workers_slots() -> None:
    # 3 slots of 1 s and 1 slot of 5 s: mean 2 s per attempt; 4 busy, none queued: 1 x 2 / 4.
    est = predict_wait([hb("a", 3, 3, 0, 1.0), hb("b", 1, 1, 0, 5.0)])
    assert est is not None and est.seconds == pytest.approx(0.5)


def test_no_evidence_no_prediction() -> None:
    assert predict_wait([]) is None
    assert predict_wait([hb("a", 1, 1, 2, None)]) is None  # full, but nothing served yet
    # An unknown queue length counts as empty, not as a guess.
    est = predict_wait([hb("a", 2, 2, None, 3.0)])
    assert est is not None and est.seconds == pytest.approx(1.5)


def test_live_state_predicts_from_live_ready_workers_only() -> None:
    live = LiveState()
    live.on_heartbeat(hb("a", 1, 1, 1, 4.0), now=0.0)
    gone = hb("b", 8, 0, 1, 4.0)
    live.on_heartbeat(gone, now=-100.0)  # its heartbeat expired long ago: its free slots do not count
    est = live.predicted_wait("p", now=0.5)
    assert est is not None and est.seconds == pytest.approx(8.0)
    assert live.predicted_wait("other", now=0.5) is None


def test_attempts_addressed_to_a_worker_wait_ahead_too() -> None:
    # The router addressed 3 attempts to worker a and 2 to b (their own queues), 1 waits in the
    # pool's: 2 slots busy at 1 s each, this one is 7th in line: 7 x 1 / 2. For priority 1 only
    # b's one of priority 1 is ahead: 2nd in line, 2 x 1 / 2.
    a = hb("a", 1, 1, 1, 1.0).model_copy(update={"addressed_by_priority": [3, 0, 0, 0]})
    b = hb("b", 1, 1, 1, 1.0).model_copy(update={"addressed_by_priority": [1, 1, 0, 0]})
    est = predict_wait([a, b])
    assert est is not None and est.queued == 6 and est.seconds == pytest.approx(3.5)
    high = predict_wait([a, b], priority=1)
    assert high is not None and high.queued == 1 and high.seconds == pytest.approx(1.0)


def test_only_the_queues_of_its_priority_and_above_are_ahead() -> None:
    # 1 slot busy, 2 s an attempt; waiting: 5 free-plan (0), 2 pro (1), 1 enterprise (2).
    w = hb("a", 1, 1, 0, 2.0).model_copy(update={"queued_by_priority": [5, 2, 1, 0]})
    waits = [predict_wait([w], p) for p in range(4)]
    assert [e.seconds if e else None for e in waits] == pytest.approx([18.0, 8.0, 4.0, 2.0])


def test_a_burst_the_heartbeats_have_not_seen_yet_counts_from_the_gateways_own_queue() -> None:
    # The last heartbeat saw 1 slot of 4 busy and nothing queued; since then this gateway published
    # 11 attempts nobody took: 1 + 11 + 1 - 4 = 9 ahead, at 2 s per attempt over 4 slots: 4.5 s.
    w = hb("a", 4, 1, 0, 2.0)
    assert predict_wait([w]) is not None and predict_wait([w]).seconds == 0.0  # type: ignore[union-attr]
    est = predict_wait([w], local_queued=11)
    assert est is not None and est.queued == 11 and est.seconds == pytest.approx(4.5)
    # The heartbeats' reading counts when it is the larger (other gateways' attempts).
    w2 = hb("a", 4, 4, 20, 2.0)
    est2 = predict_wait([w2], local_queued=3)
    assert est2 is not None and est2.queued == 20
