"""Token batches in the gateway's dispatcher: each line fenced and ordered as a lone message is
(pure: the NATS client is not used on this path)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, cast

import pytest
from llmlab_common.messages import StreamStarted, TokenChunk, join_batch
from llmlab_common.metrics import Metrics
from llmlab_common.subjects import Topology
from llmlab_gateway.dispatch import NatsDispatcher, _Inflight
from llmlab_gateway.service import StreamGap
from llmlab_routing.state import LiveState

pytestmark = pytest.mark.unit

T = Topology("ns")


@dataclass
class FakeMsg:
    subject: str
    data: bytes


async def _dropped(subject: str, payload: bytes) -> None:
    return None


def _dispatcher() -> NatsDispatcher:
    return NatsDispatcher(
        cast(Any, SimpleNamespace(is_connected=True, publish=_dropped)),  # the sweeper reads is_connected
        cast(Any, None),
        T,
        "gw1",
        LiveState(),
        Metrics("llmlab"),
        discovery_grace_s=0,
        sweep_interval_s=1,
    )


def _started(rid: str, attempt: int) -> bytes:
    return (
        StreamStarted(request_id=rid, attempt=attempt, seq=0, worker_id="w", engine="vllm", nats_queue_s=0.0)
        .model_dump_json()
        .encode()
    )


def _chunk(rid: str, attempt: int, seq: int, text: str) -> bytes:
    return TokenChunk(request_id=rid, attempt=attempt, seq=seq, text=text, token_times=[0.1]).model_dump_json().encode()


async def test_a_batch_feeds_each_request_in_order_and_drops_what_a_lone_message_would() -> None:
    d = _dispatcher()
    r1, r2 = _Inflight(attempt=1), _Inflight(attempt=2)
    d.inflight.update({"r1": r1, "r2": r2})
    batch = join_batch(
        [
            _started("r1", 1),
            _chunk("r2", 1, 0, "stale attempt"),
            _started("r2", 2),
            _chunk("r1", 1, 1, "a"),
            _chunk("r9", 1, 0, "unknown request"),
            b"{not json",
            _chunk("r2", 2, 1, "b"),
            _chunk("r1", 1, 3, "after a gap"),
        ]
    )
    await d._on_token(cast(Any, FakeMsg(T.token_batch_subject("gw1"), batch)))
    got1 = [r1.queue.get_nowait() for _ in range(r1.queue.qsize())]
    got2 = [r2.queue.get_nowait() for _ in range(r2.queue.qsize())]
    assert [type(m).__name__ for m in got1] == ["StreamStarted", "TokenChunk", "StreamGap"]
    assert isinstance(got1[1], TokenChunk) and got1[1].text == "a"
    assert got1[2] == StreamGap(1, 2, 3)
    assert [type(m).__name__ for m in got2] == ["StreamStarted", "TokenChunk"]
    assert isinstance(got2[1], TokenChunk) and got2[1].text == "b"
    assert r1.worker_id == "w" and r2.worker_id == "w"
    assert d.stale._value.get() == 2  # type: ignore[attr-defined]  # the stale attempt and the unknown request


async def test_a_lone_message_on_its_request_subject_still_works() -> None:
    d = _dispatcher()
    r1 = _Inflight(attempt=1)
    d.inflight["r1"] = r1
    await d._on_token(cast(Any, FakeMsg(T.token_subject("gw1", "r1"), _started("r1", 1))))
    assert isinstance(r1.queue.get_nowait(), StreamStarted)


class FakeJS:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail

    async def publish(self, *_: Any, **__: Any) -> None:
        if self.fail:
            raise TimeoutError("no ack")


class FakeNC:
    max_payload = 1 << 20


def _queued(m: Metrics) -> dict[tuple[str, str], float]:
    out = {}
    for fam in m.registry.collect():
        if fam.name == "llmlab_gateway_queued_attempts":
            out = {(s.labels["pool"], s.labels["priority"]): s.value for s in fam.samples}
    return out


async def test_queued_attempts_count_what_no_worker_took_by_pool_and_priority() -> None:
    """Catches: an attempt counted as queued after a worker took it, after the gateway gave up on
    it (fallback, release) or after its publish failed: the per-priority queue depth would only grow."""
    from llmlab_common.messages import InferenceRequest, RouteTarget, SamplingParams

    metrics = Metrics("llmlab")
    d = NatsDispatcher(
        cast(Any, FakeNC()),
        cast(Any, FakeJS()),
        T,
        "gw1",
        LiveState(),
        metrics,
        discovery_grace_s=0,
        sweep_interval_s=1,
    )

    def req(rid: str, attempt: int, priority: int, pool: str = "gpu-vllm") -> InferenceRequest:
        return InferenceRequest(
            request_id=rid, attempt=attempt, gateway_id="gw1", reply_subject="", endpoint="chat", model="m",
            deployment="d", pool=pool, params=SamplingParams(max_tokens=4), priority=priority,
            created_at=0, dispatched_at=0, start_deadline=1e12, deadline=1e12,
        )  # fmt: skip

    target = RouteTarget(deployment="d", pool="gpu-vllm")
    await d.dispatch(req("a", 1, 2), target)
    await d.dispatch(req("b", 1, 2), target)
    await d.dispatch(req("c", 1, 0), target)
    assert _queued(metrics) == {("gpu-vllm", "2"): 2, ("gpu-vllm", "0"): 1}
    await d._on_token(cast(Any, FakeMsg(T.token_subject("gw1", "a"), _started("a", 1))))  # taken
    await d.dispatch(req("b", 2, 2, pool="gpu-sglang"), RouteTarget(deployment="d", pool="gpu-sglang"))  # fallback
    d.release("c")  # the gateway gave up on it
    assert _queued(metrics) == {("gpu-vllm", "2"): 0, ("gpu-vllm", "0"): 0, ("gpu-sglang", "2"): 1}
    await d._on_token(cast(Any, FakeMsg(T.token_subject("gw1", "b"), _started("b", 2))))
    d.release("a")
    d.release("b")  # released after being taken: not counted down twice
    assert set(_queued(metrics).values()) == {0}
    d.js = cast(Any, FakeJS(fail=True))
    with pytest.raises(TimeoutError):
        await d.dispatch(req("e", 1, 1), target)
    assert _queued(metrics)[("gpu-vllm", "1")] == 0


def _swept_dispatcher(interval: float) -> NatsDispatcher:
    d = _dispatcher()
    d._sweep_interval = interval
    return d


@pytest.mark.timeout(5)  # a wait nothing ends would hang here (it takes about 0.5 s)
async def test_a_long_wait_is_timed_by_the_sweeper_and_a_short_one_by_a_timer() -> None:
    """The per-token idle wait has no timer of its own: the sweeper ends it within an interval of
    its deadline. Catches a wait the sweeper never ends (a stream that hangs on a silent worker),
    one it ends early, and an expiry left in the queue that a later wait takes for a timeout."""
    import asyncio

    from llmlab_gateway.dispatch import _EXPIRED, _Handle

    d = _swept_dispatcher(0.02)
    sweeper = asyncio.create_task(d._sweep_loop())
    try:
        inf = _Inflight(attempt=1)
        d.inflight["r1"] = inf
        handle = _Handle(inf, d._sweep_interval)
        t0 = time.monotonic()
        assert await handle.next(0.3) is None  # 0.3 s >= 10 intervals: the sweeper's
        waited = time.monotonic() - t0
        assert 0.3 <= waited < 0.3 + 0.3, waited  # 15 intervals: room for a loaded machine (make test's phase 1)
        # A message that arrives in time is returned, and the deadline is cleared after it.
        asyncio.get_running_loop().call_later(0.05, inf.queue.put_nowait, "tok")
        assert await handle.next(0.3) == "tok"
        assert inf.deadline == float("inf")
        # An expiry left behind (its reader was cancelled) is not a timeout of the next wait.
        inf.queue.put_nowait(_EXPIRED)
        inf.queue.put_nowait("next")
        assert await handle.next(0.3) == "next"
        inf.queue.put_nowait(_EXPIRED)
        assert handle.next_nowait() is None
        # Below ten intervals a timer ends the wait, without the sweeper.
        sweeper.cancel()
        t0 = time.monotonic()
        assert await handle.next(0.1) is None
        assert time.monotonic() - t0 < 0.6  # no timer: it would hang until the test's timeout
    finally:
        sweeper.cancel()


async def test_a_reconnection_to_nats_starts_discovery_again() -> None:
    """Catches: a gateway back from a NATS outage answering 503 "no live worker" to every request
    until the workers' next heartbeats (it heard none while cut off): the first request after the
    reconnection waits the discovery grace, as one right after the gateway's start does."""
    nc = SimpleNamespace(is_connected=True)
    d = NatsDispatcher(cast(Any, nc), cast(Any, None), T, "gw1", LiveState(), Metrics("llmlab"), 0.3, 1)
    d._started_at -= 10  # long up
    assert d.discovery_done()
    nc.is_connected = False
    d._note_reconnection(time.monotonic())  # the sweeper sees the outage
    assert d.discovery_done()
    nc.is_connected = True
    t0 = time.monotonic()
    await d.wait_discovery()  # a request found no live worker before the sweeper saw the reconnection
    assert 0.25 <= time.monotonic() - t0 < 1.0
    await d.wait_discovery()  # once: the grace has passed
    assert d.discovery_done() and time.monotonic() - t0 < 1.0


