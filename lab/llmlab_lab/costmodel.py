"""The §11 cost model: what a request costs self-hosted or through an external API, and when each wins.

Pure computation (no I/O besides :func:`load_config` and :func:`load_sweep`); the CLI is
``python -m llmlab_lab.costmodel_cli``. Formulas (tutorial §11.1, §11.2), per replica of a
self-hosted deployment:

* GPU hourly cost = instance + storage + network + observability (each $/h per replica)
* effective tokens/hour = tok/s x 3600 x utilisation x success rate, where tok/s is the replica's
  capacity at its SLO target (from the engine twin or a measured run, never assumed) and utilisation
  is the *average* load over that capacity (not peak), success rate = 1 / (1 + retry rate)
* cost per 1M tokens = GPU hourly cost / effective tokens per hour x 1e6
* cost per request = input + output + routing + storage + network + retry overhead
* gross margin per request = revenue per request - variable cost per request
* break-even requests/month = monthly fixed cost / gross margin per request

Hidden costs (§11.3) are explicit inputs (:class:`CaseInputs`): idle GPUs (utilisation < 1 is paid),
model loading per deploy, retries/fallbacks (``retry_rate``), long system prompts
(``system_prompt_tokens``), unused reserved capacity (``peak_to_average``: replicas are provisioned
for the peak), logs/metrics/network, engineer time, and re-asks caused by poor quality (``reask_rate``).

Volumes are *user requests per month* (questions answered); re-asks and retries are costs on top.
Self-hosted cost is piecewise linear in the volume (a new replica every ``capacity`` requests), so
break-even and crossover points are solved exactly per segment instead of on a grid.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import logging
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import yaml
from llmlab_common.catalog import load_catalog
from pydantic import BaseModel, ConfigDict, Field, model_validator

log = logging.getLogger(__name__)

MONTH_HOURS = 730.0  # 365 x 24 / 12, the usual cloud billing month


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CaseInputs(_Strict):
    """One best/base/worst set of the inputs that are not the deployment's own price or throughput."""

    gpu_price_factor: float = Field(default=1.0, gt=0)  # x the dated on-demand GPU price (e.g. a commitment)
    api_price_factor: float = Field(default=1.0, gt=0)  # x the dated API list price
    retry_rate: float = Field(default=0.0, ge=0)  # extra attempts per served request (burnt tokens)
    reask_rate: float = Field(default=0.0, ge=0)  # extra user requests per answered one (poor quality)
    system_prompt_tokens: float = Field(default=0.0, ge=0)  # added to every prompt beyond the workload's
    peak_to_average: float = Field(default=1.0, ge=1)  # provisioned for peak: the rest is unused reserve
    min_replicas: int = Field(default=1, ge=1)  # always-on floor (idle GPUs at low traffic)
    deploys_per_month: float = Field(default=0.0, ge=0)
    model_load_minutes: float = Field(default=0.0, ge=0)  # a replica paid while loading weights
    storage_usd_per_hour: float = Field(default=0.0, ge=0)  # per replica: weights volume, image cache
    network_usd_per_hour: float = Field(default=0.0, ge=0)  # per replica: load balancer / NAT share
    observability_usd_per_hour: float = Field(default=0.0, ge=0)  # per replica: exporters, agents
    routing_usd_per_request: float = Field(default=0.0, ge=0)  # gateway + router + queue CPU per attempt
    log_bytes_per_request: float = Field(default=0.0, ge=0)
    log_storage_usd_per_gb: float = Field(default=0.0, ge=0)  # for the retention period
    egress_bytes_per_request: float = Field(default=0.0, ge=0)
    network_usd_per_gb: float = Field(default=0.0, ge=0)
    engineer_hours_per_month: float = Field(default=0.0, ge=0)
    engineer_usd_per_hour: float = Field(default=0.0, ge=0)
    fixed_usd_per_month: float = Field(default=0.0, ge=0)  # dashboards, alerting, on-call tooling


class Dated(_Strict):
    """A price with its date and source (a §11 done-when: every price is dated)."""

    usd: float = Field(ge=0)
    as_of: dt.date
    source: str = Field(min_length=1)


class SweepPoint(_Strict):
    """One replay of the workload at one offered rate through one replica (simulated or measured)."""

    rate_rps: float = Field(gt=0)
    slo_attainment: float = Field(ge=0, le=1)
    total_tokens_per_s: float = Field(ge=0)
    ttft_p95_s: float | None = None
    gpu_busy_fraction: float | None = None


