"""Policy evaluation in virtual time (every figure is SIMULATED): one seeded request set replayed
through the engine twin once per routing policy, the router deciding every request.

    python -m llmlab_lab.router_eval --out results/router-eval [--seed 7] [--requests 1200]

Experiment 1 (policies): a cluster of four deployments (``configs/router-eval-catalog.yaml``;
twin model/device per deployment in :data:`CLUSTER`), each request routed by
:class:`~llmlab_routing.core.RouterCore` under one policy; the twin workers' live state (running,
waiting, KV use) reaches the router as heartbeats every ``hb_interval_s`` of virtual time, and
completed requests' TTFT/ITL as observed figures. Output: the tutorial's table
policy | success rate | quality | p95 latency | mean cost | SLO violation rate.

Experiment 2 (replica pickers): one deployment of four workers with a small KV cache, a
shared-prefix workload, one run per picker: TTFT p95 and the twin's prefix-cache hit rate.

Definitions (also in the README written beside the results):

* success: the router found a target, the request completed, and the chosen deployment's catalog
  quality >= the quality the request needed (the catalog's difficulty floor for its difficulty
  class, or the stricter floor the request stated);
* quality: mean catalog quality of the chosen deployments (routed requests);
* p95 latency: end-to-end p95 of completed requests (TTFT p95 beside it);
* mean cost: list price per routed request (prompt x input price + generated x output price of the
  chosen deployment's model); GPU-time cost: busy device-seconds x $/h of the device, per request;
* SLO violation rate: share of all requests that miss a limit of their SLO class (catalog
  ``slo_classes``, applied per request as the twin's replay does); a refused request violates.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import logging
import math
import random
import shlex
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from llmlab_common.messages import EngineLoad, Heartbeat, RouteQuery
from llmlab_loadtest.bench_meta import metadata_block
from llmlab_routing.config import RouterCatalog, RoutingConfig, load_router_catalog
from llmlab_routing.core import RouterCore
from llmlab_routing.features import difficulty_class
from llmlab_twin.kvcache import KVConfig, num_gpu_blocks_from_kvcalc
from llmlab_twin.replay import Slo, VirtualSetup, cost_model_for, load_slo_classes, run_virtual
from llmlab_twin.sched import SeqState, StepCostModel, StepScheduler, TwinConfig, TwinSeq
from llmlab_twin.trace import TraceRequest

log = logging.getLogger("llmlab_lab.router_eval")

EVAL_CATALOG = Path("configs") / "router-eval-catalog.yaml"
POLICIES = ("static", "latency-first", "cost-first", "quality-first", "multi-objective", "cache-aware")
PICKERS = ("round-robin", "least-load", "power-of-two", "prefix-affinity")
CHARS_PER_TOKEN = 4  # the router's prefix blocks are characters; the twin's are tokens


# -- the simulated cluster ---------------------------------------------------------------------------


@dataclass(frozen=True)
class TwinDeployment:
    """Which twin model/device stands in for a catalog deployment, and how many workers it has."""

    deployment: str
    twin_model: str
    device: str
    engine: str
    workers: int
    num_gpu_blocks: int | None = None  # None: the twin's KV calculator (0.9 of device memory)


CLUSTER: tuple[TwinDeployment, ...] = (
    TwinDeployment("qwen3-4b-l4", "Qwen3-4B", "L4", "vllm", 3),
    TwinDeployment("llama-8b-h100", "Llama-3.1-8B", "H100-SXM", "vllm", 2),
    TwinDeployment("qwen25-14b-a100", "Qwen2.5-14B", "A100-80GB", "vllm", 2),
    TwinDeployment("qwen3-32b-h200", "Qwen3-32B", "H200", "sglang", 2),
)
MAX_NUM_SEQS = 64  # per worker, also the heartbeat's max_concurrency (the router's load denominator)
MAX_BATCHED_TOKENS = 8192
BLOCK_SIZE = 16


@dataclass(frozen=True)
class Slot:
    """One twin worker as the router sees it."""

    deployment: str
    pool: str
    worker_id: str
    engine: str
    model: str


def build_cluster(
    rc: RouterCatalog, cluster: Sequence[TwinDeployment]
) -> tuple[list[Slot], list[StepCostModel], list[TwinConfig]]:
    deps = {d.id: d for d in rc.catalog.deployments}
    slots: list[Slot] = []
    costs: list[StepCostModel] = []
    cfgs: list[TwinConfig] = []
    for td in cluster:
        d = deps[td.deployment]
        cost = cost_model_for("roofline", td.twin_model, td.device, "bf16", td.engine)
        blocks = td.num_gpu_blocks or num_gpu_blocks_from_kvcalc(td.twin_model, td.device, block_size=BLOCK_SIZE)
        cfg = TwinConfig(
            max_num_seqs=MAX_NUM_SEQS,
            max_num_batched_tokens=MAX_BATCHED_TOKENS,
            kv=KVConfig(num_gpu_blocks=blocks, block_size=BLOCK_SIZE, prefix_caching=True),
        )
        for i in range(td.workers):
            slots.append(Slot(d.id, d.pool, f"{d.id}-w{i}", d.engine, d.model))
            costs.append(cost)
            cfgs.append(cfg)
    return slots, costs, cfgs


# -- the request set ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class EvalRequest:
    trace: TraceRequest
    kind: str  # shared-prefix | long-doc | short-chat
    difficulty: float
    quality_floor: float | None = None  # a stricter floor the request states (hard constraint)
    plan: str = "pro"

    def to_json(self) -> dict[str, Any]:
        d = self.trace.to_json()
        d.update(kind=self.kind, difficulty=self.difficulty, quality_floor=self.quality_floor, plan=self.plan)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> EvalRequest:
        return cls(TraceRequest.from_json(d), d["kind"], float(d["difficulty"]), d.get("quality_floor"), d["plan"])


@dataclass(frozen=True)
class WorkloadSpec:
    requests: int = 1200
    rate_rps: float = 16.0
    groups: int = 4  # shared system prompts
    group_prefix_tokens: tuple[int, ...] = (1536, 2048, 3072, 4096)
    share_prefix: float = 0.40
    share_long: float = 0.15  # the rest are short chats
    share_batch: float = 0.25  # SLO class batch (long documents: twice as likely)
    share_strict: float = 0.05  # requests stating quality_floor = strict_floor
    strict_floor: float = 0.75
    difficulty_mix: tuple[float, float, float] = (0.55, 0.30, 0.15)  # easy, medium, hard


def _difficulty(rng: random.Random, mix: tuple[float, float, float]) -> float:
    u = rng.random()
    lo, hi = (0.0, 0.33) if u < mix[0] else (0.34, 0.66) if u < mix[0] + mix[1] else (0.67, 1.0)
    return round(rng.uniform(lo, hi), 3)


def generate_requests(seed: int, spec: WorkloadSpec | None = None) -> list[EvalRequest]:
    """The mixed request set: Poisson arrivals; shared-prefix chats (several long system prompts),
    long documents, short chats; spread difficulty; both SLO classes. Deterministic for a seed."""
    spec = spec or WorkloadSpec()
    rng = random.Random(seed)
    out: list[EvalRequest] = []
    t = 0.0
    for i in range(spec.requests):
        t += rng.expovariate(spec.rate_rps)
        u = rng.random()
        group: str | None = None
        prefix = 0
        if u < spec.share_prefix:
            kind = "shared-prefix"
            g = rng.randrange(spec.groups)
            group, prefix = f"sys{g}", spec.group_prefix_tokens[g % len(spec.group_prefix_tokens)]
            prompt, output = prefix + rng.randint(32, 400), rng.randint(64, 400)
        elif u < spec.share_prefix + spec.share_long:
            kind = "long-doc"
            prompt, output = rng.randint(6000, 16000), rng.randint(200, 800)
        else:
            kind = "short-chat"
            prompt, output = rng.randint(20, 600), rng.randint(16, 300)
        batch_p = spec.share_batch * (2 if kind == "long-doc" else 1)
        slo = "batch" if rng.random() < batch_p else "interactive"
        diff = _difficulty(rng, spec.difficulty_mix)
        strict = spec.strict_floor if rng.random() < spec.share_strict else None
        tr = TraceRequest(
            t=round(t, 6),  # as the JSONL stores it: a saved set replays identically
            id=f"r{i:05d}",
            prompt_tokens=prompt,
            output_tokens=output,
            slo_class=slo,
            cls=kind,
            prefix_group=group,
            prefix_tokens=prefix,
        )
        out.append(EvalRequest(tr, kind, diff, strict))
    return out


def save_requests(reqs: Sequence[EvalRequest], path: Path, header: dict[str, Any]) -> None:
    with path.open("w", encoding="utf-8") as f:
        f.write(json.dumps({"header": header}) + "\n")
        for r in reqs:
            f.write(json.dumps(r.to_json()) + "\n")


def route_hashes(r: TraceRequest, block_chars: int, max_blocks: int) -> list[str]:
    """Stand-ins for the gateway's prefix hashes: requests of one prefix group share every block of
    the shared prompt; other prompts get blocks of their own."""
    block_tokens = max(1, block_chars // CHARS_PER_TOKEN)
    key, tokens = (r.prefix_group, r.prefix_tokens) if r.prefix_group else (r.id, r.prompt_tokens)
    n = min(max_blocks, tokens // block_tokens)
    return [hashlib.blake2b(f"{key}/{i}".encode(), digest_size=8).hexdigest() for i in range(n)]


def needed_quality(r: EvalRequest, routing: RoutingConfig) -> float:
    return max(routing.difficulty_floors[difficulty_class(r.difficulty)], r.quality_floor or 0.0)


# -- the router as the twin's dispatcher --------------------------------------------------------------


@dataclass
class RouterPick:
    """``pick(workers, seq) -> index`` for :func:`run_virtual`: heartbeats from the twin workers,
    observed TTFT/ITL from completed requests, then :meth:`RouterCore.route`; -1 when refused."""

    core: RouterCore
    slots: list[Slot]
    reqs: dict[str, EvalRequest]
    hashes: dict[str, list[str]]
    policy: str
    model: str = "auto"
    hb_interval_s: float = 1.0
    feedback: bool = True
    now: float = 0.0
    chosen: dict[str, str] = field(default_factory=dict)  # request id -> deployment
    refused: Counter[str] = field(default_factory=Counter)
    decide_s: list[float] = field(default_factory=list)
    _next_hb: float = -math.inf
    _inflight: list[tuple[TwinSeq, str]] = field(default_factory=list)
    _index: dict[tuple[str, str], int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._index = {(s.deployment, s.worker_id): i for i, s in enumerate(self.slots)}

    def _heartbeats(self, workers: Sequence[StepScheduler]) -> None:
        st = self.core.state
        for slot, w in zip(self.slots, workers, strict=True):
            running, waiting = w.num_running, w.num_waiting
            hb = Heartbeat(
                worker_id=slot.worker_id,
                pool=slot.pool,
                engine=slot.engine,
                models=[slot.model],
                max_concurrency=MAX_NUM_SEQS,
                in_flight=running + waiting,
                ready=True,
                load=EngineLoad(running=running, waiting=waiting, kv_cache_usage=round(w.kv.usage, 4)),
                interval_s=self.hb_interval_s,
                sent_at=self.now,
            )
            st.on_heartbeat(hb, now=self.now)

    def _observe(self) -> None:
        """Completed requests' TTFT and ITL into the deployment's windowed p95 (what the router's
        AttemptEvent path records; written directly since the twin has no event bus)."""
        keep: list[tuple[TwinSeq, str]] = []
        state = self.core.state
        for s, dep in self._inflight:
            if s.state is SeqState.DONE and s.finished_at is not None and s.finished_at <= self.now:
                state.observe(dep, ok=True, now=s.finished_at, ttft_s=s.ttft, itl_s=s.tpot)
            elif s.state in (SeqState.WAITING, SeqState.PREFILL, SeqState.DECODE):
                keep.append((s, dep))
        self._inflight = keep

    def __call__(self, workers: Sequence[StepScheduler], seq: TwinSeq) -> int:
        self.now = seq.arrival or 0.0
        if self.feedback:
            self._observe()
        if self.now >= self._next_hb:
            self._heartbeats(workers)
            self._next_hb = self.now + self.hb_interval_s
        r = self.reqs[seq.id]
        q = RouteQuery(
            request_id=seq.id,
            model=self.model,
            plan=r.plan,
            prompt_tokens=seq.prompt,
            max_output_tokens=seq.output,
            difficulty=r.difficulty,
            slo_class=r.trace.slo_class,
            quality_floor=r.quality_floor,
            policy=self.policy,
            prefix_hashes=self.hashes[seq.id],
        )
        t0 = time.perf_counter()
        reply, _, _ = self.core.route(q)
        self.decide_s.append(time.perf_counter() - t0)
        if not reply.targets:
            self.refused[(reply.error.code if reply.error else None) or "no_route"] += 1
            return -1
        t = reply.targets[0]
        idx = self._index.get((t.deployment, t.worker_id or ""))
        if idx is None:  # no live worker named: the least-loaded worker of the deployment
            idx = min(
                (i for i, s in enumerate(self.slots) if s.deployment == t.deployment),
                key=lambda i: workers[i].num_running + workers[i].num_waiting,
            )
        self.chosen[seq.id] = t.deployment
        self._inflight.append((seq, t.deployment))
        return idx


def replay_policy(
    rc: RouterCatalog,
    reqs: Sequence[EvalRequest],
    cluster: Sequence[TwinDeployment],
    policy: str,
    *,
    model: str = "auto",
    seed: int = 0,
    hb_interval_s: float = 1.0,
) -> tuple[RouterPick, list[StepScheduler], list[TwinSeq], float, list[Slot]]:
    slots, costs, cfgs = build_cluster(rc, cluster)
    seeds = random.Random(seed)  # the decisions' seeds (logged in each record): reproducible runs
    core = RouterCore(rc, seed_source=lambda: seeds.getrandbits(32))
    r = rc.routing
    pick = RouterPick(
        core,
        slots,
        {q.trace.id: q for q in reqs},
        {q.trace.id: route_hashes(q.trace, r.prefix_block_chars, r.prefix_max_blocks) for q in reqs},
        policy,
        model=model,
        hb_interval_s=hb_interval_s,
    )
    # The core's clock must follow virtual time: read it from the picker.
    core.clock = lambda: pick.now
    setup = VirtualSetup(workers=len(slots), config=cfgs[0], dispatch=f"router:{policy}")
    workers, seqs, t_end = run_virtual([q.trace for q in reqs], costs, setup, pick=pick, configs=cfgs)
    return pick, workers, seqs, t_end, slots


# -- metrics ---------------------------------------------------------------------------------------


def _pct(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    v = sorted(values)
    k = (len(v) - 1) * q
    lo = math.floor(k)
    hi = min(lo + 1, len(v) - 1)
    return round(v[lo] + (v[hi] - v[lo]) * (k - lo), 6)


def policy_metrics(
    rc: RouterCatalog,
    reqs: Sequence[EvalRequest],
    pick: RouterPick,
    workers: Sequence[StepScheduler],
    seqs: Sequence[TwinSeq],
    slots: Sequence[Slot],
    slo: dict[str, Slo],
) -> dict[str, Any]:
    cat = rc.catalog
    deps = {d.id: d for d in cat.deployments}
    by_id = {r.trace.id: r for r in reqs}
    n = len(seqs)
    done = [s for s in seqs if s.state is SeqState.DONE]
    routed = [s for s in seqs if s.id in pick.chosen]
    success = 0
    qualities: list[float] = []
    costs: list[float] = []
    for s in routed:
        d = deps[pick.chosen[s.id]]
        qualities.append(d.quality)
        price = cat.model_price(d.model)
        if price is not None:
            costs.append((s.prompt * price.input_per_mtok_usd + s.generated * price.output_per_mtok_usd) / 1e6)
        if s.state is SeqState.DONE and d.quality >= needed_quality(by_id[s.id], rc.routing) - 1e-9:
            success += 1
    violated = 0
    for s in seqs:
        limits = slo.get(s.slo_class or "interactive")
        if not (limits.met(s) if limits is not None else s.state is SeqState.DONE):
            violated += 1
    gpu_usd = 0.0
    for slot, w in zip(slots, workers, strict=True):
        d = deps[slot.deployment]
        gp = cat.gpu_price(d.gpu)
        gpu_usd += w.stats.busy_s * (gp.usd_per_hour if gp else 0.0) * d.gpu_count / 3600.0
    e2e = [s.e2e for s in done if s.e2e is not None]
    ttft = [s.ttft for s in done if s.ttft is not None]
    ttft_inter = [s.ttft for s in done if s.ttft is not None and s.slo_class == "interactive"]
    share = Counter(pick.chosen.values())
    queries = sum(w.stats.prefix_queries for w in workers)
    hits = sum(w.stats.prefix_hits for w in workers)
    return {
        "requests": n,
        "routed": len(routed),
        "refused": dict(pick.refused),
        "completed": len(done),
        "success_rate": round(success / n, 4) if n else None,
        "quality": round(sum(qualities) / len(qualities), 4) if qualities else None,
        "e2e_p95_s": _pct(e2e, 0.95),
        "e2e_p50_s": _pct(e2e, 0.50),
        "ttft_p95_s": _pct(ttft, 0.95),
        "ttft_p50_s": _pct(ttft, 0.50),
        "ttft_p95_by_deployment": {
            d: _pct([s.ttft for s in done if s.ttft is not None and pick.chosen.get(s.id) == d], 0.95) for d in deps
        },
        "ttft_p95_interactive_s": _pct(ttft_inter, 0.95),
        "mean_cost_usd": round(sum(costs) / len(costs), 8) if costs else None,
        "gpu_cost_usd_per_request": round(gpu_usd / len(routed), 8) if routed else None,
        "slo_violation_rate": round(violated / n, 4) if n else None,
        "prefix_cache_hit_rate": round(hits / queries, 4) if queries else None,
        "share": {d: round(share.get(d, 0) / n, 4) for d in deps},
        "decision_us_p50": round((_pct(pick.decide_s, 0.5) or 0.0) * 1e6, 1),
        "decision_us_p99": round((_pct(pick.decide_s, 0.99) or 0.0) * 1e6, 1),
    }


# -- experiment 1: policies ----------------------------------------------------------------------------


def run_policies(
    rc: RouterCatalog,
    reqs: Sequence[EvalRequest],
    *,
    policies: Sequence[str] = POLICIES,
    cluster: Sequence[TwinDeployment] = CLUSTER,
    seed: int = 0,
    slo: dict[str, Slo] | None = None,
) -> dict[str, dict[str, Any]]:
    slo = slo if slo is not None else load_slo_classes(rc.source)
    out: dict[str, dict[str, Any]] = {}
    for policy in policies:
        w0 = time.perf_counter()
        pick, workers, seqs, t_end, slots = replay_policy(rc, reqs, cluster, policy, seed=seed)
        m = policy_metrics(rc, reqs, pick, workers, seqs, slots, slo)
        m["simulated_duration_s"] = round(t_end, 3)
        m["replay_wall_s"] = round(time.perf_counter() - w0, 3)
        out[policy] = m
        log.info(
            "policy %-16s success %.3f quality %.3f e2e p95 %.2fs cost $%.6f slo-viol %.3f (%.1fs)",
            policy,
            m["success_rate"],
            m["quality"] or 0.0,
            m["e2e_p95_s"] or 0.0,
            m["mean_cost_usd"] or 0.0,
            m["slo_violation_rate"],
            m["replay_wall_s"],
        )
    return out


# -- experiment 2: replica pickers on a shared-prefix workload ------------------------------------------


PICKER_DEPLOYMENT = "llama-8b-h100"
PICKER_WORKERS = 4
PICKER_KV_BLOCKS = 2500  # 40k tokens per worker: the prefix working set below does not fit in one
PICKER_RATES = (40.0, 70.0, 100.0)  # req/s: light, busy, past round-robin's knee


@dataclass(frozen=True)
class PrefixWorkloadSpec:
    requests: int = 1000
    rate_rps: float = 70.0
    groups: int = 24
    prefix_tokens: int = 2048
    zipf_s: float = 0.8  # group popularity ~ 1 / rank^s: a few hot prefixes (exercises the load bound)


def generate_prefix_requests(seed: int, spec: PrefixWorkloadSpec | None = None) -> list[EvalRequest]:
    spec = spec or PrefixWorkloadSpec()
    rng = random.Random(seed)
    weights = [1.0 / (k + 1) ** spec.zipf_s for k in range(spec.groups)]
    out: list[EvalRequest] = []
    t = 0.0
    for i in range(spec.requests):
        t += rng.expovariate(spec.rate_rps)
        g = rng.choices(range(spec.groups), weights)[0]
        tr = TraceRequest(
            t=round(t, 6),  # as the JSONL stores it: a saved set replays identically
            id=f"p{i:05d}",
            prompt_tokens=spec.prefix_tokens + rng.randint(50, 300),
            output_tokens=rng.randint(32, 200),
            slo_class="interactive",
            cls="shared-prefix",
            prefix_group=f"grp{g}",
            prefix_tokens=spec.prefix_tokens,
        )
        out.append(EvalRequest(tr, "shared-prefix", 0.1))
    return out


def picker_catalog(rc: RouterCatalog, deployment: str = PICKER_DEPLOYMENT) -> RouterCatalog:
    """The eval catalog cut to one deployment, with one policy per picker (no scorers)."""
    cat_json = rc.catalog.model_dump(mode="json")
    cat_json["deployments"] = [d for d in cat_json["deployments"] if d["id"] == deployment]
    cat = type(rc.catalog).model_validate(cat_json)
    routing_json = rc.routing.model_dump(mode="json")
    routing_json.update(
        default_policy=f"pick-{PICKERS[0]}",
        aliases={},
        policies={f"pick-{p}": {"scorers": {}, "picker": p} for p in PICKERS},
    )
    return RouterCatalog(cat, RoutingConfig.model_validate(routing_json), rc.source)


def run_pickers(
    rc: RouterCatalog,
    reqs: Sequence[EvalRequest],
    *,
    workers: int = PICKER_WORKERS,
    kv_blocks: int = PICKER_KV_BLOCKS,
    seed: int = 0,
) -> dict[str, dict[str, Any]]:
    prc = picker_catalog(rc)
    d = next(c for c in CLUSTER if c.deployment == PICKER_DEPLOYMENT)
    cluster = [TwinDeployment(d.deployment, d.twin_model, d.device, d.engine, workers, kv_blocks)]
    slo = load_slo_classes(rc.source)
    out: dict[str, dict[str, Any]] = {}
    for p in PICKERS:
        w0 = time.perf_counter()
        pick, tw, seqs, t_end, slots = replay_policy(
            prc, reqs, cluster, f"pick-{p}", model=PICKER_DEPLOYMENT, seed=seed
        )
        m = policy_metrics(prc, reqs, pick, tw, seqs, slots, slo)
        per_worker = Counter(s.worker for s in seqs)
        m["requests_per_worker"] = [per_worker.get(i, 0) for i in range(len(slots))]
        m["preemptions"] = sum(w.stats.preemptions for w in tw)
        m["simulated_duration_s"] = round(t_end, 3)
        m["replay_wall_s"] = round(time.perf_counter() - w0, 3)
        out[p] = m
        log.info(
            "picker %-16s ttft p95 %.3fs hit rate %.3f per worker %s (%.1fs)",
            p,
            m["ttft_p95_s"] or 0.0,
            m["prefix_cache_hit_rate"] or 0.0,
            m["requests_per_worker"],
            m["replay_wall_s"],
        )
    return out


# -- output --------------------------------------------------------------------------------------------


def _f(v: Any, fmt: str) -> str:
    return "—" if v is None else format(v, fmt)


def policies_markdown(res: dict[str, dict[str, Any]], spread: dict[str, dict[str, Any]] | None = None) -> str:
    lines = [
        "| policy | success rate | quality | p95 latency (E2E) s | TTFT p95 s | mean cost $/req | "
        "GPU-time $/req | SLO violation rate | refused |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p, m in res.items():
        lines.append(
            f"| {p} | {_f(m['success_rate'], '.3f')} | {_f(m['quality'], '.3f')} | {_f(m['e2e_p95_s'], '.2f')} | "
            f"{_f(m['ttft_p95_s'], '.3f')} | {_f(m['mean_cost_usd'], '.6f')} | "
            f"{_f(m['gpu_cost_usd_per_request'], '.6f')} | {_f(m['slo_violation_rate'], '.3f')} | "
            f"{sum(m['refused'].values())} |"
        )
    deps = list(next(iter(res.values()))["share"]) if res else []
    lines += ["", "Share of requests per deployment:", "", "| policy | " + " | ".join(deps) + " |"]
    lines.append("|---|" + "---:|" * len(deps))
    for p, m in res.items():
        lines.append(f"| {p} | " + " | ".join(f"{m['share'][d]:.3f}" for d in deps) + " |")
    if spread:
        lines += [
            "",
            "Spread over two request sets (seeds): min – max.",
            "",
            "| policy | success rate | quality | p95 E2E s | mean cost $/req | SLO violation rate |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for p, s in spread.items():
            cells = [f"{_f(a, '.4g')} – {_f(b, '.4g')}" for a, b in s.values()]
            lines.append(f"| {p} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def actual_line(res: dict[str, dict[str, Any]]) -> str:
    """Which policy is best on each column (generated, so it cannot go stale against the table)."""
    cols = [
        ("success_rate", "success", max),
        ("quality", "quality", max),
        ("e2e_p95_s", "p95 E2E", min),
        ("ttft_p95_s", "TTFT p95", min),
        ("mean_cost_usd", "mean cost", min),
        ("slo_violation_rate", "SLO violations", min),
    ]
    parts = []
    for key, name, best in cols:
        vals = {p: m[key] for p, m in res.items() if m[key] is not None}
        if vals:
            b = best(vals.values())
            parts.append(f"best {name}: {', '.join(p for p, v in vals.items() if v == b)} ({b:.4g})")
    return "; ".join(parts) + "."


def pickers_markdown(sweep: dict[str, dict[str, dict[str, Any]]]) -> str:
    lines = [
        "| rate req/s | picker | TTFT p95 s | TTFT p50 s | prefix-cache hit rate | requests per worker | "
        "preemptions | SLO violation rate |",
        "|---:|---|---:|---:|---:|---|---:|---:|",
    ]
    for rate, res in sweep.items():
        for p, m in res.items():
            lines.append(
                f"| {rate} | {p} | {_f(m['ttft_p95_s'], '.3f')} | {_f(m['ttft_p50_s'], '.3f')} | "
                f"{_f(m['prefix_cache_hit_rate'], '.3f')} | {m['requests_per_worker']} | {m['preemptions']} | "
                f"{_f(m['slo_violation_rate'], '.3f')} |"
            )
    return "\n".join(lines) + "\n"


def plot_policies(res: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(res)
    panels = [
        ("success_rate", "success rate"),
        ("quality", "mean quality (catalog)"),
        ("e2e_p95_s", "E2E p95 (s)"),
        ("mean_cost_usd", "mean list cost ($/request)"),
        ("slo_violation_rate", "SLO violation rate"),
    ]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    for ax, (key, title) in zip(axes.flat, panels, strict=False):
        ax.bar(names, [res[n][key] or 0.0 for n in names], color="tab:blue")
        ax.set_title(title)
        ax.tick_params(axis="x", rotation=35)
    ax = axes.flat[5]
    deps = list(res[names[0]]["share"])
    bottom = [0.0] * len(names)
    for d in deps:
        vals = [res[n]["share"][d] for n in names]
        ax.bar(names, vals, bottom=bottom, label=d)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.set_title("share per deployment")
    ax.legend(fontsize=7)
    ax.tick_params(axis="x", rotation=35)
    fig.suptitle("Routing policies on one request set — SIMULATED (engine twin, virtual time)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_pickers(sweep: dict[str, dict[str, dict[str, Any]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = [float(r) for r in sweep]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for p in PICKERS:
        axes[0].plot(rates, [sweep[r][p]["ttft_p95_s"] or 0.0 for r in sweep], marker="o", label=p)
        axes[1].plot(rates, [sweep[r][p]["prefix_cache_hit_rate"] or 0.0 for r in sweep], marker="o", label=p)
    axes[0].set_title("TTFT p95 (s)")
    axes[0].set_yscale("log")
    axes[1].set_title("prefix-cache hit rate")
    for ax in axes:
        ax.set_xlabel("arrival rate (req/s)")
        ax.legend(fontsize=8)
    fig.suptitle(f"Replica pickers, shared-prefix workload, {PICKER_WORKERS} workers — SIMULATED")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _lengths(reqs: Sequence[EvalRequest]) -> tuple[str, str]:
    kinds = Counter(r.kind for r in reqs)
    p = sorted(r.trace.prompt_tokens for r in reqs)
    o = sorted(r.trace.output_tokens for r in reqs)
    mix = ", ".join(f"{k} {v}" for k, v in sorted(kinds.items()))
    return (
        f"prompt tokens p50 {_pct(p, 0.5):.0f}, p95 {_pct(p, 0.95):.0f}, max {p[-1]} ({mix})",
        f"output tokens p50 {_pct(o, 0.5):.0f}, p95 {_pct(o, 0.95):.0f}, max {o[-1]} (all generated: ignore_eos)",
    )


def _shown_path(path: str) -> str:
    """A path as the report shows it: relative to the working directory (the repository) when inside it."""
    p, cwd = Path(path).resolve(), Path.cwd()
    return str(p.relative_to(cwd)) if p.is_relative_to(cwd) else path


def _metadata(
    started: dt.datetime, wall_s: float, reqs: Sequence[EvalRequest], command: str, **extra: Any
) -> dict[str, Any]:
    inp, outp = _lengths(reqs)
    return metadata_block(
        started=started,
        duration_s=wall_s,
        engine="llmlab engine twin (virtual time, roofline step cost; SIMULATED)",
        model_id=", ".join(f"{c.deployment}={c.twin_model}@{c.device}x{c.workers}" for c in CLUSTER),
        concurrency="open loop (Poisson arrivals), see workload",
        warmup="none: virtual time starts with empty caches; router latency priors until 5 completions",
        prompt_dataset="synthetic, llmlab_lab.router_eval.generate_requests (token counts only, no text)",
        input_length_distribution=inp,
        output_length_distribution=outp,
        sampling_parameters="n/a (the twin emits token counts; output length fixed per request)",
        command=command,
        simulated=True,
        simulated_note="Every figure is SIMULATED by the engine twin in virtual time; no GPU, no model.",
        **extra,
    )


README = """# Router evaluation (SIMULATED)

