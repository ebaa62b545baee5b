"""Filter ``pipeline`` (soft): the deployment's pipeline (the catalog's ``pipeline:``) must be the one the
request is made for (``DecisionInputs.request_class``, from :func:`llmlab_routing.features.request_class`), so
one model deployed as pipelines A, B and C takes each request class to its own (tutorial §2.3). Relaxed when
no candidate has that pipeline (a model deployed once, or its pipeline's workers all down): another pipeline
serves late rather than none, and the decision record says so."""

from __future__ import annotations

from llmlab_routing.model import DecisionInputs, DeploymentView
from llmlab_routing.plugins import register_filter


@register_filter
class PipelineFit:
    name = "pipeline"
    soft = True

    def check(self, inp: DecisionInputs, dep: DeploymentView) -> str | None:
        if dep.pipeline != inp.request_class:
            return f"{inp.request_class} request, {dep.pipeline} pipeline"
        return None