class Throughput(_Strict):
    """A replica's throughput: the SLO-attainment curve over offered rate and the workload's mean lengths."""

    source: str = Field(min_length=1)  # file path of the run, or the twin command
    simulated: bool
    prompt_tokens_mean: float = Field(gt=0)
    output_tokens_mean: float = Field(gt=0)
    points: list[SweepPoint] = Field(min_length=1)

    def capacity_rps(self, slo_target: float) -> float:
        """Highest offered rate at which SLO attainment is still >= target (linear between points); 0 if none."""
        pts = sorted(self.points, key=lambda p: p.rate_rps)
        best = 0.0
        for i, p in enumerate(pts):
            if p.slo_attainment >= slo_target:
                best = p.rate_rps
                continue
            # The first point below target: interpolate from the previous one if that one met it.
            if i > 0 and pts[i - 1].slo_attainment >= slo_target:
                a, b = pts[i - 1], p
                best = a.rate_rps + (a.slo_attainment - slo_target) / (a.slo_attainment - b.slo_attainment) * (
                    b.rate_rps - a.rate_rps
                )
            break
        return best

    def attainment_at(self, rate_rps: float) -> float:
        """SLO attainment at an offered rate per replica, interpolated (clamped to the measured range)."""
        pts = sorted(self.points, key=lambda p: p.rate_rps)
        if rate_rps <= pts[0].rate_rps:
            return pts[0].slo_attainment
        for a, b in itertools.pairwise(pts):
            if rate_rps <= b.rate_rps:
                w = (rate_rps - a.rate_rps) / (b.rate_rps - a.rate_rps)
                return a.slo_attainment + w * (b.slo_attainment - a.slo_attainment)
        return pts[-1].slo_attainment


class Deployment(_Strict):
    """A way to serve the workload: self-hosted replicas of N GPUs, or an external API."""

    id: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    kind: Literal["self_hosted", "external_api"]
    title: str
    quality_note: str  # what the saving does to quality (§11 done-when)
    quality: float | None = None  # the catalog's quality score of the model, when it has one
    # self-hosted
    gpu: str | None = None
    gpus_per_replica: int = Field(default=1, ge=1)
    gpu_price: Dated | None = None
    slo_target: float = Field(default=0.95, gt=0, le=1)
    throughput: Throughput | None = None
    # external API
    model: str | None = None
    input_price_per_mtok: Dated | None = None
    output_price_per_mtok: Dated | None = None
    overrides: dict[str, dict[str, Any]] = Field(default_factory=dict)  # case (or "*") -> CaseInputs fields

    @model_validator(mode="after")
    def _complete(self) -> Deployment:
        if self.kind == "self_hosted" and (self.gpu_price is None or self.throughput is None):
            raise ValueError(f"{self.id}: a self-hosted deployment needs gpu_price and throughput")
        if self.kind == "external_api" and (self.input_price_per_mtok is None or self.output_price_per_mtok is None):
            raise ValueError(f"{self.id}: an external API needs input/output prices")
        return self


class Revenue(_Strict):
    """What we charge a user per 1M tokens (our price, an input of the business, not a market quote)."""

    input_per_mtok: float = Field(ge=0)
    output_per_mtok: float = Field(ge=0)
    source: str


class Workload(_Strict):
    """Mean tokens of one user request; the same for every deployment so that costs compare."""

    prompt_tokens_mean: float = Field(gt=0)
    output_tokens_mean: float = Field(gt=0)
    source: str


class Breakdown(_Strict):
    """Every figure of one deployment at one monthly volume and case (USD unless named otherwise)."""

    deployment: str
    case: str
    user_requests_per_month: float
    served_requests_per_month: float  # with re-asks
    attempts_per_month: float  # with re-asks and retries
    input_tokens: float  # per attempt
    output_tokens: float
    replicas: int = 0
    capacity_rps_per_replica: float | None = None
    capacity_tokens_per_s_per_replica: float | None = None
    utilisation: float | None = None  # average load / provisioned capacity
    slo_attainment_avg: float | None = None  # at the average load per replica
    gpu_hourly_cost: float | None = None  # per replica: instance + storage + network + observability
    instance_usd_per_hour: float | None = None
    effective_tokens_per_hour: float | None = None  # per replica
    cost_per_1m_tokens: float
    input_token_cost: float  # per served request
    output_token_cost: float
    routing_cost: float
    storage_cost: float
    network_cost: float
    retry_overhead: float
    cost_per_served_request: float
    fixed_monthly: float  # engineer time + fixed tooling + model loading
    gpu_monthly: float  # replicas x hourly x month (idle included)
    idle_gpu_monthly: float  # the share of gpu_monthly paid for capacity not used on average
    monthly_cost: float
    cost_per_user_request: float  # monthly_cost / user requests (re-asks, retries, idle and fixed included)
    revenue_per_user_request: float
    variable_cost_per_user_request: float  # what one more request adds (GPU excluded: it is fixed)
    gross_margin_per_user_request: float
    monthly_fixed_for_break_even: float  # fixed + GPUs at the current replica count


