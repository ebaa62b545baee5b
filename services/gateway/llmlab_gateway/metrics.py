"""Gateway metrics (bounded labels only: endpoint, model, plan, status, code, why; see
docs/observability.md). The label values come from the catalog (:func:`model_label`,
:func:`plan_label`) or from :class:`~llmlab_common.codes.Code` (:func:`code_label`), so a client
can never mint a series. Children are cached per label set: a request looks its labels up once,
at its end, never per token."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, get_args

from llmlab_common.catalog import Catalog
from llmlab_common.codes import Code
from llmlab_common.errors import LLMLabError
from llmlab_common.messages import Endpoint, Principal, StreamEnd
from llmlab_common.metrics import ITL_BUCKETS, Metrics

OK = "ok"  # the code label of a success
CLIENT_CLOSED = "client_closed"  # the code label of a request whose client left (status 499)
UNAUTHENTICATED = "unknown"  # the plan label of a request refused before authentication
OTHER = "other"  # a model or plan the catalog does not name
_CODES = frozenset(c.value for c in Code)


def model_label(catalog: Catalog, name: str | None) -> str:
    """The catalog model a requested name (model id, deployment id or alias) stands for, else ``other``."""
    found = catalog.resolve(name) if name is not None else []
    return found[0].model if found else OTHER


def plan_label(catalog: Catalog, principal: Principal | None) -> str:
    """The principal's plan if the catalog has it, ``unknown`` before authentication, else ``other``."""
    if principal is None:
        return UNAUTHENTICATED
    return principal.plan if principal.plan in catalog.plans else OTHER


def code_label(err: LLMLabError | None) -> str:
    """The error's :class:`Code` value (``ok`` for no error); a code outside the enum (from a
    peer that knows more codes) counts as ``internal_error``."""
    if err is None:
        return OK
    return err.code if err.code in _CODES else Code.INTERNAL_ERROR.value


@dataclass(frozen=True, slots=True)
class ModelPlanMetrics:
    """The per-(model, plan) children a request observes once, at its end (TTFT at its first token)."""

    ttft: Any
    tpot: Any
    e2e: Any
    completion_tokens: Any
    prompt_tokens: Any

    def finished(self, end: StreamEnd | None, first_at: float, last_at: float, e2e_s: float, ok: bool) -> None:
        """``end`` is the terminal message when one arrived; ``first_at``/``last_at`` the wall
        times of the first and the last token; TPOT is observed for a success with 2+ tokens."""
        self.e2e.observe(e2e_s)
        if end is None:
            return
        n = end.usage.completion_tokens
        self.completion_tokens.inc(n)
        self.prompt_tokens.inc(end.usage.prompt_tokens)
        if ok and n >= 2:
            self.tpot.observe(max(0.0, last_at - first_at) / (n - 1))


class GatewayMetrics:
    def __init__(self, m: Metrics) -> None:
        mp = ("model", "plan")
        self._requests = m.counter(
            "gateway_requests_total",
            "Requests by endpoint, model, plan, HTTP status and error code",
            ("endpoint", "model", "plan", "status", "code"),
        )
        self._ttft = m.histogram("gateway_ttft_seconds", "Accepted to first token", mp)
        self._tpot = m.histogram(
            "gateway_tpot_seconds", "First to last token / (completion tokens - 1), per request", mp, ITL_BUCKETS
        )
        self._e2e = m.histogram("gateway_e2e_seconds", "Accepted to last byte", mp)
        self._completion = m.counter("gateway_completion_tokens_total", "Completion tokens relayed", mp)
        self._prompt = m.counter("gateway_prompt_tokens_total", "Prompt tokens of the answered requests", mp)
        self.in_flight = m.gauge("gateway_in_flight_requests", "Requests being served")
        self.attempts = m.counter("gateway_retries_total", "Attempts beyond the first", ("model",))
        self.resumes = m.counter(
            "gateway_stream_resumes_total",
            "Streams continued on another target after their answering attempt failed mid-generation",
            ("model", "status"),
        )
        self.router_degraded = m.counter(
            "gateway_router_fallbacks_total",
            "Routes decided in the gateway because the router did not answer",
            ("why",),
        )
        self.route_ahead = m.counter(
            "gateway_route_ahead_total",
            "Routing decisions started while the budget reserve was on its way, by outcome: used, rerouted "
            "(the admission gave other inputs: routed again), refused (the admission refused the request)",
            ("outcome",),
        )
        for outcome in ("used", "rerouted", "refused"):
            self.route_ahead.labels(outcome)
        admission = m.histogram(
            "gateway_admission_seconds",
            "Admission steps of the requests that passed authentication: auth_reserve (budget round trip), "
            "route (the routing decision; routed ahead, its time past the budget's answer)",
            ("step",),
        )
        self._auth_reserve, self._route = admission.labels("auth_reserve"), admission.labels("route")
        self._by_model_plan: dict[tuple[str, str], ModelPlanMetrics] = {}
        self._by_request: dict[tuple[str, str, str, str, str], Any] = {}

    def of(self, model: str, plan: str) -> ModelPlanMetrics:
        """The children of one (model, plan), both already labels (:func:`model_label`, :func:`plan_label`)."""
        key = (model, plan)
        found = self._by_model_plan.get(key)
        if found is None:
            found = self._by_model_plan[key] = ModelPlanMetrics(
                self._ttft.labels(model, plan),
                self._tpot.labels(model, plan),
                self._e2e.labels(model, plan),
                self._completion.labels(model, plan),
                self._prompt.labels(model, plan),
            )
        return found

    def zero(self, catalog: Catalog) -> None:
        """Create the success and token series of every catalog model and plan at 0, before any
        request: a counter whose first sample is already 1+ makes Prometheus's increase() over a
        range that begins before it extrapolate (and a rate read it late), so the "in range"
        panels would count less than was served. Bounded: endpoints x models x plans."""
        for model in sorted({d.model for d in catalog.deployments}):
            for plan in catalog.plans:
                self.of(model, plan)
                for endpoint in get_args(Endpoint):
                    self.request_child(endpoint, model, plan, 200, OK)

    def admitted(self, auth_s: float | None, route_s: float | None) -> None:
        """The admission steps of one authenticated request (route only when it was routed)."""
        if auth_s is not None:
            self._auth_reserve.observe(auth_s)
        if route_s is not None:
            self._route.observe(route_s)

    def request(self, endpoint: str, model: str, plan: str, status: int | str, code: str) -> None:
        """Count one request's answer (``code``: :func:`code_label`, or :data:`CLIENT_CLOSED`)."""
        self.request_child(endpoint, model, plan, status, code).inc()

    def request_child(self, endpoint: str, model: str, plan: str, status: int | str, code: str) -> Any:
        key = (endpoint, model, plan, str(status), code)
        child = self._by_request.get(key)
        if child is None:
            child = self._by_request[key] = self._requests.labels(*key)
        return child