async def test_a_stream_nobody_reads_is_cancelled_again_at_most_once_a_second() -> None:
    """Catches: a lost cancel (core NATS, at most once) leaving an engine generating for nobody
    until the answer's end: the gateway cancels again what keeps streaming to it unread."""
    import asyncio

    from llmlab_common.messages import CancelRequest

    sent: list[CancelRequest] = []

    async def publish(subject: str, payload: bytes) -> None:
        assert subject == T.cancel_subject
        sent.append(CancelRequest.model_validate_json(payload))

    d = _dispatcher()
    d.nc = cast(Any, SimpleNamespace(is_connected=True, publish=publish))
    d.inflight["live"] = _Inflight(attempt=2)
    batch = join_batch([_chunk("gone", 1, 5, "a"), _chunk("live", 1, 9, "old attempt"), _chunk("gone", 1, 6, "b")])
    await d._on_token(cast(Any, FakeMsg(T.token_batch_subject("gw1"), batch)))
    await d._on_token(cast(Any, FakeMsg(T.token_subject("gw1", "gone2"), _chunk("gone2", 3, 1, "c"))))
    await asyncio.sleep(0)
    assert sorted((c.request_id, c.attempt, c.reason) for c in sent) == [
        ("gone", 1, "stale_stream"),
        ("gone2", None, "stale_stream"),
        ("live", 1, "stale_stream"),  # the old attempt only, never the one the client reads
    ]
    # Within the second: counted, not cancelled again; after it, cancelled again.
    await d._on_token(cast(Any, FakeMsg(T.token_batch_subject("gw1"), batch)))
    await asyncio.sleep(0)
    assert len(sent) == 3
    d._recancel_at = {k: time.monotonic() - 1 for k in d._recancel_at}
    await d._on_token(cast(Any, FakeMsg(T.token_batch_subject("gw1"), batch)))
    await asyncio.sleep(0)
    assert len(sent) == 5