class Config(_Strict):
    """configs/costmodel.yaml after price and throughput references are resolved."""

    as_of: dt.date
    month_hours: float = MONTH_HOURS
    volume_range: tuple[float, float] = (1e4, 1e10)
    workload: Workload
    revenue: Revenue
    traffic: dict[str, float]  # name -> user requests per month
    cases: dict[str, CaseInputs]
    deployments: list[Deployment]

    def deployment(self, dep_id: str) -> Deployment:
        for d in self.deployments:
            if d.id == dep_id:
                return d
        raise KeyError(dep_id)

    def inputs(self, dep: Deployment, case: str) -> CaseInputs:
        """The case's inputs with the deployment's overrides ("*" first, then the case's own) applied."""
        merged = {**self.cases[case].model_dump(), **dep.overrides.get("*", {}), **dep.overrides.get(case, {})}
        return CaseInputs(**merged)


# -- the formulas ---------------------------------------------------------------------------------------


def gpu_hourly_cost(dep: Deployment, c: CaseInputs) -> tuple[float, float]:
    """(GPU hourly cost per replica, its instance part) = instance + storage + network + observability."""
    assert dep.gpu_price is not None
    instance = dep.gpu_price.usd * dep.gpus_per_replica * c.gpu_price_factor
    return instance + c.storage_usd_per_hour + c.network_usd_per_hour + c.observability_usd_per_hour, instance


def _per_attempt_overheads(c: CaseInputs) -> tuple[float, float, float]:
    """(routing, storage, network) per attempt: every attempt is routed, logged and streamed out."""
    storage = c.log_bytes_per_request / 1e9 * c.log_storage_usd_per_gb
    network = c.egress_bytes_per_request / 1e9 * c.network_usd_per_gb
    return c.routing_usd_per_request, storage, network


def replicas_needed(
    dep: Deployment, c: CaseInputs, attempts_per_month: float, tokens_per_attempt: float, cfg: Config
) -> int:
    """Replicas provisioned for the peak (average x peak_to_average) at the capacity under the SLO target."""
    cap_tok = capacity_tokens_per_s(dep)
    if cap_tok <= 0:
        return 0  # the SLO target is never met: no replica count serves it (callers say "never")
    load_tok = attempts_per_month * tokens_per_attempt / (cfg.month_hours * 3600.0)
    return max(c.min_replicas, math.ceil(load_tok * c.peak_to_average / cap_tok - 1e-12))


def capacity_tokens_per_s(dep: Deployment) -> float:
    """Tokens/s one replica sustains at its SLO target: capacity (req/s) x the measured tokens per request."""
    assert dep.throughput is not None
    t = dep.throughput
    return t.capacity_rps(dep.slo_target) * (t.prompt_tokens_mean + t.output_tokens_mean)