Made by `{command}` (`make router-eval`). Every figure here is **simulated**: the engine twin
(`services/engine-sim/TWIN.md`: vLLM-style step scheduler, KV cache, prefix cache, roofline step
time) replays the request set in virtual time, and the real router core
(`llmlab_routing.core.RouterCore`, the plug-ins of `configs/router-eval-catalog.yaml`) decides every
request. No GPU and no model ran.

Files: `requests.jsonl` (the request set, seed {seed}), `policies.{{md,json,png}}` (experiment 1),
`pickers.{{md,json,png}}` + `prefix-requests.jsonl` (experiment 2), `meta.json` (metadata block),
`command.txt`.

## Experiment 1: policies

Hypothesis / expected: cost-first has the lowest quality and (with static) the lowest cost;
quality-first the highest quality and cost, and it overloads the big deployment (latency, SLO
violations); multi-objective sits between them; static cannot serve requests stating a floor above
its one deployment's quality. Interpretation and next steps: `NOTE.md` (written by hand).
Fixed: the request set ({n} requests, Poisson {rate} req/s, shared-prefix chats / long documents /
short chats, difficulty spread, interactive and batch SLO classes, 5% stating quality >= 0.75),
the cluster ({cluster}), heartbeats every {hb} s of virtual time, observed TTFT/ITL fed back.
Changed: the routing policy (`RouteQuery.policy`, model `auto`).

