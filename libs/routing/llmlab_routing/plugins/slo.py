"""Filter ``slo`` (soft): the deployment's estimated latency must meet the request's SLO class
(interactive: TTFT p95 and time per output token; batch: end-to-end). Relaxed when none meets it:
a late answer beats no answer, and the record says so."""

from __future__ import annotations

from llmlab_routing.model import DecisionInputs, DeploymentView
from llmlab_routing.plugins import register_filter


@register_filter
class Slo:
    name = "slo"
    soft = True

    def check(self, inp: DecisionInputs, dep: DeploymentView) -> str | None:
        c = inp.constraints
        if c.slo_ttft_s is not None and dep.est_ttft_s() > c.slo_ttft_s:
            return f"est. TTFT {dep.est_ttft_s():.3f}s > {c.slo_class} SLO {c.slo_ttft_s}s"
        if c.slo_tpot_s is not None and dep.itl_p95_s > c.slo_tpot_s:
            return f"ITL p95 {dep.itl_p95_s:.3f}s > {c.slo_class} TPOT SLO {c.slo_tpot_s}s"
        if c.slo_e2e_s is not None:
            e2e = dep.est_e2e_s(inp.max_output_tokens)
            if e2e > c.slo_e2e_s:
                return f"est. E2E {e2e:.1f}s > {c.slo_class} SLO {c.slo_e2e_s}s"
        return None