def evaluate(cfg: Config, dep: Deployment, case: str, volume: float, replicas: int | None = None) -> Breakdown:
    """All §11 figures of ``dep`` at ``volume`` user requests per month (``replicas`` forces a count)."""
    if volume <= 0:
        raise ValueError(f"volume must be > 0 user requests/month, got {volume}")
    c = cfg.inputs(dep, case)
    w = cfg.workload
    served = volume * (1.0 + c.reask_rate)
    attempts = served * (1.0 + c.retry_rate)
    tin = w.prompt_tokens_mean + c.system_prompt_tokens
    tout = w.output_tokens_mean
    routing, storage, network = _per_attempt_overheads(c)
    engineer = c.engineer_hours_per_month * c.engineer_usd_per_hour
    rev = (tin * cfg.revenue.input_per_mtok + tout * cfg.revenue.output_per_mtok) / 1e6
    success = 1.0 / (1.0 + c.retry_rate)
    common: dict[str, Any] = {
        "deployment": dep.id,
        "case": case,
        "user_requests_per_month": volume,
        "served_requests_per_month": served,
        "attempts_per_month": attempts,
        "input_tokens": tin,
        "output_tokens": tout,
        "routing_cost": routing,
        "storage_cost": storage,
        "network_cost": network,
        "revenue_per_user_request": rev,
    }
    if dep.kind == "external_api":
        assert dep.input_price_per_mtok is not None and dep.output_price_per_mtok is not None
        in_cost = tin * dep.input_price_per_mtok.usd * c.api_price_factor / 1e6
        out_cost = tout * dep.output_price_per_mtok.usd * c.api_price_factor / 1e6
        # A failed attempt is billed for what it burnt, and routed/logged/streamed like any other.
        retry = c.retry_rate * (in_cost + out_cost + routing + storage + network)
        per_served = in_cost + out_cost + routing + storage + network + retry
        fixed = engineer + c.fixed_usd_per_month
        monthly = served * per_served + fixed
        variable = (1.0 + c.reask_rate) * per_served
        return Breakdown(
            **common,
            cost_per_1m_tokens=(in_cost + out_cost) / success / (tin + tout) * 1e6,
            input_token_cost=in_cost,
            output_token_cost=out_cost,
            retry_overhead=retry,
            cost_per_served_request=per_served,
            fixed_monthly=fixed,
            gpu_monthly=0.0,
            idle_gpu_monthly=0.0,
            monthly_cost=monthly,
            cost_per_user_request=monthly / volume,
            variable_cost_per_user_request=variable,
            gross_margin_per_user_request=rev - variable,
            monthly_fixed_for_break_even=fixed,
        )
    assert dep.throughput is not None
    hourly, instance = gpu_hourly_cost(dep, c)
    n = replicas if replicas is not None else replicas_needed(dep, c, attempts, tin + tout, cfg)
    cap_rps = dep.throughput.capacity_rps(dep.slo_target)
    cap_tok = capacity_tokens_per_s(dep)
    if n <= 0 or cap_tok <= 0:
        raise ValueError(f"{dep.id}: SLO attainment never reaches {dep.slo_target} in the throughput runs")
    load_tok = attempts * (tin + tout) / (cfg.month_hours * 3600.0)
    util = load_tok / (n * cap_tok)
    eff_tok_h = cap_tok * 3600.0 * util * success
    per_mtok = hourly / eff_tok_h * 1e6 if eff_tok_h > 0 else math.inf
    # Per attempt token cost: the replicas' whole bill over the tokens they actually process (idle included).
    per_tok = hourly / (cap_tok * 3600.0 * util) if util > 0 else math.inf
    in_cost, out_cost = tin * per_tok, tout * per_tok
    retry = c.retry_rate * (in_cost + out_cost + routing + storage + network)
    per_served = in_cost + out_cost + routing + storage + network + retry
    gpu_monthly = n * hourly * cfg.month_hours
    loading = n * c.deploys_per_month * c.model_load_minutes / 60.0 * hourly
    fixed = engineer + c.fixed_usd_per_month + loading
    monthly = gpu_monthly + fixed + attempts * (routing + storage + network)
    variable = (1.0 + c.reask_rate) * (1.0 + c.retry_rate) * (routing + storage + network)
    per_replica_rps = attempts / (cfg.month_hours * 3600.0) / n
    return Breakdown(
        **common,
        replicas=n,
        capacity_rps_per_replica=cap_rps,
        capacity_tokens_per_s_per_replica=cap_tok,
        utilisation=util,
        slo_attainment_avg=dep.throughput.attainment_at(per_replica_rps),
        gpu_hourly_cost=hourly,
        instance_usd_per_hour=instance,
        effective_tokens_per_hour=eff_tok_h,
        cost_per_1m_tokens=per_mtok,
        input_token_cost=in_cost,
        output_token_cost=out_cost,
        retry_overhead=retry,
        cost_per_served_request=per_served,
        fixed_monthly=fixed,
        gpu_monthly=gpu_monthly,
        idle_gpu_monthly=gpu_monthly * (1.0 - util),
        monthly_cost=monthly,
        cost_per_user_request=monthly / volume,
        variable_cost_per_user_request=variable,
        gross_margin_per_user_request=rev - variable,
        monthly_fixed_for_break_even=gpu_monthly + fixed,
    )


# -- break-even and crossover ---------------------------------------------------------------------------