{policies_md}
Actual (this run, generated): {actual}

Definitions: success = routed, completed, and catalog quality of the chosen deployment >= the
quality the request needed (difficulty floor of its class: easy 0, medium 0.3, hard 0.6; or its
stated floor). Quality = mean catalog quality of chosen deployments. p95 latency = E2E p95 of
completed requests. Mean cost = list price (catalog $/Mtok x prompt and generated tokens) per routed
request; GPU-time = busy device-seconds x catalog $/h, per routed request. SLO violation rate =
share of all requests missing a limit of their class (interactive: TTFT <= 1 s, TPOT <= 0.1 s,
queue <= 5 s; batch: E2E <= 600 s, queue <= 60 s), refused requests included.

## Experiment 2: replica pickers on a shared-prefix workload

Hypothesis: prefix affinity keeps each system prompt on few workers, so the prefix-cache hit rate
rises and TTFT p95 falls against round-robin / least-load / power-of-two.
Fixed: one deployment ({pdep}, {pworkers} workers, KV cache cut to {pblocks} blocks = {ptokens} tokens
per worker so the {groups} x {ptok}-token prefix working set does not fit one worker), {pn} requests
per run, Zipf group popularity; the arrival rate is swept ({prate} req/s; `prefix-requests.jsonl`
is the {pdefault} req/s set). Changed: the picker.

