"""Where one request's time went, from its accounting rows (pure: no ClickHouse, no HTTP).

The answering attempt's row carries every phase, each measured where it happens:

* gateway: ``auth_s`` (authenticate + reserve), ``route_s`` (routing decision), and
  ``dispatch_offset_s`` (accepted → this attempt published: admission, the attempts before it,
  and the gateway's own work of building and publishing it);
* NATS: ``nats_queue_s`` (published → a worker took it);
* worker and engine: ``e2e_s`` (taken → terminal message) = worker intake + ``ttft_s`` (engine
  call → first token = ``engine_queue_s`` + prefill) + ``decode_s`` (first → last token) + the
  terminal message's publish. ``engine_queue_s`` is the engine's own figure for the request where
  it reports one (``engine_queue_method = 'engine'``: worker-vllm's in-process mode), else the
  engine's mean queue time over the last heartbeat window (``'window_mean'``, an estimate).

Not in the rows: the gateway's last hop after the worker's terminal message (NATS → SSE write),
which the gateway's ``llmlab_gateway_e2e_seconds`` histogram covers in aggregate. Wall clocks
differ between hosts: ``dispatch_offset_s`` is the gateway's clock, ``nats_queue_s`` spans the
gateway's and the worker's, the rest is the worker's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# Accepted -> the worker's terminal message, in SQL over the ``attempts`` view (what
# :attr:`LatencySplit.total_s` is from one row).
TOTAL_SQL = "dispatch_offset_s + nats_queue_s + e2e_s"

# The columns of the ``attempts`` view the split reads, in this order.
COLUMNS = (
    "attempt",
    "source",
    "outcome",
    "error_code",
    "worker_id",
    "deployment",
    "created_at",
    "ended_at",
    "auth_s",
    "route_s",
    "dispatch_offset_s",
    "nats_queue_s",
    "engine_queue_s",
    "engine_queue_method",
    "ttft_s",
    "prefill_s",
    "decode_s",
    "e2e_s",
    "completion_tokens",
)


@dataclass(frozen=True)
class Phase:
    name: str
    seconds: float | None  # None: not measured for this request
    note: str = ""


@dataclass(frozen=True)
class LatencySplit:
    request_id: str
    attempts: int
    answering_attempt: int
    deployment: str
    outcome: str
    completion_tokens: int
    total_s: float | None  # accepted → the worker's terminal message
    phases: list[Phase]
    earlier: list[str] = field(default_factory=list)  # one line per attempt before the answering one

    @property
    def accounted_s(self) -> float:
        return sum(p.seconds for p in self.phases if p.seconds is not None)


def _f(row: Mapping[str, Any], key: str) -> float | None:
    v = row.get(key)
    return None if v is None else float(v)


def _minus(a: float | None, *bs: float | None) -> float | None:
    if a is None:
        return None
    return max(0.0, a - sum(b for b in bs if b is not None))


def split(request_id: str, rows: Sequence[Mapping[str, Any]]) -> LatencySplit | None:
    """The split of one request from its attempt rows (one per attempt); None without rows."""
    if not rows:
        return None
    ordered = sorted(rows, key=lambda r: int(r["attempt"]))
    completed = [r for r in ordered if r["outcome"] == "completed"]
    ans = completed[-1] if completed else ordered[-1]
    n = int(ans["attempt"])
    auth, route = _f(ans, "auth_s"), _f(ans, "route_s")
    offset = _f(ans, "dispatch_offset_s")
    nats, e2e = _f(ans, "nats_queue_s"), _f(ans, "e2e_s")
    ttft, decode = _f(ans, "ttft_s"), _f(ans, "decode_s")
    queue = _f(ans, "engine_queue_s")
    prefill = _f(ans, "prefill_s")
    if prefill is None and ttft is not None and queue is not None:
        prefill = max(0.0, ttft - queue)
    if queue is None and ttft is not None:
        prefill_note = "engine queue + prefill (the engine's queue time is not known)"
        prefill = ttft
    else:
        prefill_note = "first token minus the engine queue"
    method = ans.get("engine_queue_method")
    queue_note = {
        "engine": "reported by the engine for this request",
        "window_mean": "estimate: the engine's mean queue time over the last heartbeat window",
    }.get(str(method), "not reported")
    admission_rest = _minus(offset, auth, route)
    phases = [
        Phase("gateway: auth + reserve", auth),
        Phase("gateway: route", route),
        Phase(
            "retries (earlier attempts)" if n > 1 else "gateway: other admission work",
            admission_rest,
            "accepted → this attempt published, less auth and route"
            if n > 1
            else "prompt estimate, building and publishing the attempt",
        ),
        Phase("NATS queue", nats, "published → a worker took it"),
        Phase("worker intake + terminal publish", _minus(e2e, ttft, decode), "worker time outside the engine call"),
        Phase("engine queue", queue, queue_note),
        Phase("prefill", prefill, prefill_note),
        Phase("decode", decode, "first → last token"),
    ]
    total = None if offset is None or nats is None or e2e is None else offset + nats + e2e
    earlier = [
        f"attempt {int(r['attempt'])}: {r['outcome']}"
        + (f" ({r['error_code']})" if r.get("error_code") else "")
        + f" on {r['deployment']}"
        + (f"/{r['worker_id']}" if r.get("worker_id") else "")
        for r in ordered
        if int(r["attempt"]) < n
    ]
    return LatencySplit(
        request_id=request_id,
        attempts=len(ordered),
        answering_attempt=n,
        deployment=str(ans["deployment"]),
        outcome=str(ans["outcome"]),
        completion_tokens=int(ans.get("completion_tokens") or 0),
        total_s=total,
        phases=phases,
        earlier=earlier,
    )


def render(s: LatencySplit, width: int = 40) -> str:
    """A text table: phase, milliseconds, share of the total, a bar."""
    total = s.total_s or s.accounted_s or 1e-9
    lines = [
        f"request {s.request_id}: {s.outcome} on {s.deployment}, attempt {s.answering_attempt} of {s.attempts}, "
        f"{s.completion_tokens} completion tokens",
        "total (accepted → last token sent by the worker): "
        + ("unknown" if s.total_s is None else f"{s.total_s * 1000:.1f} ms"),
        "",
        f"{'phase':<34} {'ms':>10} {'share':>6}  ",
    ]
    for p in s.phases:
        if p.seconds is None:
            lines.append(f"{p.name:<34} {'—':>10} {'':>6}  {p.note}")
            continue
        share = p.seconds / total
        bar = "█" * max(0, round(share * width))
        lines.append(f"{p.name:<34} {p.seconds * 1000:>10.1f} {share:>6.1%}  {bar} {p.note}".rstrip())
    if s.total_s is not None:
        gap = s.total_s - s.accounted_s
        lines.append(f"{'(not attributed)':<34} {gap * 1000:>10.1f} {gap / total:>6.1%}")
    lines.append("not in the rows: the gateway's last hop after the terminal message (see llmlab_gateway_e2e_seconds)")
    if s.earlier:
        lines += ["", "earlier attempts:", *("  " + e for e in s.earlier)]
    return "\n".join(lines)
