"""Router domain: a query in, a target chain out, one decision record logged. Imports neither NATS
nor FastAPI; the router service and the gateway's embedded mode both drive this class."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable

from llmlab_common.catalog import Deployment
from llmlab_common.codes import Code
from llmlab_common.errors import InvalidRequest, LLMLabError, ModelNotFound, ServiceUnavailable, Unprocessable
from llmlab_common.messages import RouteQuery, RouteReply, RouteTarget

from llmlab_routing.config import CatalogHolder, RouterCatalog
from llmlab_routing.decide import decide
from llmlab_routing.features import difficulty_class, length_class, request_class
from llmlab_routing.model import Constraints, Decision, DecisionInputs, DeploymentView, WorkerView
from llmlab_routing.records import DecisionLog, make_record
from llmlab_routing.state import LiveState

log = logging.getLogger(__name__)

# The error a client sees when nothing can serve, by the decision's status.
_REFUSALS: dict[int, type[LLMLabError]] = {400: InvalidRequest, 422: Unprocessable, 503: ServiceUnavailable}


class RouterCore:
    def __init__(
        self,
        catalog: CatalogHolder | RouterCatalog,
        state: LiveState | None = None,
        decision_log: DecisionLog | None = None,
        seed_source: Callable[[], int] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._holder = catalog if isinstance(catalog, CatalogHolder) else None
        self._fixed = catalog if isinstance(catalog, RouterCatalog) else None
        self.state = state or LiveState()
        self.log = decision_log
        self._seed = seed_source or (lambda: random.getrandbits(32))
        self.clock = clock

    @property
    def current(self) -> RouterCatalog:
        if self._holder is not None:
            return self._holder.current
        assert self._fixed is not None
        return self._fixed

    # -- inputs --------------------------------------------------------------------------------------
    def candidates(self, q: RouteQuery, policy: str) -> list[Deployment]:
        rc = self.current
        cat = rc.catalog
        if q.model in rc.routing.aliases and policy != "static":
            return list(cat.deployments)
        found = cat.resolve(q.model)
        if not found:
            names = cat.public_models() + sorted(rc.routing.aliases)
            raise ModelNotFound(f"The model '{q.model}' does not exist. Available: {', '.join(names)}.")
        return found

    def policy_for(self, q: RouteQuery) -> str:
        r = self.current.routing
        if q.policy is not None:
            if q.policy not in r.policies:
                raise InvalidRequest(
                    f"Unknown routing policy '{q.policy}'. Known: {', '.join(sorted(r.policies))}.",
                    code=Code.INVALID_ROUTE_POLICY,
                )
            return q.policy
        alias = r.aliases.get(q.model)
        return alias.policy if alias else r.default_policy

    def build_inputs(self, q: RouteQuery, now: float | None = None) -> DecisionInputs:
        rc = self.current
        cat, routing = rc.catalog, rc.routing
        now = self.clock() if now is None else now
        policy = self.policy_for(q)
        spec = routing.policies[policy]
        plan = cat.plans.get(q.plan)
        if plan is None:
            raise InvalidRequest(f"Unknown plan '{q.plan}'.", code=Code.INVALID_PLAN)
        slo_name = q.slo_class or plan.slo_class
        slo = cat.slo_classes.get(slo_name)
        if slo is None:
            raise InvalidRequest(
                f"Unknown SLO class '{slo_name}'. Known: {', '.join(sorted(cat.slo_classes))}.",
                code=Code.INVALID_SLO_CLASS,
            )
        dclass = difficulty_class(q.difficulty)
        constraints = Constraints(
            plan=q.plan,
            slo_class=slo_name,
            slo_ttft_s=slo.ttft_p95_s,
            slo_tpot_s=slo.tpot_s,
            slo_e2e_s=slo.e2e_s,
            quality_floor=max(plan.quality_floor, q.quality_floor or 0.0),
            difficulty_floor=routing.difficulty_floors[dclass],
            cost_cap_usd=min(plan.cost_cap_usd, q.max_cost_usd) if q.max_cost_usd else plan.cost_cap_usd,
        )
        st = self.state
        hashes = q.prefix_hashes
        # Only the worker holding the first block can match more than 0 blocks.
        home = st.affinity.get(hashes[0]) if hashes else None
        home_match = st.prefix_match(home, hashes) if home else 0
        deps: list[DeploymentView] = []
        for d in self.candidates(q, policy):
            mp = cat.model_price(d.model)
            stats = st.stats.get(d.id)
            ttft = itl = None
            fail_rate, fail_n = 0.0, 0
            if stats is not None:
                ttft = stats.ttft.p95(now, routing.stats_window_s, routing.min_samples)
                itl = stats.itl.p95(now, routing.stats_window_s, routing.min_samples)
                fail_rate, fail_n = stats.failure_rate(now, routing.stats_window_s)
            workers = []
            hbs, pendings = st.live_entries(d.pool, now)
            for hb, pending in zip(hbs, pendings, strict=True):
                waiting = int(hb.load.waiting or 0)
                running = int(hb.load.running or 0) + waiting
                # What waits in the worker's own queues (addressed to it, not taken yet) is its load
                # too: without it, workers whose engine counts tie (one engine behind several
                # worker processes) kept getting requests in id order while the first one's queue
                # grew (the autoscale demo of 2026-12-06: 46 waiting there, 7 workers idle).
                backlog = sum(hb.addressed_by_priority) if hb.addressed_by_priority else 0
                busy = (hb.in_flight if hb.in_flight > running else running) + backlog + pending
                over = busy - hb.max_concurrency
                workers.append(
                    WorkerView(
                        hb.worker_id,
                        busy,
                        hb.max_concurrency,
                        hb.load.kv_cache_usage,
                        home_match if hb.worker_id == home else 0,
                        waiting + over if over > 0 else waiting,
                    )
                )
            deps.append(
                DeploymentView(
                    id=d.id,
                    model=d.model,
                    pool=d.pool,
                    engine=d.engine,
                    pipeline=d.pipeline,
                    quality=d.quality,
                    max_context=d.max_context,
                    supports_tools=d.supports_tools,
                    input_usd_per_mtok=mp.input_per_mtok_usd if mp else 0.0,
                    output_usd_per_mtok=mp.output_per_mtok_usd if mp else 0.0,
                    ttft_p95_s=ttft if ttft is not None else d.priors.ttft_p95_s,
                    itl_p95_s=itl if itl is not None else d.priors.itl_p95_s,
                    latency_source="observed" if ttft is not None and itl is not None else "prior",
                    failure_rate=round(fail_rate, 4),
                    failure_samples=fail_n,
                    rr_cursor=st.rr.get(d.id, 0),
                    workers=workers,
                )
            )
        return DecisionInputs(
            request_id=q.request_id,
            model=q.model,
            prompt_tokens=q.prompt_tokens,
            max_output_tokens=q.max_output_tokens,
            difficulty=q.difficulty,
            difficulty_class=dclass,
            length_class=length_class(q.prompt_tokens, q.max_output_tokens),
            needs_tools=q.needs_tools,
            prefix_blocks=len(hashes),
            prefix_key=hashes[0] if hashes else "",
            constraints=constraints,
            policy=policy,
            policy_version=rc.version,
            filters=list(spec.filters),
            weights=dict(spec.weights_for(slo_name)),
            picker=spec.picker,
            max_chain=routing.max_chain,
            replica_retries=routing.replica_retries,
            load_bound=routing.load_bound,
            seed=self._seed(),
            deployments=deps,
            request_class=request_class(
                q.prompt_tokens,
                q.max_output_tokens,
                constraints.slo_ttft_s is not None,
                routing.class_long_prompt_tokens,
                routing.class_latency_max_output,
            ),
        )

    # -- the call ------------------------------------------------------------------------------------
    def route(self, q: RouteQuery) -> tuple[RouteReply, DecisionInputs | None, Decision | None]:
        """Decide, update live state, log the record. Errors come back in the reply (never raised)."""
        try:
            inp = self.build_inputs(q)
        except LLMLabError as exc:
            return RouteReply(request_id=q.request_id, error=exc.to_info()), None, None
        dec = decide(inp)
        if dec.targets:
            first = dec.targets[0]
            self.state.commit(first.deployment, first.worker_id, q.prefix_hashes)
        if self.log is not None:
            # Inputs and decision are fresh objects nobody mutates after this: the writer thread
            # serialises them, off the decision path.
            at = time.time()
            self.log.write(lambda: make_record(inp, dec, at))
        # One line per decision at DEBUG: the decision record has it all, and the gateway logs the reason.
        log.debug("route %s: %s", q.request_id, dec.reason)
        reply = RouteReply(
            request_id=q.request_id,
            targets=[RouteTarget(deployment=t.deployment, pool=t.pool, worker_id=t.worker_id) for t in dec.targets],
            policy=inp.policy,
            policy_version=inp.policy_version,
            slo_class=inp.constraints.slo_class,
            reason=dec.reason,
        )
        if not dec.targets:
            refusal = _REFUSALS.get(dec.error_status or 503, ServiceUnavailable)
            reply.error = refusal(dec.reason, code=dec.error_code or Code.NO_ROUTE).to_info()
        return reply, inp, dec
