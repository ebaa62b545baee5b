"""What differs between the vLLM and SGLang faces: metric names, labels, buckets, and the health
and info endpoints. Everything else (OpenAI endpoints, the scheduler) is shared.

Names, labels, help texts and bucket bounds are copied from the engines' sources:
vLLM 0.32 ``vllm/v1/metrics/loggers.py`` + ``buckets.py`` (labels ``model_name``, ``engine``);
SGLang ``python/sglang/srt/metrics/collector.py`` (scheduler metrics labelled ``model_name``,
``engine_type``, ``tp_rank``, ``pp_rank``; tokenizer metrics ``model_name``, ``engine_type``).

Metrics are plain-Python accumulators updated by the scheduler's observer hooks (no locks, one
bulk histogram update per tick) and turned into Prometheus families only when scraped; the
gauges (running, waiting, KV usage) are read from the scheduler at scrape time.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from llmlab_engine_sim import protocol
from llmlab_engine_sim.scheduler import LoopScheduler, SchedulerObserver, SimRequest
from llmlab_engine_sim.settings import SimSettings

if TYPE_CHECKING:
    from llmlab_engine_sim.engine import SimEngine

VLLM_VERSION = "0.32.0"  # the vLLM release whose metric names the vllm flavour copies
SGLANG_VERSION = "0.5.4"
KV_BLOCK_SIZE = 16  # vLLM's default block size: its KV usage is counted in whole blocks


class Histogram:
    """Cumulative-on-read histogram; ``observe(value, n)`` records ``n`` equal observations."""

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(float(b) for b in bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # last: above every bound (+Inf)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float, n: int = 1) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += n
        self.sum += value * n
        self.count += n

    def buckets(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        acc = 0
        for bound, c in zip(self.bounds, self.counts, strict=False):
            acc += c
            out.append((floatToGoString(bound), acc))
        out.append(("+Inf", self.count))
        return out


def _counter(name: str, doc: str, labels: dict[str, str], value: float) -> CounterMetricFamily:
    fam = CounterMetricFamily(name, doc, labels=list(labels))
    fam.add_metric(list(labels.values()), value)
    return fam


def _gauge(name: str, doc: str, labels: dict[str, str], value: float) -> GaugeMetricFamily:
    fam = GaugeMetricFamily(name, doc, labels=list(labels))
    fam.add_metric(list(labels.values()), value)
    return fam


def _histogram(name: str, doc: str, labels: dict[str, str], h: Histogram) -> HistogramMetricFamily:
    fam = HistogramMetricFamily(name, doc, labels=list(labels))
    fam.add_metric(list(labels.values()), h.buckets(), h.sum)
    return fam


class EngineMetrics(SchedulerObserver):
    """Observer of the scheduler and Prometheus collector of one flavour."""

    def __init__(self, settings: SimSettings) -> None:
        self.settings = settings
        self._scheduler: LoopScheduler | None = None

    def bind(self, scheduler: LoopScheduler) -> None:
        self._scheduler = scheduler

    @property
    def scheduler(self) -> LoopScheduler:
        if self._scheduler is None:
            raise RuntimeError("metrics not bound to a scheduler")
        return self._scheduler

    def collect(self) -> Iterable[Metric]:
        raise NotImplementedError

    def twin(self) -> Any:
        """The twin's step scheduler core (``--mode twin``), or None in the fixed-latency mode."""
        return getattr(self.scheduler, "core", None)

    def used_tokens(self, block_size: int = 1) -> int:
        """KV-cache tokens held by running requests (prompt + generated), in whole blocks."""
        core = self.twin()
        if core is not None:  # twin: the paged KV cache's blocks in use
            return int(core.kv.used_blocks * core.kv.block_size)
        total = 0
        for r in self.scheduler.running_requests():
            n = r.prompt_tokens + r.generated
            total += -(-n // block_size) * block_size
        return total


# -- vLLM -----------------------------------------------------------------------------------------

# vllm/v1/metrics/buckets.py
_VLLM_REQUEST_LATENCY = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
    960.0, 1920.0, 7680.0,
)  # fmt: skip
_VLLM_TTFT = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
    80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
_VLLM_ITL = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
VLLM_FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")


