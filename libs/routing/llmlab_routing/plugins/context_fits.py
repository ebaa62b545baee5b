"""Filter ``context``: prompt + requested output must fit the deployment's context window."""

from __future__ import annotations

from llmlab_routing.model import DecisionInputs, DeploymentView
from llmlab_routing.plugins import register_filter


@register_filter
class ContextFits:
    name = "context"
    soft = False

    def check(self, inp: DecisionInputs, dep: DeploymentView) -> str | None:
        need = inp.prompt_tokens + inp.max_output_tokens
        if need > dep.max_context:
            return f"needs {need} tokens of context > max_context {dep.max_context}"
        return None
