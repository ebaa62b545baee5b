"""Filter ``slo`` (soft): the deployment's estimated latency must meet the request's SLO class
(interactive: TTFT p95 and time per output token; batch: end-to-end), judged by the one SLO rule
(:func:`llmlab_common.rules.slo_verdict`) on the estimates. Relaxed when none meets it: a late
answer beats no answer, and the record says so."""

from __future__ import annotations

from llmlab_common import rules

from llmlab_routing.model import DecisionInputs, DeploymentView
from llmlab_routing.plugins import register_filter


@register_filter
class Slo:
    name = "slo"
    soft = True

    def check(self, inp: DecisionInputs, dep: DeploymentView) -> str | None:
        c = inp.constraints
        limits = rules.SloLimits(ttft_s=c.slo_ttft_s, tpot_s=c.slo_tpot_s, e2e_s=c.slo_e2e_s)
        e2e = dep.est_e2e_s(inp.max_output_tokens)
        v = rules.slo_verdict(limits, answered=True, ttft_s=dep.est_ttft_s(), tpot_s=dep.itl_p95_s, e2e_s=e2e)
        if v.ttft_ok is False:
            return f"est. TTFT {dep.est_ttft_s():.3f}s > {c.slo_class} SLO {c.slo_ttft_s}s"
        if v.tpot_ok is False:
            return f"ITL p95 {dep.itl_p95_s:.3f}s > {c.slo_class} TPOT SLO {c.slo_tpot_s}s"
        if v.e2e_ok is False:
            return f"est. E2E {e2e:.1f}s > {c.slo_class} SLO {c.slo_e2e_s}s"
        return None