{pickers_md}
## What the simulator can and cannot show

* Can: queueing, batching, KV pressure, preemption and prefix-cache reuse of vLLM-style engines at
  roofline speed (calibrated on published TensorRT-LLM points, see TWIN.md; held-out error 4-8% for
  8B, ~27% over-prediction for 70B-class transfer), and how the router's choices move them.
* Cannot: **quality**. The quality scores are illustrative catalog inputs, not measured; "success"
  only checks that the chosen deployment's catalog score meets the request's needed floor. No
  output is judged.
* Cannot: failures, timeouts and fallbacks. Twin workers never fail in virtual time, so only the
  first target of each chain is used; the fallback path is tested elsewhere (gateway tests).
* Cannot: the NATS round trip or decision latency in time: routing takes zero virtual time (its
  real CPU cost is in `router_bench.py`).
* Priors vs observed: the router starts on the catalog's priors (read off the twin, then padded)
  and switches to observed p95 TTFT/ITL after 5 completions in a 60 s window; heartbeats lag up to
  {hb} s (the router counts what it sent since). Priors that were far off would change the first
  seconds only.
* Prices are list prices from the eval catalog (illustrative); cached-input discounts are ignored.
* One request set and one cluster; a second seed gives the spread shown. Results for other mixes,
  rates or clusters are not shown here.

