"""The autoscaling policy (llmlab_lab.autoscale): read from the manifest KEDA applies, and the
HPA's replica arithmetic with its behaviour rules, against a hand-worked sequence."""

from __future__ import annotations

import pytest
from llmlab_lab.autoscale import Autoscaler, Policy, load_policy, worker_slots

pytestmark = pytest.mark.unit


def test_the_policy_is_the_one_the_manifest_gives_keda() -> None:
    p = load_policy("worker-vllm")
    assert (p.threshold, p.min_replicas, p.max_replicas, p.polling_s) == (384, 1, 8, 10)
    assert (p.up_stabilization_s, p.up_pods, p.up_period_s) == (0, 2, 60)
    assert (p.down_stabilization_s, p.down_pods, p.down_period_s) == (600, 1, 300)
    assert 'pool="gpu-vllm"' in p.query and "llmlab_router_queue_pending_messages" in p.query
    assert worker_slots() == 512
    half = p.scaled(0.5, threshold=3)
    assert (half.threshold, half.polling_s, half.up_period_s, half.down_stabilization_s) == (3, 5, 30, 300)


POLICY = Policy("t", "q", 10, 1, 8, 1, 0, 2, 60, 600, 1, 300)


def test_scale_up_at_once_but_two_pods_per_minute_then_down_slowly_after_the_window() -> None:
    """Catches: a scale-up past the pods-per-period limit, a scale-down inside the stabilisation
    window or faster than one pod per period, a missing metric taken as zero."""
    a = Autoscaler(POLICY)
    steps = [
        # (time, backlog, current) -> expected: worked by hand from the HPA rules in the docstring
        ((0, 55, 1), 3),  # wants ceil(5.5) = 6; at most 1 + 2 within the minute
        ((30, 55, 3), 3),  # 60 s ago it had 1: still 1 + 2
        ((61, 55, 3), 5),  # 60 s ago it had 3
        ((122, 55, 5), 6),  # wants 6, allowed 7
        ((130, None, 6), 6),  # Prometheus empty: nothing changes
        ((200, 0, 6), 6),  # wants 1, but 6 was recommended within the last 600 s
        ((722, 0, 6), 6),  # the 6 of t=122 is still in the window
        ((723, 0, 6), 5),  # out of the window: one pod per 300 s
        ((800, 0, 5), 5),
        ((1024, 0, 5), 4),  # 300 s after the last step down
        # A new burst: up at once, two pods on top of the 5 it had 60 s ago (Kubernetes counts
        # from the period's start: 4 now, plus the one removed at t=1024), so 7.
        ((1030, 95, 4), 7),
        ((1031, 200, 7), 7),  # max 8, but the minute's pods are spent
        ((1091, 200, 7), 8),
        ((1200, 500, 8), 8),  # never past the maximum
    ]
    for (t, metric, current), expected in steps:
        assert a.desired(t, metric, current) == expected, (t, metric, current)


def test_never_below_the_minimum() -> None:
    a = Autoscaler(Policy("t", "q", 10, 2, 8, 1, 0, 2, 60, 0, 4, 1))
    assert a.desired(0, 0, 4) == 2
    assert a.desired(10, 0, 2) == 2