def _build_1_2_5(max_value: int) -> list[float]:
    out: list[float] = []
    exp = 0
    while True:
        for m in (1, 2, 5):
            v = m * 10**exp
            if v > max_value:
                return out
            out.append(v)
        exp += 1


class VllmMetrics(EngineMetrics):
    def __init__(self, settings: SimSettings) -> None:
        super().__init__(settings)
        self.labels = {"model_name": settings.model, "engine": "0"}
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0  # no prefix cache in the fixed-latency model
        self.preemptions = 0  # no preemption in the fixed-latency model
        self.success = dict.fromkeys(VLLM_FINISH_REASONS, 0)
        self.ttft = Histogram(_VLLM_TTFT)
        self.itl = Histogram(_VLLM_ITL)
        self.e2e = Histogram(_VLLM_REQUEST_LATENCY)
        self.queue = Histogram(_VLLM_REQUEST_LATENCY)
        self.prefill = Histogram(_VLLM_REQUEST_LATENCY)
        self.decode = Histogram(_VLLM_REQUEST_LATENCY)
        self.inference = Histogram(_VLLM_REQUEST_LATENCY)
        token_buckets = _build_1_2_5(settings.max_model_len)
        self.req_prompt_tokens = Histogram(token_buckets)
        self.req_generation_tokens = Histogram(token_buckets)

    def tokens_emitted(self, now: float, first: list[SimRequest], decode_count: int, itl: float) -> None:
        self.generation_tokens += decode_count + len(first)
        if decode_count:
            self.itl.observe(itl, decode_count)
        for r in first:
            # vLLM counts prompt tokens (and prefix-cache queries) when the prefill is computed.
            self.prompt_tokens += r.prompt_tokens
            self.prefix_cache_queries += r.prompt_tokens
            if r.ttft is not None:
                self.ttft.observe(r.ttft)

    def request_finished(self, req: SimRequest, now: float) -> None:
        reason = req.finish_reason or "abort"
        self.success[reason] = self.success.get(reason, 0) + 1
        if req.e2e is not None:
            self.e2e.observe(req.e2e)
        if req.admitted_at is None:
            return
        if req.queue_time is not None:
            self.queue.observe(req.queue_time)
        if req.first_token_at is not None and req.last_token_at is not None:
            self.prefill.observe(req.first_token_at - req.admitted_at)
            self.decode.observe(req.last_token_at - req.first_token_at)
            self.inference.observe(req.last_token_at - req.admitted_at)
        self.req_prompt_tokens.observe(req.prompt_tokens)
        self.req_generation_tokens.observe(req.generated)

    def collect(self) -> Iterable[Metric]:
        s = self.scheduler
        lb = self.labels
        yield _gauge("vllm:num_requests_running", "Number of requests in model execution batches.", lb, s.num_running)
        yield _gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", lb, s.num_waiting)
        core = self.twin()
        if core is None:
            usage = min(1.0, self.used_tokens(KV_BLOCK_SIZE) / self.settings.kv_cache_tokens)
            queries, hits, preemptions = self.prefix_cache_queries, self.prefix_cache_hits, self.preemptions
        else:  # twin mode: the simulated paged KV cache and prefix cache
            usage = core.kv.usage
            st = core.stats
            queries, hits, preemptions = st.prefix_queries, st.prefix_hits, st.preemptions
        yield _gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", lb, usage)
        yield _counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            lb,
            queries,
        )
        yield _counter(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            lb,
            hits,
        )
        yield _counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", lb, preemptions)
        yield _counter("vllm:prompt_tokens", "Number of prefill tokens processed.", lb, self.prompt_tokens)
        yield _counter("vllm:generation_tokens", "Number of generation tokens processed.", lb, self.generation_tokens)
        success = CounterMetricFamily(
            "vllm:request_success",
            "Count of successfully processed requests.",
            labels=[*lb, "finished_reason"],
        )
        for reason, n in self.success.items():
            success.add_metric([*lb.values(), reason], n)
        yield success
        yield _histogram(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", lb, self.req_prompt_tokens
        )
        yield _histogram(
            "vllm:request_generation_tokens",
            "Number of generation tokens processed.",
            lb,
            self.req_generation_tokens,
        )
        yield _histogram(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", lb, self.ttft
        )
        yield _histogram(
            "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", lb, self.itl
        )
        yield _histogram(
            "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", lb, self.e2e
        )
        yield _histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            lb,
            self.queue,
        )
        yield _histogram(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            lb,
            self.inference,
        )
        yield _histogram(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            lb,
            self.prefill,
        )
        yield _histogram(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            lb,
            self.decode,
        )