@pytest.mark.parametrize(
    ("ready", "draining", "lost"), [(False, False, True), (True, True, True), (True, False, False)]
)
async def test_an_attempt_addressed_to_a_worker_that_takes_nothing_is_lost_at_once(
    ready: bool, draining: bool, lost: bool
) -> None:
    """Catches: a request addressed to a worker whose engine died (its heartbeat says not ready) waiting in
    that worker's queue until the queue timeout (make local-demo: 429 after 30 s) instead of moving on, as
    one addressed to a draining worker does; and a ready worker's untaken attempt reported lost."""
    import asyncio

    from llmlab_gateway.service import WorkerLost
    from llmlab_testkit.routing import heartbeat

    d = _swept_dispatcher(0.02)
    hb = heartbeat("w-a", "local-a", interval=60).model_copy(update={"ready": ready, "draining": draining})
    d.registry.on_heartbeat(hb)
    sweeper = asyncio.create_task(d._sweep_loop())
    try:
        inf = _Inflight(attempt=1, target_worker="w-a")
        d.inflight["r1"] = inf
        await asyncio.sleep(0.1)  # a few sweeps
        got = inf.queue.get_nowait() if not inf.queue.empty() else None
        if lost:
            assert isinstance(got, WorkerLost) and got.worker_id == "w-a", got
        else:
            assert got is None
    finally:
        sweeper.cancel()
