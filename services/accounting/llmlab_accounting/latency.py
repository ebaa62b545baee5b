"""Where one request's time went, from its accounting rows (pure: no ClickHouse, no HTTP).

Every phase is measured from its own pair of timestamps, where it happens (none is what is left of
another figure), and the sum is checked against the request's time measured independently:
``ended_at - created_at``, the worker's wall clock when the attempt ended minus the gateway's when
it accepted the request (``WALL_SQL``; both millisecond precision in the rows).

* gateway, carried on every attempt: ``parse_s`` (accepted → admission started: read, parse and
  validate the body), ``auth_s`` (authenticate + reserve), ``route_s`` (routing decision),
  ``prep_s`` (routing decided → the first attempt built and published), and for a later attempt
  the time the earlier ones took: this attempt's ``dispatch_offset_s`` minus the first's
  (``first_dispatch_offset_s``), both stamped when each was published;
* NATS: ``nats_queue_s`` (published → a worker took it);
* worker: ``intake_s`` (took it → engine call sent), ``ttft_s`` (engine call → first token, split
  into ``engine_queue_s`` and prefill), ``decode_s`` (first → last token), ``finish_s`` (last token
  → terminal message). ``engine_queue_s`` is the engine's own figure for the request where it
  reports one (``engine_queue_method = 'engine'``: worker-vllm's in-process mode), else the
  engine's mean queue time over the last heartbeat window (``'window_mean'``, an estimate).

Not in the rows: the gateway's last hop after the worker's terminal message (NATS → SSE write),
which the gateway's ``llmlab_gateway_e2e_seconds`` histogram covers in aggregate. Wall clocks
differ between hosts: ``nats_queue_s`` and the total span the gateway's and the worker's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# Accepted → the attempt's end, in SQL over the ``attempts`` view: the independent total (what
# :attr:`LatencySplit.total_s` is, and what ``explain --slowest`` orders by).
WALL_SQL = "(toUnixTimestamp64Milli(ended_at) - toUnixTimestamp64Milli(created_at)) / 1000"

# The columns of the ``attempts`` view the split reads, in this order.
COLUMNS = (
    "attempt",
    "source",
    "outcome",
    "error_code",
    "worker_id",
    "deployment",
    f"{WALL_SQL} AS wall_s",
    "parse_s",
    "auth_s",
    "route_s",
    "prep_s",
    "first_dispatch_offset_s",
    "dispatch_offset_s",
    "nats_queue_s",
    "intake_s",
    "engine_queue_s",
    "engine_queue_method",
    "ttft_s",
    "prefill_s",
    "decode_s",
    "finish_s",
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
    total_s: float | None  # accepted → the attempt's end, measured apart from the phases
    phases: list[Phase]
    earlier: list[str] = field(default_factory=list)  # one line per attempt before the answering one

    @property
    def accounted_s(self) -> float:
        return sum(p.seconds for p in self.phases if p.seconds is not None)

    @property
    def unmeasured(self) -> list[str]:
        """Phases with no figure for this request."""
        return [p.name for p in self.phases if p.seconds is None]


def _f(row: Mapping[str, Any], key: str) -> float | None:
    v = row.get(key)
    return None if v is None else float(v)


def split(request_id: str, rows: Sequence[Mapping[str, Any]]) -> LatencySplit | None:
    """The split of one request from its attempt rows (one per attempt); None without rows."""
    if not rows:
        return None
    ordered = sorted(rows, key=lambda r: int(r["attempt"]))
    completed = [r for r in ordered if r["outcome"] == "completed"]
    ans = completed[-1] if completed else ordered[-1]
    n = int(ans["attempt"])
    ttft, queue = _f(ans, "ttft_s"), _f(ans, "engine_queue_s")
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
    phases = [
        Phase("gateway: parse + validate", _f(ans, "parse_s"), "accepted → admission started"),
        Phase("gateway: auth + reserve", _f(ans, "auth_s")),
        Phase("gateway: route", _f(ans, "route_s")),
        Phase("gateway: build + publish", _f(ans, "prep_s"), "routing decided → first attempt published"),
    ]
    if n > 1:
        this, first = _f(ans, "dispatch_offset_s"), _f(ans, "first_dispatch_offset_s")
        retries = None if this is None or first is None else max(0.0, this - first)
        phases.append(Phase("retries (earlier attempts)", retries, "first attempt published → this one published"))
    phases += [
        Phase("NATS queue", _f(ans, "nats_queue_s"), "published → a worker took it"),
        Phase("worker intake", _f(ans, "intake_s"), "took it → engine call sent"),
        Phase("engine queue", queue, queue_note),
        Phase("prefill", prefill, prefill_note),
        Phase("decode", _f(ans, "decode_s"), "first → last token"),
        Phase("worker: terminal message", _f(ans, "finish_s"), "last token → terminal message"),
    ]
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
        total_s=_f(ans, "wall_s"),
        phases=phases,
        earlier=earlier,
    )


def render(s: LatencySplit, width: int = 40) -> str:
    """A text table: phase, milliseconds, share of the total, a bar."""
    total = s.total_s or s.accounted_s or 1e-9
    lines = [
        f"request {s.request_id}: {s.outcome} on {s.deployment}, attempt {s.answering_attempt} of {s.attempts}, "
        f"{s.completion_tokens} completion tokens",
        "total (accepted → the worker's terminal message, measured apart from the phases): "
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
