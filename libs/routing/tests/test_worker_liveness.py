"""The gateway's view of worker liveness from heartbeats (pure unit tests)."""

from __future__ import annotations

import time

import pytest
from llmlab_common.messages import HEARTBEAT_MISSES, Heartbeat
from llmlab_routing.state import LiveState

pytestmark = pytest.mark.unit


def beat(worker_id: str, instance_id: str = "", interval_s: float = 1.0) -> Heartbeat:
    return Heartbeat(
        worker_id=worker_id,
        pool="gpu-vllm",
        engine="vllm",
        models=[],
        max_concurrency=4,
        in_flight=0,
        ready=True,
        interval_s=interval_s,
        sent_at=time.time(),
        instance_id=instance_id,
    )


def test_a_worker_restarted_under_the_same_id_does_not_carry_on_its_predecessor_s_attempts() -> None:
    reg = LiveState()
    reg.on_heartbeat(beat("w-1", "a1"))
    assert reg.alive("w-1") and reg.alive("w-1", "a1")
    # The pod restarts as w-1 and beats before the old process's heartbeats would have expired.
    reg.on_heartbeat(beat("w-1", "b2"))
    assert reg.alive("w-1")  # the worker is up (it can take new attempts) ...
    assert not reg.alive("w-1", "a1")  # ... but what the killed process took is lost
    assert reg.alive("w-1", "b2")


def test_liveness_expires_after_the_missed_beats_and_tolerates_senders_without_instance_ids() -> None:
    reg = LiveState()
    reg.on_heartbeat(beat("w-2", interval_s=0.01))  # a worker of an older version: no instance id
    assert reg.alive("w-2", "anything") and reg.ttl("w-2") == pytest.approx(HEARTBEAT_MISSES * 0.01)
    time.sleep(HEARTBEAT_MISSES * 0.01 + 0.02)
    assert not reg.alive("w-2") and not reg.alive("nobody")
