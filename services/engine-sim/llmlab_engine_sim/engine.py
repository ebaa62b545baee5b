"""The simulated engine as one object: settings + scheduler + flavour metrics + output planning.

No HTTP here; :mod:`llmlab_engine_sim.api` is the transport around it.
"""

from __future__ import annotations

import logging
import time
import uuid

from llmlab_common.metrics import add_process_collectors
from llmlab_common.runtime import ServiceState
from prometheus_client import CollectorRegistry, generate_latest

from llmlab_engine_sim import textgen
from llmlab_engine_sim.flavors import FLAVORS, EngineMetrics, Flavor
from llmlab_engine_sim.protocol import ParsedRequest
from llmlab_engine_sim.scheduler import (
    Clock,
    LoopScheduler,
    OutputPlan,
    Scheduler,
    SchedulerConfig,
    SimRequest,
    TokenSink,
)
from llmlab_engine_sim.settings import SimSettings

log = logging.getLogger(__name__)


class SimEngine:
    def __init__(
        self, settings: SimSettings, clock: Clock | None = None, service_state: ServiceState | None = None
    ) -> None:
        self.settings = settings
        # Readiness seen by llmlab_common.runtime.serve: draining on SIGTERM turns /health to 503.
        self.service_state = service_state if service_state is not None else ServiceState()
        self.flavor: Flavor = FLAVORS[settings.flavor]
        self.metrics: EngineMetrics = self.flavor.metrics(settings)
        config = SchedulerConfig(
            max_num_seqs=settings.max_num_seqs,
            ttft_s=settings.ttft_ms / 1000.0,
            itl_s=settings.itl_ms / 1000.0,
            tick_s=min(settings.tick_ms, settings.itl_ms) / 1000.0,
        )
        self.scheduler: LoopScheduler = Scheduler(config, clock=clock, observer=self.metrics)
        self.metrics.bind(self.scheduler)
        self.service_state.checks.setdefault("scheduler", lambda: self.scheduler.alive)
        # One registry per engine: tests run several apps in one process.
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.metrics)
        add_process_collectors(self.registry)  # process_* and llmlab_process_network_*
        self.created = int(time.time())
        self.started = False

    @property
    def healthy(self) -> bool:
        return self.started and not self.service_state.draining and self.scheduler.alive

    def start(self) -> None:
        self.scheduler.start()
        self.started = True
        s = self.settings
        log.info(
            "engine simulator ready",
            extra={
                "flavor": s.flavor,
                "model": s.model,
                "ttft_ms": s.ttft_ms,
                "itl_ms": s.itl_ms,
                "max_num_seqs": s.max_num_seqs,
                "output_len": s.output_len,
            },
        )

    async def stop(self) -> None:
        self.started = False
        await self.scheduler.stop()

    def render_metrics(self) -> bytes:
        return generate_latest(self.registry)

    def plan(self, parsed: ParsedRequest) -> OutputPlan:
        """What the request generates. Natural length ``output_len`` (raised to ``min_tokens``),
        ending "stop"; a smaller limit (``max_tokens``, or the context left) ends it "length";
        a continuation of the simulator's own text (``continue_final_message``) is the rest of it;
        ``ignore_eos`` generates up to the limit; a stop string ends it early with "stop"."""
        s = self.settings
        limit = parsed.max_tokens if parsed.max_tokens is not None else s.max_model_len - parsed.prompt_tokens
        seed = textgen.text_seed(s.seed, parsed.prompt_key, parsed.seed)
        done = 0  # tokens of the answer already out (continue_final_message of our own output)
        if parsed.continue_text is not None:
            k = textgen.count_text_tokens(parsed.continue_text)
            if "".join(textgen.generate_tokens(k, seed)) == parsed.continue_text:
                done = k
        if parsed.ignore_eos:
            n, reason = limit, "length"
        else:
            # A continuation ends where the whole answer would have (at least one more token).
            natural = max(max(s.output_len, parsed.min_tokens) - done, 1)
            n, reason = (limit, "length") if limit < natural else (natural, "stop")
        tokens = textgen.generate_tokens(done + n, seed)[done:]
        if parsed.stop:
            pieces, stopped = textgen.apply_stop(tokens, parsed.stop)
            if stopped:
                return OutputPlan(pieces, "stop")
        return OutputPlan(tokens, reason)

    def new_request(self, parsed: ParsedRequest) -> SimRequest:
        return SimRequest(
            id=uuid.uuid4().hex,
            prompt_tokens=parsed.prompt_tokens,
            plan=self.plan(parsed),
            priority=parsed.priority,
            # A non-streamed request is only woken when it ends, not per token.
            sink=TokenSink(eager=parsed.stream),
        )