class Crossing(_Strict):
    """Where ``cost`` first drops to or below ``other`` in the volume range, and from where it stays there."""

    first: float | None  # user requests/month; None = never within range
    stays_from: float | None  # beyond this volume it is always at or below (None: not within range)
    why: str


def _segments(cfg: Config, dep: Deployment, case: str) -> Iterator[tuple[float, float, int]]:
    """(v_lo, v_hi, replicas) intervals of constant replica count over the volume range."""
    lo, hi = cfg.volume_range
    if dep.kind == "external_api":
        yield lo, hi, 0
        return
    c = cfg.inputs(dep, case)
    cap_tok = capacity_tokens_per_s(dep)
    tok = cfg.workload.prompt_tokens_mean + c.system_prompt_tokens + cfg.workload.output_tokens_mean
    # user volume that one replica carries at the peak provisioning rule
    per_replica = (
        cap_tok * cfg.month_hours * 3600.0 / (tok * c.peak_to_average * (1 + c.reask_rate) * (1 + c.retry_rate))
    )
    v = lo
    while v < hi:
        n = max(c.min_replicas, math.ceil(v / per_replica - 1e-12))
        end = min(hi, n * per_replica)
        if end <= v:  # floating-point edge: step past the boundary
            n += 1
            end = min(hi, n * per_replica)
        yield v, end, n
        v = end


def _linear(f: Callable[[float], float], lo: float, hi: float) -> tuple[float, float]:
    """(intercept, slope) of a function that is linear on [lo, hi] (exact: two evaluations)."""
    a, b = f(lo), f(hi)
    slope = (b - a) / (hi - lo) if hi > lo else 0.0
    return a - slope * lo, slope


def crossing(
    cfg: Config,
    dep: Deployment,
    case: str,
    other: Callable[[float], float],
    never_why: str,
) -> Crossing:
    """First volume where dep's monthly cost <= other(volume) (other linear in volume), solved per segment."""
    first: float | None = None
    last_above: float | None = None  # sup of the volumes where dep is dearer
    for lo, hi, n in _segments(cfg, dep, case):

        def diff(v: float, n: int = n) -> float:
            return evaluate(cfg, dep, case, v, replicas=n or None).monthly_cost - other(v)

        a, s = _linear(diff, lo, hi)
        d_lo, d_hi = a + s * lo, a + s * hi
        x = -a / s if s != 0 else lo  # where the line crosses zero (only used when it does inside)
        if d_lo <= 0 and d_hi <= 0:
            first = lo if first is None else first
        elif d_lo > 0 >= d_hi:
            first = x if first is None else first
            last_above = x
        elif d_lo <= 0 < d_hi:
            first = lo if first is None else first
            last_above = hi
        else:
            last_above = hi
    if first is None:
        return Crossing(first=None, stays_from=None, why=never_why)
    if last_above is None:
        return Crossing(first=first, stays_from=first, why="")
    stays = None if last_above >= cfg.volume_range[1] else last_above
    return Crossing(first=first, stays_from=stays, why="")


def self_vs_api(cfg: Config, dep: Deployment, api: Deployment, case: str) -> Crossing:
    """Monthly user-request volume from which self-hosting ``dep`` is no dearer than ``api`` (same case)."""
    if capacity_tokens_per_s(dep) <= 0:
        return Crossing(
            first=None,
            stays_from=None,
            why=f"never: SLO attainment stays below {dep.slo_target} at every simulated rate",
        )
    # Asymptote: a fully provisioned replica's per-request cost against the API's variable cost.
    hi = cfg.volume_range[1]
    big = evaluate(cfg, dep, case, hi)
    api_big = evaluate(cfg, api, case, hi)
    why = (
        f"never within {cfg.volume_range[0]:.0e}-{hi:.0e}/month: at the top of the range self-hosting costs "
        f"${big.cost_per_user_request:.6f}/request (utilisation {big.utilisation:.2f} of SLO capacity) vs the "
        f"API's ${api_big.cost_per_user_request:.6f}"
    )
    return crossing(cfg, dep, case, lambda v: evaluate(cfg, api, case, v).monthly_cost, why)


def break_even(cfg: Config, dep: Deployment, case: str) -> Crossing:
    """Monthly user requests from which revenue covers every cost (§11.2, replica steps included)."""
    rev = evaluate(cfg, dep, case, cfg.volume_range[0]).revenue_per_user_request
    b = evaluate(cfg, dep, case, cfg.volume_range[1])
    why = (
        f"never within range: revenue ${rev:.6f}/request vs cost ${b.cost_per_user_request:.6f}/request "
        "at the top of the range"
    )
    return crossing(cfg, dep, case, lambda v: rev * v, why)


