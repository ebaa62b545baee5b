"""Gateway metrics (bounded labels only: endpoint, model, status, why)."""

from __future__ import annotations

from llmlab_common.metrics import Metrics


class GatewayMetrics:
    def __init__(self, m: Metrics) -> None:
        self.requests = m.counter(
            "gateway_requests_total", "Requests by endpoint, model and status", ("endpoint", "model", "status")
        )
        self.ttft = m.histogram("gateway_ttft_seconds", "Accepted to first token sent", ("model",))
        self.e2e = m.histogram("gateway_e2e_seconds", "Accepted to last byte", ("model",))
        self.in_flight = m.gauge("gateway_in_flight_requests", "Requests being served")
        self.attempts = m.counter("gateway_retries_total", "Attempts beyond the first", ("model",))
        self.tokens = m.counter("gateway_completion_tokens_total", "Completion tokens relayed", ("model",))
        self.router_degraded = m.counter(
            "gateway_router_fallbacks_total",
            "Routes decided in the gateway because the router did not answer",
            ("why",),
        )