# -- SGLang ---------------------------------------------------------------------------------------

# python/sglang/srt/metrics/collector.py (TokenizerMetricsCollector / SchedulerMetricsCollector)
_SGL_TTFT = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
_SGL_E2E = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800, 2400)
_SGL_ITL = (
    0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080, 0.100, 0.200,
    0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000,
)  # fmt: skip
_SGL_QUEUE = (
    0.0, 0.1, 0.2, 0.5, 1, 2, 3, 4, 5, 10, 15, 20, 30, 40, 50, 60, 70, 80, 90, 100, 200, 300, 400, 500, 600,
    700, 800, 900, 1000, 1200, 1400, 1600, 1800, 2000, 2500, 3000,
)  # fmt: skip
_GEN_THROUGHPUT_WINDOW_S = 1.0


class SglangMetrics(EngineMetrics):
    def __init__(self, settings: SimSettings) -> None:
        super().__init__(settings)
        self.scheduler_labels = {"model_name": settings.model, "engine_type": "unified", "tp_rank": "0", "pp_rank": "0"}
        self.tokenizer_labels = {"model_name": settings.model, "engine_type": "unified"}
        # SGLang's tokenizer manager counts tokens and requests when a request finishes.
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.cached_tokens = 0
        self.num_requests = 0
        self.num_aborted = 0
        self.ttft = Histogram(_SGL_TTFT)
        self.itl = Histogram(_SGL_ITL)
        self.e2e = Histogram(_SGL_E2E)
        self.queue = Histogram(_SGL_QUEUE)
        self._throughput = 0.0
        self._tp_mark: tuple[float, int] | None = None

    def request_admitted(self, req: SimRequest, now: float) -> None:
        if req.queue_time is not None:
            self.queue.observe(req.queue_time)

    def tokens_emitted(self, now: float, first: list[SimRequest], decode_count: int, itl: float) -> None:
        if decode_count:
            self.itl.observe(itl, decode_count)
        for r in first:
            if r.ttft is not None:
                self.ttft.observe(r.ttft)

    def request_finished(self, req: SimRequest, now: float) -> None:
        self.num_requests += 1
        self.prompt_tokens += req.prompt_tokens
        self.generation_tokens += req.generated
        if req.finish_reason == "abort":
            self.num_aborted += 1
        if req.e2e is not None:
            self.e2e.observe(req.e2e)

    def gen_throughput(self) -> float:
        """Generated tokens/s over the last window (SGLang reports it per decode log interval)."""
        s = self.scheduler
        now, total = s.clock.now(), s.stats.generation_tokens
        if self._tp_mark is None:
            self._tp_mark = (now, total)
        else:
            t0, n0 = self._tp_mark
            if now - t0 >= _GEN_THROUGHPUT_WINDOW_S:
                self._throughput = (total - n0) / (now - t0)
                self._tp_mark = (now, total)
        return self._throughput if s.num_running else 0.0

    def collect(self) -> Iterable[Metric]:
        s = self.scheduler
        sl, tl = self.scheduler_labels, self.tokenizer_labels
        used = self.used_tokens()
        core = self.twin()
        capacity = self.settings.kv_cache_tokens if core is None else core.kv.total * core.kv.block_size
        hit_rate = 0.0
        cached = self.cached_tokens
        if core is not None:
            st = core.stats
            hit_rate = st.prefix_hits / st.prefix_queries if st.prefix_queries else 0.0
            cached = st.prefix_hits
        yield _gauge("sglang:num_running_reqs", "The number of running requests.", sl, s.num_running)
        yield _gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", sl, s.num_waiting)
        yield _gauge("sglang:num_used_tokens", "The number of used tokens.", sl, used)
        yield _gauge("sglang:token_usage", "The token usage.", sl, min(1.0, used / capacity))
        yield _gauge("sglang:gen_throughput", "The generation throughput (token/s).", sl, self.gen_throughput())
        yield _gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", sl, hit_rate)
        yield _gauge(
            "sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.", sl, capacity
        )
        yield _histogram("sglang:queue_time_seconds", "Histogram of queueing time in seconds.", sl, self.queue)
        yield _counter("sglang:prompt_tokens_total", "Number of prefill tokens processed.", tl, self.prompt_tokens)
        yield _counter(
            "sglang:generation_tokens_total", "Number of generation tokens processed.", tl, self.generation_tokens
        )
        yield _counter("sglang:cached_tokens_total", "Number of cached prompt tokens.", tl, cached)
        yield _counter("sglang:num_requests_total", "Number of requests processed.", tl, self.num_requests)
        yield _counter("sglang:num_aborted_requests_total", "Number of requests aborted.", tl, self.num_aborted)
        yield _histogram(
            "sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", tl, self.ttft
        )
        yield _histogram(
            "sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", tl, self.itl
        )
        yield _histogram(
            "sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds", tl, self.e2e
        )