def simple_break_even(b: Breakdown) -> float | None:
    """The tutorial's one-line formula: monthly fixed cost / gross margin per request (None if margin <= 0)."""
    if b.gross_margin_per_user_request <= 0:
        return None
    return b.monthly_fixed_for_break_even / b.gross_margin_per_user_request


# -- loading --------------------------------------------------------------------------------------------


def load_sweep(path: str | Path, name: str | None = None) -> Throughput:
    """A throughput sweep written by ``costmodel_cli --run-twin`` (or by hand from a measured run)."""
    data = json.loads(Path(path).read_text())
    return Throughput(
        source=f"{name or path} ({data['command']})",
        simulated=bool(data["simulated"]),
        prompt_tokens_mean=data["prompt_tokens_mean"],
        output_tokens_mean=data["output_tokens_mean"],
        points=[SweepPoint(**{k: p[k] for k in SweepPoint.model_fields if k in p}) for p in data["points"]],
    )


def _gpu_price(gpu: str, repo: Path) -> Dated:
    """The catalog's GPU price when it has one, else hardware.yaml's (both dated and sourced)."""
    cat = load_catalog(repo / "configs" / "catalog.yaml")
    p = cat.gpu_price(gpu)
    if p is not None:
        return Dated(usd=p.usd_per_hour, as_of=p.as_of, source=f"configs/catalog.yaml prices.gpus: {p.source}")
    hw = yaml.safe_load((repo / "configs" / "hardware.yaml").read_text())
    for d in hw.get("devices", []):
        if d.get("name") == gpu and d.get("price"):
            pr = d["price"]
            return Dated(
                usd=pr["usd_per_hour"],
                as_of=pr["as_of"],
                source=f"configs/hardware.yaml devices[{gpu}].price: {pr['source']}",
            )
    raise ValueError(f"no dated price for GPU {gpu!r} in configs/catalog.yaml or configs/hardware.yaml")


def _api_prices(model: str, repo: Path) -> tuple[Dated, Dated]:
    p = load_catalog(repo / "configs" / "catalog.yaml").model_price(model)
    if p is None:
        raise ValueError(f"no dated price for model {model!r} in configs/catalog.yaml prices.models")
    src = f"configs/catalog.yaml prices.models: {p.source}"
    return (
        Dated(usd=p.input_per_mtok_usd, as_of=p.as_of, source=src),
        Dated(usd=p.output_per_mtok_usd, as_of=p.as_of, source=src),
    )


def load_config(path: str | Path, repo: Path | None = None) -> Config:
    """Read configs/costmodel.yaml, resolving ``gpu`` / ``model`` prices from the catalog and ``sweep`` files.

    A deployment may give ``gpu_price`` / ``throughput`` inline instead (tests, what-if runs); an inline
    throughput still has to name its source.
    """
    path = Path(path)
    repo = repo or path.resolve().parents[1]
    raw = yaml.safe_load(path.read_text())
    deps = []
    for d in raw.get("deployments", []):
        d = dict(d)
        if d.get("kind") == "self_hosted":
            if "gpu_price" not in d:
                d["gpu_price"] = _gpu_price(d["gpu"], repo)
            sweep = d.pop("sweep", None)
            if sweep is not None:
                d["throughput"] = load_sweep(repo / sweep, name=sweep)
            d.pop("twin", None)  # how the sweep is produced (costmodel_cli twin), not a cost input
        elif d.get("kind") == "external_api" and "input_price_per_mtok" not in d:
            d["input_price_per_mtok"], d["output_price_per_mtok"] = _api_prices(d["model"], repo)
        deps.append(d)
    raw["deployments"] = deps
    if "workload" not in raw:
        # One workload for every deployment: the first sweep's trace means, so the table compares like with like.
        first = next((d["throughput"] for d in deps if "throughput" in d), None)
        if first is None:
            raise ValueError(f"{path}: no workload given and no sweep to take it from")
        t = first if isinstance(first, Throughput) else Throughput(**first)
        raw["workload"] = Workload(
            prompt_tokens_mean=t.prompt_tokens_mean,
            output_tokens_mean=t.output_tokens_mean,
            source=f"trace means of {t.source}",
        )
    raw.pop("twin", None)
    raw.pop("version", None)
    return Config(**raw)
