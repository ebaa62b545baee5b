"""Admission by predicted wait: how long a request sent to a pool now would wait before a worker
takes it, from the pool's live workers' last heartbeats. The gateway refuses at once (429 with
``Retry-After`` = the prediction) when it exceeds the request's SLO class bound, instead of letting
the request wait out the bound and refusing it then.

The policy, stated: a request is ``ahead`` of this one when it holds or waits for a slot of the
pool (in the pool's queue of its priority or a higher one, or in a worker's own queue when the
router addressed it to one). With
``S`` slots (the workers' ``max_concurrency``) all busy, a slot frees every ``service / S`` seconds
on average, where ``service`` is the workers' mean time an attempt held a slot lately. So the wait
is ``(busy + queued + 1 - S) * service / S``, and 0 while a slot is free. Where the heartbeats do
not tell (no live worker, no attempt served yet) there is no prediction and the request is
admitted: admission never refuses without evidence."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from llmlab_common.messages import Heartbeat


@dataclass(frozen=True)
class WaitEstimate:
    seconds: float
    slots: int  # the pool's live, ready workers' concurrency
    busy: int  # attempts they hold
    queued: int  # attempts waiting: the pool's queue (the latest reading) and each worker's own
    service_s: float | None  # mean time an attempt held a slot (None: no attempt served yet)


def predict_wait(hbs: Sequence[Heartbeat], priority: int = 0, local_queued: int = 0) -> WaitEstimate | None:
    """The wait a request of plan ``priority`` sent now would have before a worker of these
    heartbeats takes it, or None when they do not tell. Workers take the higher priorities' queues
    first, so only the attempts queued at ``priority`` or above are ahead of it. ``local_queued``:
    attempts the caller (a gateway) published there that no worker took yet; the heartbeats count
    them only from their next reading, so the larger of the two counts (a burst inside one heartbeat
    interval is seen at once)."""
    if not hbs:
        return None
    slots = sum(h.max_concurrency for h in hbs)
    busy = sum(h.in_flight for h in hbs)
    readings = [h for h in hbs if h.queued_by_priority is not None]
    # Every worker reads the pool's queues, each at its own moment: the latest reading counts;
    # attempts addressed to one worker (the router's worker choice) wait in that worker's queues.
    latest = max(readings, key=lambda h: h.sent_at) if readings else None
    queued = sum(latest.queued_by_priority[priority:]) if latest and latest.queued_by_priority else 0
    queued += sum(sum(h.addressed_by_priority[priority:]) for h in hbs if h.addressed_by_priority)
    queued = max(queued, local_queued)
    timed = [h for h in hbs if h.mean_service_s is not None]
    service = (
        sum((h.mean_service_s or 0.0) * h.max_concurrency for h in timed) / sum(h.max_concurrency for h in timed)
        if timed and sum(h.max_concurrency for h in timed) > 0
        else None
    )
    ahead = busy + queued + 1 - slots
    if ahead <= 0:
        return WaitEstimate(0.0, slots, busy, queued, service)
    if service is None or slots <= 0:
        return None
    return WaitEstimate(ahead * service / slots, slots, busy, queued, service)
