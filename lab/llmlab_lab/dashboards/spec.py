"""What the dashboards show, as plain data: dashboards, rows, panels, targets (PromQL) and units.

One source for both outputs: :mod:`.build` turns it into Grafana JSON with grafanalib, and
:func:`panels` into the list of raw queries that the snapshot and the tests send to Prometheus.

Conventions (docs/observability.md, "Dashboards"):

- Heavy quantiles (the per-model and per-pool histograms) come from the recording rules
  ``llmlab:*`` (infra/prometheus/rules/); small unlabelled histograms use ``histogram_quantile``.
- Variables are used only as regex matchers, ``model=~"$model"`` / ``pool=~"$pool"``, and every
  template sets ``allValue: .*``, so :func:`.promql.substitute` turns a query into raw PromQL.
- Windows are fixed (``[5m]``, as the recording rules), not ``$__rate_interval``, so the raw query
  is the query Grafana sends. The one exception is Grafana's ``$__range`` (the selected time
  range) in the "in range" stat panels, which count what happened in the range: :func:`panels`
  takes that range in seconds.
- Every aggregation keeps only bounded labels (model, plan, code, pool, engine, ...); GPU panels
  also keep ``instance`` and ``gpu`` because a GPU is a device, not a user.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from . import promql

# Grafana unit ids (https://grafana.com/docs/grafana/latest/panels-visualizations/configure-standard-options/).
SECONDS = "s"
RATIO = "percentunit"  # 0..1 shown as a percentage
PERCENT = "percent"  # 0..100
BYTES = "bytes"
BYTES_PER_S = "Bps"
USD = "currencyUSD"
REQ_PER_S = "reqps"
PER_S = "ops"
WATT = "watt"
COUNT = "short"
TOKENS_PER_S = "suffix: tok/s"
TOKENS_PER_J = "suffix: tok/J"

Kind = Literal["timeseries", "stat"]
Shape = Literal["matrix", "vector"]

# The recording rules the dashboards read (infra/prometheus/rules/): the contract, name by name.
RECORDING_RULES = (
    "llmlab:gateway_requests:rate5m",  # by endpoint, model, plan, status, code
    "llmlab:gateway_5xx:ratio_rate5m",
    "llmlab:gateway_ttft_seconds:p50_5m",  # by model
    "llmlab:gateway_ttft_seconds:p95_5m",
    "llmlab:gateway_tpot_seconds:p95_5m",
    "llmlab:gateway_e2e_seconds:p95_5m",
    "llmlab:worker_itl_seconds:p95_5m",  # by pool
    "llmlab:worker_nats_queue_seconds:p95_5m",
    "llmlab:worker_engine_queue_seconds:p95_5m",
    "llmlab:gateway_completion_tokens:rate5m",  # by model
    "llmlab:router_queue_pending_messages:max",  # by pool
    "llmlab:accounting_events_stream:fullness_ratio",
)
# Names the dashboards may read besides docs/observability.md's and the rules: the process
# collector's, Prometheus's own `up`, and DCGM-exporter's.
OTHER_NAME_PREFIXES = ("process_", "DCGM_FI_")
OTHER_NAMES = ("up",)

VARIABLE_QUERIES = {
    "model": "label_values(llmlab_gateway_requests_total, model)",
    "pool": "label_values(llmlab_worker_attempts_total, pool)",
}


@dataclass(frozen=True)
class Target:
    expr: str  # PromQL, may use $model / $pool as regex matchers
    legend: str = ""  # Grafana legend format, e.g. "{{pool}}"


@dataclass(frozen=True)
class Panel:
    title: str
    unit: str
    targets: tuple[Target, ...]
    description: str
    kind: Kind = "timeseries"
    width: int = 8  # of 24 grid columns
    stack: bool = False
    threshold: float | None = None  # drawn red from this value on
    # Why the panel may show no data: its series exist only after an event a healthy run may not
    # have (a retry, a preemption). Empty: the panel must have data whenever the stack served
    # traffic (tests/e2e/test_observability.py requires it).
    empty_because: str = ""


@dataclass(frozen=True)
class Row:
    title: str
    panels: tuple[Panel, ...]


@dataclass(frozen=True)
class Dashboard:
    file: str  # under infra/grafana/dashboards/
    uid: str
    title: str
    description: str
    rows: tuple[Row, ...]
    variables: tuple[str, ...] = ("model", "pool")
    tags: tuple[str, ...] = field(default=("llmlab",))


@dataclass(frozen=True)
class PanelQuery:
    """One panel as raw Prometheus sees it.

    ``exprs`` are the targets' queries with every variable replaced by ``.*``; ``shape`` is what
    the panel reads: ``matrix`` (a time series panel: ``/api/v1/query_range``) or ``vector`` (a
    stat panel: its last value, ``/api/v1/query``). ``unit`` is the Grafana unit id.
    """

    dashboard: str  # file name
    row: str
    title: str
    exprs: tuple[str, ...]
    legends: tuple[str, ...]
    shape: Shape
    unit: str
    stacked: bool = False
    threshold: float | None = None
    empty_because: str = ""  # see Panel.empty_because

    @property
    def queries(self) -> tuple[str, ...]:
        """The raw PromQL of every target (the same as ``exprs``)."""
        return self.exprs

    @property
    def endpoint(self) -> str:
        return "/api/v1/query_range" if self.shape == "matrix" else "/api/v1/query"


def _t(expr: str, legend: str = "") -> Target:
    return Target(" ".join(expr.split()), legend)


def _p(
    title: str,
    unit: str,
    *targets: Target,
    about: str,
    kind: Kind = "timeseries",
    width: int = 8,
    stack: bool = False,
    threshold: float | None = None,
    empty_because: str = "",
) -> Panel:
    return Panel(
        title,
        unit,
        tuple(targets),
        about,
        kind=kind,
        width=width,
        stack=stack,
        threshold=threshold,
        empty_because=empty_because,
    )


def _mean(family: str, selector: str, by: str = "") -> str:
    """Mean of a histogram over 5 m: rate(sum) / rate(count), optionally kept apart by labels."""
    agg = f"sum by ({by})" if by else "sum"
    return f"{agg} (rate({family}_sum{selector}[5m])) / {agg} (rate({family}_count{selector}[5m]))"


def _p95(family: str, by: str = "") -> str:
    keep = f"le, {by}" if by else "le"
    return f"histogram_quantile(0.95, sum by ({keep}) (rate({family}_bucket[5m])))"


M = '{model=~"$model"}'
P = '{pool=~"$pool"}'

SERVICE_HEALTH = Row(
    "Service health",
    (
        _p(
            "Requests/s",
            REQ_PER_S,
            _t(f"sum(llmlab:gateway_requests:rate5m{M})", "requests/s"),
            about="Gateway requests per second over 5 m, every endpoint and outcome.",
            kind="stat",
            width=6,
        ),
        _p(
            "5xx ratio",
            RATIO,
            _t("max(llmlab:gateway_5xx:ratio_rate5m)", "5xx"),
            about="Share of gateway responses with a 5xx status over 5 m (the alert fires above 2% for 10 m).",
            kind="stat",
            width=6,
            threshold=0.02,
        ),
        _p(
            "In-flight requests",
            COUNT,
            _t("sum(llmlab_gateway_in_flight_requests)", "in flight"),
            about="Requests the gateways hold open now (streams included).",
            kind="stat",
            width=6,
        ),
        _p(
            "Targets down",
            COUNT,
            _t("count(up == 0) or vector(0)", "down"),
            about="Scrape targets Prometheus cannot reach now.",
            kind="stat",
            width=6,
            threshold=1,
        ),
        _p(
            "Requests/s by status and code",
            REQ_PER_S,
            _t(f"sum by (status, code) (llmlab:gateway_requests:rate5m{M})", "{{status}} {{code}}"),
            about="Gateway requests per second by HTTP status and error code (ok, timeouts, client_closed apart).",
        ),
        _p(
            "5xx ratio over time",
            RATIO,
            _t("llmlab:gateway_5xx:ratio_rate5m", "5xx ratio"),
            about="Share of 5xx responses over 5 m; the red line is the 2% alert threshold.",
            threshold=0.02,
        ),
        _p(
            "Scrape targets up",
            COUNT,
            _t("sum by (job) (up)", "{{job}}"),
            about="Targets answering their scrape, per job.",
        ),
        _p(
            "Process CPU",
            RATIO,
            _t("sum by (job) (rate(process_cpu_seconds_total[5m]))", "{{job}}"),
            about="CPU seconds per second per job: 100% is one core.",
        ),
        _p(
            "Resident memory",
            BYTES,
            _t("sum by (job) (process_resident_memory_bytes)", "{{job}}"),
            about="Resident set size per job (all replicas summed).",
        ),
        _p(
            "Network",
            BYTES_PER_S,
            _t("sum by (job) (rate(llmlab_process_network_receive_bytes_total[5m]))", "rx {{job}}"),
            _t("sum by (job) (rate(llmlab_process_network_transmit_bytes_total[5m]))", "tx {{job}}"),
            about="Bytes per second received and sent by each job's network namespace (loopback excluded).",
        ),
        _p(
            "Restarts (1 h)",
            COUNT,
            _t("sum by (job) (changes(process_start_time_seconds[1h]))", "{{job}}"),
            _t("max(increase(llmlab_host_oom_kills_total[1h]))", "host OOM kills"),
            about="Process restarts in the last hour (a change of the start time), and the kernel's OOM "
            "kills on the host in the same hour: both rising together is an OOM kill.",
        ),
        _p(
            "Open file descriptors",
            COUNT,
            _t("sum by (job) (process_open_fds)", "{{job}}"),
            about="Open files and sockets per job.",
        ),
        _p(
            "Live workers and ready engines",
            COUNT,
            _t(f"max by (pool) (llmlab_gateway_live_workers{P})", "live workers {{pool}}"),
            _t(f"sum by (pool) (llmlab_worker_engine_ready{P})", "engines ready {{pool}}"),
            about="Workers the gateway hears heartbeats from, and workers whose engine answers, per pool.",
        ),
    ),
)

USER_EXPERIENCE = Row(
    "User experience",
    (
        _p(
            "TTFT p50 / p95",
            SECONDS,
            _t(f"llmlab:gateway_ttft_seconds:p50_5m{M}", "p50 {{model}}"),
            _t(f"llmlab:gateway_ttft_seconds:p95_5m{M}", "p95 {{model}}"),
            about="Time to first token at the gateway (what the client sees), per model, over 5 m.",
        ),
        _p(
            "TPOT p95",
            SECONDS,
            _t(f"llmlab:gateway_tpot_seconds:p95_5m{M}", "{{model}}"),
            about="Time per output token after the first, (E2E - TTFT) / (tokens - 1), p95 per model.",
        ),
        _p(
            "E2E p95",
            SECONDS,
            _t(f"llmlab:gateway_e2e_seconds:p95_5m{M}", "{{model}}"),
            about="Request end-to-end latency at the gateway, p95 per model.",
        ),
        _p(
            "ITL p95",
            SECONDS,
            _t(f"llmlab:worker_itl_seconds:p95_5m{P}", "{{pool}}"),
            about="Gap between streamed engine chunks, p95 per pool.",
        ),
        _p(
            "Success ratio",
            RATIO,
            _t(
                f'sum by (model) (llmlab:gateway_requests:rate5m{{code="ok",model=~"$model"}})'
                f" / sum by (model) (llmlab:gateway_requests:rate5m{M})",
                "{{model}}",
            ),
            about="Share of requests that ended with code ok, per model.",
        ),
        _p(
            "Failures/s by code",
            REQ_PER_S,
            _t('sum by (code) (llmlab:gateway_requests:rate5m{code!="ok",model=~"$model"})', "{{code}}"),
            about="Requests per second that did not end ok, by code: timeouts apart from server errors and refusals.",
            empty_because="no request has failed since the gateway started",
        ),
        _p(
            "Requests/s by model and plan",
            REQ_PER_S,
            _t(f"sum by (model, plan) (llmlab:gateway_requests:rate5m{M})", "{{model}} {{plan}}"),
            about="Traffic per model and tenant plan.",
        ),
        _p(
            "Requests in range by status",
            COUNT,
            _t(f"sum by (status) (increase(llmlab_gateway_requests_total{M}[$__range]))", "{{status}}"),
            about="Gateway requests answered in the selected time range, by HTTP status. Exact when the range "
            "ends at a scrape and starts before the series' first sample: the gateway creates each catalog "
            "model's success series at 0, so Prometheus's increase() has nothing to extrapolate.",
            kind="stat",
            width=8,
        ),
        _p(
            "Tokens in range",
            COUNT,
            _t(f"sum by (model) (increase(llmlab_gateway_prompt_tokens_total{M}[$__range]))", "prompt {{model}}"),
            _t(
                f"sum by (model) (increase(llmlab_gateway_completion_tokens_total{M}[$__range]))",
                "completion {{model}}",
            ),
            about="Prompt and completion tokens of the requests answered in the selected range, per model "
            "(the token counters of every catalog model start at 0, as the success series).",
            kind="stat",
            width=8,
        ),
        _p(
            "Tokens/s",
            TOKENS_PER_S,
            _t(f"llmlab:gateway_completion_tokens:rate5m{M}", "completion {{model}}"),
            _t(f"sum by (model) (rate(llmlab_gateway_prompt_tokens_total{M}[5m]))", "prompt {{model}}"),
            about="Completion and prompt tokens per second, per model (kept apart from requests/s).",
        ),
    ),
)

GPU_EFFICIENCY = Row(
    "GPU efficiency",
    (
        _p(
            "GPU utilisation",
            PERCENT,
            _t("avg by (instance, gpu) (DCGM_FI_DEV_GPU_UTIL)", "{{instance}} gpu {{gpu}}"),
            about="DCGM GPU utilisation per device (simulated on the engine simulator: label simulated=true).",
        ),
        _p(
            "GPU memory used",
            BYTES,
            _t("sum by (instance, gpu) (DCGM_FI_DEV_FB_USED) * 1048576", "{{instance}} gpu {{gpu}}"),
            about="Frame buffer in use per device (DCGM reports MiB).",
        ),
        _p(
            "GPU memory use",
            RATIO,
            _t(
                "sum by (instance, gpu) (DCGM_FI_DEV_FB_USED) / (sum by (instance, gpu) (DCGM_FI_DEV_FB_USED)"
                " + sum by (instance, gpu) (DCGM_FI_DEV_FB_FREE))",
                "{{instance}} gpu {{gpu}}",
            ),
            about="Used / (used + free) frame buffer per device.",
        ),
        _p(
            "GPU power",
            WATT,
            _t("sum by (instance, gpu) (DCGM_FI_DEV_POWER_USAGE)", "{{instance}} gpu {{gpu}}"),
            about="Board power draw per device.",
        ),
        _p(
            "Completion tokens per joule",
            TOKENS_PER_J,
            _t("sum(llmlab:gateway_completion_tokens:rate5m) / sum(DCGM_FI_DEV_POWER_USAGE)", "tokens/J"),
            about="Completion tokens per second over the GPUs' total watts: energy efficiency of serving.",
        ),
        _p(
            "Engine batch size",
            COUNT,
            _t(f"avg by (pool, engine) (llmlab_worker_engine_batch_size{P})", "{{pool}} {{engine}}"),
            about="Sequences in the engine's running batch, averaged over a pool's workers.",
        ),
        _p(
            "Worker slots in use",
            RATIO,
            _t(
                f"sum by (pool) (llmlab_worker_in_flight_requests{P})"
                f" / sum by (pool) (llmlab_worker_capacity_requests{P})",
                "{{pool}}",
            ),
            about="In-flight attempts over the workers' capacity, per pool.",
        ),
    ),
)

SCHEDULER = Row(
    "Scheduler",
    (
        _p(
            "Engine running / waiting",
            COUNT,
            _t(f"sum by (pool) (llmlab_worker_engine_running_requests{P})", "running {{pool}}"),
            _t(f"sum by (pool) (llmlab_worker_engine_waiting_requests{P})", "waiting {{pool}}"),
            about="Requests the engines run and hold waiting, per pool (from the engines' own metrics).",
        ),
        _p(
            "JetStream pending",
            COUNT,
            _t(f"llmlab:router_queue_pending_messages:max{P}", "pending {{pool}}"),
            _t(f"max by (pool) (llmlab_router_queue_ack_pending_messages{P})", "ack pending {{pool}}"),
            about="Attempts waiting in NATS for a worker (pending) and taken but not yet acked, per pool.",
        ),
        _p(
            "Queued attempts by priority",
            COUNT,
            _t(f"sum by (pool, priority) (llmlab_gateway_queued_attempts{P})", "{{pool}} priority {{priority}}"),
            about="Attempts the gateways published that no worker has taken yet, per pool and plan priority "
            "(JetStream's pending count cannot tell priorities apart).",
        ),
        _p(
            "Queue time p95",
            SECONDS,
            _t(f"llmlab:worker_nats_queue_seconds:p95_5m{P}", "NATS {{pool}}"),
            _t(f"llmlab:worker_engine_queue_seconds:p95_5m{P}", "engine {{pool}}"),
            about="p95 wait in NATS (dispatch to take) and inside the engine before scheduling, per pool.",
        ),
        _p(
            "Attempts/s by outcome",
            PER_S,
            _t(f"sum by (pool, outcome) (rate(llmlab_worker_attempts_total{P}[5m]))", "{{pool}} {{outcome}}"),
            about="Worker attempts per second by pool and outcome.",
        ),
        _p(
            "Router decisions/s",
            PER_S,
            _t("sum by (policy, deployment) (rate(llmlab_router_decisions_total[5m]))", "{{policy}} {{deployment}}"),
            about="Routing decisions per second by policy and chosen deployment.",
        ),
        _p(
            "Router decision outcomes/s",
            PER_S,
            _t("sum by (outcome) (rate(llmlab_router_decisions_total[5m]))", "{{outcome}}"),
            about="Routing decisions per second by outcome.",
        ),
        _p(
            "Retries and fallbacks/s",
            PER_S,
            _t(f"sum by (model) (rate(llmlab_gateway_retries_total{M}[5m]))", "retries {{model}}"),
            _t("sum by (why) (rate(llmlab_gateway_router_fallbacks_total[5m]))", "self-routed: {{why}}"),
            about="Attempts beyond the first (the fallback chain in use) and decisions the gateway made alone.",
            empty_because="no retry, fallback or self-routed decision since the gateway started",
        ),
        _p(
            "Router decision time p95",
            SECONDS,
            _t(_p95("llmlab_router_decision_seconds"), "p95"),
            about="Time the router takes for one decision, p95 over 5 m.",
        ),
    ),
)

CACHE = Row(
    "Cache",
    (
        _p(
            "KV cache usage",
            RATIO,
            _t(f"max by (pool, engine) (llmlab_worker_engine_kv_cache_usage_ratio{P})", "{{pool}} {{engine}}"),
            about="KV cache blocks in use, the fullest worker of each pool.",
        ),
        _p(
            "Prefix cache hit ratio",
            RATIO,
            _t(f"avg by (pool, engine) (llmlab_worker_engine_prefix_cache_hit_ratio{P})", "{{pool}} {{engine}}"),
            about="Prompt tokens served from the prefix cache, averaged over a pool's workers.",
        ),
        _p(
            "Preemptions/s",
            PER_S,
            _t(f"sum by (pool, engine) (rate(llmlab_worker_engine_preemptions_total{P}[5m]))", "{{pool}} {{engine}}"),
            about="Sequences the engines preempted (KV ran out: recompute or swap), per second.",
            empty_because="no engine reports a preemption counter (the worker exports one only from the engine's)",
        ),
    ),
)

COST = Row(
    "Cost",
    (
        _p(
            "GPU cost per hour",
            USD,
            _t(f"max by (model) (llmlab_accounting_gpu_cost_usd_per_hour{M})", "{{model}}"),
            about="GPU dollars per hour attributed to each model (idle time included), from accounting.",
        ),
        _p(
            "GPU cost per request",
            USD,
            _t(f"max by (model) (llmlab_accounting_gpu_cost_usd_per_request{M})", "{{model}}"),
            about="GPU dollars per request, per model.",
        ),
        _p(
            "GPU cost per 1M tokens",
            USD,
            _t(f"max by (model) (llmlab_accounting_gpu_cost_usd_per_mtok{M})", "{{model}}"),
            about="GPU dollars per million tokens, per model.",
        ),
        _p(
            "Events stream fullness",
            RATIO,
            _t("llmlab:accounting_events_stream:fullness_ratio", "fullness"),
            about="Bytes in the NATS events stream over its limit: accounting and settlement falling behind.",
            threshold=0.8,
        ),
        _p(
            "Accounting ingest lag p95",
            SECONDS,
            _t(_p95("llmlab_accounting_ingest_lag_seconds"), "p95"),
            about="Event time to the row in ClickHouse, p95 over 5 m.",
        ),
        _p(
            "Accounting events and rows/s",
            PER_S,
            _t("sum by (kind) (rate(llmlab_accounting_events_total[5m]))", "events {{kind}}"),
            _t("sum by (table) (rate(llmlab_accounting_rows_total[5m]))", "rows {{table}}"),
            about="Events consumed by kind (dead_letter counts dead letters) and rows written per table.",
        ),
        _p(
            "Events consumers pending",
            COUNT,
            _t("max by (consumer) (llmlab_accounting_consumer_pending_messages)", "{{consumer}}"),
            about="Messages each durable consumer of the events stream has not taken yet.",
        ),
        _p(
            "Budget refusals/s",
            PER_S,
            _t("sum by (reason) (rate(llmlab_budget_refusals_total[5m]))", "{{reason}}"),
            about="Requests the budget service refused before any GPU work, by reason.",
            empty_because="the budget service has refused nothing since it started",
        ),
    ),
)

_STAGES = (
    ("NATS queue", "llmlab_worker_nats_queue_seconds"),
    ("engine queue", "llmlab_worker_engine_queue_seconds"),
    ("prefill", "llmlab_worker_prefill_seconds"),
    ("decode", "llmlab_worker_decode_seconds"),
)

WHERE_THE_TIME_GOES = Row(
    "Where the time goes",
    (
        _p(
            "Mean time per attempt by stage",
            SECONDS,
            *(_t(_mean(family, P), stage) for stage, family in _STAGES),
            about=(
                "Mean seconds per attempt in each stage, stacked: NATS queue (dispatch to take), engine queue "
                "(before scheduling), prefill (engine queue to first token), decode (first to last token). "
                "A slow response is the tallest band."
            ),
            width=12,
            stack=True,
        ),
        _p(
            "Mean E2E: gateway vs worker",
            SECONDS,
            _t(_mean("llmlab_gateway_e2e_seconds", M), "gateway"),
            _t(_mean("llmlab_worker_e2e_seconds", P), "worker"),
            about="The gap between the two lines is admission, routing and the token relay.",
            width=12,
        ),
        *(
            _p(
                f"Mean {stage} by pool",
                SECONDS,
                _t(_mean(family, P, "pool"), "{{pool}}"),
                about=f"Mean {stage} seconds per attempt, per pool.",
                width=6,
            )
            for stage, family in _STAGES
        ),
    ),
)

TAILS = Row(
    "Tails (p95)",
    (
        _p(
            "TTFT p95",
            SECONDS,
            _t(f"llmlab:gateway_ttft_seconds:p95_5m{M}", "{{model}}"),
            about="Time to first token at the gateway, p95 per model.",
            width=6,
        ),
        _p(
            "Queue time p95",
            SECONDS,
            _t(f"llmlab:worker_nats_queue_seconds:p95_5m{P}", "NATS {{pool}}"),
            _t(f"llmlab:worker_engine_queue_seconds:p95_5m{P}", "engine {{pool}}"),
            about="p95 wait in NATS and in the engine queue, per pool.",
            width=6,
        ),
        _p(
            "ITL p95",
            SECONDS,
            _t(f"llmlab:worker_itl_seconds:p95_5m{P}", "{{pool}}"),
            about="p95 gap between engine chunks, per pool.",
            width=6,
        ),
        _p(
            "E2E p95",
            SECONDS,
            _t(f"llmlab:gateway_e2e_seconds:p95_5m{M}", "{{model}}"),
            about="End-to-end latency at the gateway, p95 per model.",
            width=6,
        ),
    ),
)

CONTROL_PLANE = Row(
    "Admission and control plane",
    (
        _p(
            "Admission time p95 by step",
            SECONDS,
            _t(_p95("llmlab_gateway_admission_seconds", "step"), "{{step}}"),
            about="Gateway admission before dispatch: auth + budget reservation, and routing, p95 over 5 m.",
        ),
        _p(
            "Router decision time p95",
            SECONDS,
            _t(_p95("llmlab_router_decision_seconds"), "p95"),
            about="Time the router takes for one decision, p95 over 5 m.",
        ),
        _p(
            "Budget settlement lag p95",
            SECONDS,
            _t(_p95("llmlab_budget_settlement_lag_seconds"), "p95"),
            about="Request end (event time) to settled in Redis, p95 over 5 m.",
        ),
    ),
)

DASHBOARDS: tuple[Dashboard, ...] = (
    Dashboard(
        file="llmlab-operations.json",
        uid="llmlab-operations",
        title="llm-inference-lab / operations",
        description="Service health, user experience, GPU efficiency, scheduler, cache and cost (tutorial §7).",
        rows=(SERVICE_HEALTH, USER_EXPERIENCE, GPU_EFFICIENCY, SCHEDULER, CACHE, COST),
    ),
    Dashboard(
        file="llmlab-latency.json",
        uid="llmlab-latency",
        title="llm-inference-lab / latency attribution",
        description="Where a slow response spent its time: NATS queue, engine queue, prefill, decode, admission.",
        rows=(WHERE_THE_TIME_GOES, TAILS, CONTROL_PLANE),
    ),
)


# Grafana's built-in variables the panels may use besides the dashboard's own.
BUILTIN_VARIABLES = ("__range",)
DEFAULT_RANGE_S = 3600  # the dashboards' default time range, now-1h .. now


def panels(dashboards: tuple[Dashboard, ...] = DASHBOARDS, range_s: float = DEFAULT_RANGE_S) -> list[PanelQuery]:
    """Every panel of every dashboard, with raw PromQL: variables replaced by ``.*``, and
    ``$__range`` by ``range_s`` (the selected time range, whole milliseconds as Grafana sends it)."""
    values = {"__range": f"{round(range_s * 1000)}ms"}
    out = []
    for d in dashboards:
        for row in d.rows:
            for p in row.panels:
                out.append(
                    PanelQuery(
                        dashboard=d.file,
                        row=row.title,
                        title=p.title,
                        exprs=tuple(promql.substitute(t.expr, values) for t in p.targets),
                        legends=tuple(t.legend for t in p.targets),
                        shape="vector" if p.kind == "stat" else "matrix",
                        unit=p.unit,
                        stacked=p.stack,
                        threshold=p.threshold,
                        empty_because=p.empty_because,
                    )
                )
    return out
