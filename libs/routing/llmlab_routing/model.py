"""What one decision reads and writes. :class:`DecisionInputs` is everything :func:`decide` looks at
(request features, constraints, the policy, a snapshot of the cluster, the random seed); it is
logged whole, so a decision can be recomputed from its log record alone (``router explain``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


def _flat(obj: Any) -> dict[str, Any]:
    """A slots dataclass of scalars as a dict (much cheaper than ``asdict``'s deep copy)."""
    return {name: getattr(obj, name) for name in obj.__slots__}


@dataclass(slots=True)
class WorkerView:
    worker_id: str
    in_flight: int  # what it runs + what it queues + what the router sent since its last heartbeat
    max_concurrency: int
    kv_cache_usage: float | None = None
    prefix_match: int = 0  # how many of the request's leading blocks were last routed to this worker
    queued: int = 0  # waiting in the engine, plus what the worker cannot start yet (beyond its slots)

    @property
    def load(self) -> float:
        return self.in_flight / max(1, self.max_concurrency)


WORKER_FIELDS = ("worker_id", "in_flight", "max_concurrency", "kv_cache_usage", "prefix_match", "queued")


@dataclass(slots=True)
class DeploymentView:
    id: str
    model: str
    pool: str
    engine: str
    pipeline: str
    quality: float
    max_context: int
    supports_tools: bool
    input_usd_per_mtok: float
    output_usd_per_mtok: float
    ttft_p95_s: float
    itl_p95_s: float
    latency_source: str  # "prior" (catalog) or "observed" (windowed p95 of completed requests)
    failure_rate: float = 0.0  # failed / finished attempts in the stats window
    failure_samples: int = 0
    rr_cursor: int = 0  # round-robin position (router state, logged so the choice replays)
    workers: list[WorkerView] = field(default_factory=list)
    # load + queued of the least-pressed worker; derived from ``workers`` (computed once, not logged)
    pressure: float = field(default=0.0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.pressure = min((w.load + w.queued for w in self.workers), default=0.0)

    # -- estimates every plug-in shares (the same numbers for a filter and a scorer) -------------
    def min_pressure(self) -> float:
        return self.pressure

    def est_ttft_s(self) -> float:
        """TTFT p95 scaled by the least-pressed worker: a full worker doubles it, and each request
        queued ahead adds about one more (it must be prefilled first). Observed p95s lag a queue
        that is building; counting the queue keeps a filling deployment from looking fast."""
        return self.ttft_p95_s * (1.0 + self.min_pressure())

    def est_e2e_s(self, output_tokens: int) -> float:
        return self.est_ttft_s() + max(0, output_tokens - 1) * self.itl_p95_s

    def est_cost_usd(self, prompt_tokens: int, output_tokens: int) -> float:
        return (prompt_tokens * self.input_usd_per_mtok + output_tokens * self.output_usd_per_mtok) / 1e6


@dataclass(slots=True)
class Constraints:
    plan: str
    slo_class: str
    slo_ttft_s: float | None
    slo_tpot_s: float | None
    slo_e2e_s: float | None
    quality_floor: float  # hard: max(plan floor, request floor)
    difficulty_floor: float  # soft: relaxed when nothing meets it
    cost_cap_usd: float  # hard: min(plan cap, request cap)


@dataclass(slots=True)
class DecisionInputs:
    request_id: str
    model: str
    prompt_tokens: int
    max_output_tokens: int
    difficulty: float
    difficulty_class: str
    length_class: str
    needs_tools: bool
    prefix_blocks: int
    prefix_key: str  # hash of the first block ("" without one): the home of a new prefix group
    constraints: Constraints
    policy: str
    policy_version: str
    filters: list[str]
    weights: dict[str, float]
    picker: str
    max_chain: int
    replica_retries: int
    load_bound: float
    seed: int
    deployments: list[DeploymentView]
    # the pipeline the request is made for (features.request_class); defaulted: records logged before it replay
    request_class: str = "latency"

    def to_json(self) -> dict[str, Any]:
        out = _flat(self)
        out["constraints"] = _flat(self.constraints)
        out["filters"] = list(self.filters)
        out["weights"] = dict(self.weights)
        deps = []
        for d in self.deployments:
            dd = _flat(d)
            del dd["pressure"]
            # Workers as rows under one header: a third of the bytes of one dict per worker.
            dd["workers"] = [[getattr(w, f) for f in WORKER_FIELDS] for w in d.workers]
            deps.append(dd)
        out["deployments"] = deps
        out["worker_fields"] = list(WORKER_FIELDS)
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> DecisionInputs:
        d = dict(d)
        fields = d.pop("worker_fields", WORKER_FIELDS)
        d["constraints"] = Constraints(**d["constraints"])
        deps = []
        for dep in d["deployments"]:
            dep = dict(dep)
            dep["workers"] = [
                WorkerView(**w) if isinstance(w, dict) else WorkerView(**dict(zip(fields, w, strict=True)))
                for w in dep["workers"]
            ]
            deps.append(DeploymentView(**dep))
        d["deployments"] = deps
        return cls(**d)


@dataclass(slots=True)
class Target:
    deployment: str
    pool: str
    worker_id: str | None


@dataclass(slots=True)
class Decision:
    targets: list[Target]
    verdicts: dict[str, dict[str, str]]  # deployment -> filter -> "ok" | reason | "relaxed: reason"
    scores: dict[str, dict[str, float]]  # deployment -> scorer -> 0..1, plus "total"
    ranking: list[str]  # surviving deployments, best first
    reason: str
    error_status: int | None = None  # set when nothing can serve the request
    error_code: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