# -- endpoints ------------------------------------------------------------------------------------


def _health(engine: SimEngine) -> Response:
    return Response(status_code=200 if engine.healthy else 503)


def _vllm_routes(router: APIRouter, engine: SimEngine) -> None:
    @router.get("/health", include_in_schema=False)
    async def health() -> Response:
        return _health(engine)

    @router.api_route("/ping", methods=["GET", "POST"], include_in_schema=False)
    async def ping() -> Response:
        return _health(engine)

    @router.get("/version")
    async def version() -> JSONResponse:
        return JSONResponse({"version": VLLM_VERSION})

    @router.post("/tokenize")
    async def tokenize(request: Request) -> Response:
        try:
            ids, _ = protocol.parse_tokenize(await request.body(), engine.settings.model)
        except protocol.ApiError as e:
            return JSONResponse(e.body(), status_code=e.status)
        return JSONResponse(
            {"count": len(ids), "max_model_len": engine.settings.max_model_len, "tokens": ids, "token_strs": None}
        )


def _sglang_routes(router: APIRouter, engine: SimEngine) -> None:
    @router.get("/health", include_in_schema=False)
    async def health() -> Response:
        return _health(engine)

    @router.get("/health_generate", include_in_schema=False)
    async def health_generate() -> Response:
        # SGLang runs a one-token generation; the simulator checks its scheduler loop is alive.
        return _health(engine)

    @router.get("/get_model_info")
    async def get_model_info() -> JSONResponse:
        s = engine.settings
        return JSONResponse(
            {
                "model_path": s.model,
                "tokenizer_path": s.model,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "default",
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "model_type": None,
                "architectures": None,
            }
        )

    @router.get("/get_server_info")
    async def get_server_info() -> JSONResponse:
        s = engine.settings
        metrics = engine.metrics
        throughput = metrics.gen_throughput() if isinstance(metrics, SglangMetrics) else 0.0
        return JSONResponse(
            {
                "model_path": s.model,
                "served_model_name": s.model,
                "host": s.host,
                "port": s.port,
                "context_length": s.max_model_len,
                "max_running_requests": s.max_num_seqs,
                "max_total_num_tokens": s.kv_cache_tokens,
                "random_seed": s.seed,
                "version": SGLANG_VERSION,
                "internal_states": [
                    {
                        "last_gen_throughput": throughput,
                        "#running-req": engine.scheduler.num_running,
                        "#queue-req": engine.scheduler.num_waiting,
                    }
                ],
                "simulator": {"ttft_ms": s.ttft_ms, "itl_ms": s.itl_ms, "output_len": s.output_len},
            }
        )


@dataclass(frozen=True)
class Flavor:
    name: str
    owned_by: str  # ``/v1/models`` owned_by
    version: str
    metrics: Callable[[SimSettings], EngineMetrics]
    routes: Callable[[APIRouter, SimEngine], None]

    def router(self, engine: SimEngine) -> APIRouter:
        router = APIRouter()
        self.routes(router, engine)
        return router


FLAVORS: dict[str, Flavor] = {
    "vllm": Flavor("vllm", "vllm", VLLM_VERSION, VllmMetrics, _vllm_routes),
    "sglang": Flavor("sglang", "sglang", SGLANG_VERSION, SglangMetrics, _sglang_routes),
}