Unverified: everything against real engines (no GPU in this run).
"""


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m llmlab_lab.router_eval", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="results/router-eval")
    ap.add_argument("--catalog", default=str(EVAL_CATALOG))
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--requests", type=int, default=WorkloadSpec.requests)
    ap.add_argument("--rate", type=float, default=WorkloadSpec.rate_rps)
    ap.add_argument("--prefix-requests", type=int, default=PrefixWorkloadSpec.requests, help="per picker run")
    ap.add_argument("--no-spread", action="store_true", help="skip the second request set (seed + 1)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("llmlab_routing.core").setLevel(logging.WARNING)  # one line per decision otherwise

    command = "python -m llmlab_lab.router_eval " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    started = dt.datetime.now(dt.UTC)
    w0 = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rc = load_router_catalog(args.catalog)
    spec = WorkloadSpec(requests=args.requests, rate_rps=args.rate)
    reqs = generate_requests(args.seed, spec)
    save_requests(reqs, out / "requests.jsonl", {"seed": args.seed, "spec": spec.__dict__, "simulated": True})
    log.info("experiment 1: %d requests, %d policies", len(reqs), len(POLICIES))
    res = run_policies(rc, reqs, seed=args.seed)
    spread: dict[str, dict[str, Any]] | None = None
    res2: dict[str, dict[str, Any]] | None = None
    if not args.no_spread:
        log.info("experiment 1, second request set (seed %d)", args.seed + 1)
        res2 = run_policies(rc, generate_requests(args.seed + 1, spec), seed=args.seed + 1)
        keys = ("success_rate", "quality", "e2e_p95_s", "mean_cost_usd", "slo_violation_rate")
        spread = {
            p: {k: (min(res[p][k] or 0, res2[p][k] or 0), max(res[p][k] or 0, res2[p][k] or 0)) for k in keys}
            for p in res
        }
    pspec = PrefixWorkloadSpec(requests=args.prefix_requests)
    pres: dict[str, dict[str, dict[str, Any]]] = {}
    for rate in PICKER_RATES:
        preqs = generate_prefix_requests(args.seed, replace(pspec, rate_rps=rate))
        if rate == pspec.rate_rps:
            save_requests(preqs, out / "prefix-requests.jsonl", {"seed": args.seed, "spec": pspec.__dict__})
        log.info("experiment 2: %d shared-prefix requests at %g req/s", len(preqs), rate)
        pres[f"{rate:g}"] = run_pickers(rc, preqs, seed=args.seed)
    wall = time.perf_counter() - w0

    meta = _metadata(
        started,
        wall,
        reqs,
        command,
        catalog=_shown_path(args.catalog),
        catalog_version=rc.version,
        seed=args.seed,
        workload=spec.__dict__,
        prefix_workload=pspec.__dict__,
        cluster=[c.__dict__ for c in CLUSTER],
        twin_config={"max_num_seqs": MAX_NUM_SEQS, "max_num_batched_tokens": MAX_BATCHED_TOKENS, "block": BLOCK_SIZE},
        heartbeat_interval_s=1.0,
    )
    pol_md = policies_markdown(res, spread)
    pick_md = pickers_markdown(pres)
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    (out / "command.txt").write_text(command + "\n")
    (out / "policies.json").write_text(
        json.dumps({"simulated": True, "meta": meta, "results": res, "second_seed": res2, "spread": spread}, indent=2)
        + "\n"
    )
    (out / "pickers.json").write_text(json.dumps({"simulated": True, "meta": meta, "results": pres}, indent=2) + "\n")
    (out / "policies.md").write_text(f"# Routing policies (SIMULATED, seed {args.seed})\n\n`{command}`\n\n{pol_md}")
    (out / "pickers.md").write_text(f"# Replica pickers (SIMULATED, seed {args.seed})\n\n`{command}`\n\n{pick_md}")
    plot_policies(res, out / "policies.png")
    plot_pickers(pres, out / "pickers.png")
    (out / "README.md").write_text(
        README.format(
            command=command,
            seed=args.seed,
            n=spec.requests,
            rate=spec.rate_rps,
            cluster=", ".join(f"{c.deployment} = {c.twin_model} on {c.device} x{c.workers}" for c in CLUSTER),
            hb=1.0,
            policies_md=pol_md,
            actual=actual_line(res),
            pdep=PICKER_DEPLOYMENT,
            pworkers=PICKER_WORKERS,
            pblocks=PICKER_KV_BLOCKS,
            ptokens=PICKER_KV_BLOCKS * BLOCK_SIZE,
            groups=pspec.groups,
            ptok=pspec.prefix_tokens,
            pn=pspec.requests,
            prate=", ".join(f"{r:g}" for r in PICKER_RATES),
            pdefault=f"{pspec.rate_rps:g}",
            pickers_md=pick_md,
        )
    )
    log.info("wrote %s in %.1fs (SIMULATED)", out, wall)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
