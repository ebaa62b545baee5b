"""Request features the router decides on, computed where the prompt is (the gateway), so only
numbers and hashes travel to the router, never the prompt.

Difficulty (tutorial §6.1 "classify by difficulty and length") is a stated heuristic, not a model:
each signal below adds its weight when present in the task text (the last user message, or the
completion prompt), and the sum is clipped to 0..1:

====================  ======  =======================================================================
signal                weight  present when
====================  ======  =======================================================================
reasoning             0.30    asks to prove, derive, analyse, compare, design, optimise, debug,
                              explain why, or think step by step
code                  0.20    a code fence, or a programming keyword (def, class, SELECT, function...)
math                  0.15    an equation-like pattern (digits with operators) or LaTeX
many constraints      0.15    two or more questions, or a numbered/bulleted list of three or more items
long input            0.10    prompt of 2,000 tokens or more
long output           0.10    max output of 1,024 tokens or more
====================  ======  =======================================================================

Classes: easy < 0.34 <= medium < 0.67 <= hard. Length classes come from token counts alone.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from typing import Any, Literal

DifficultyClass = Literal["easy", "medium", "hard"]
LengthClass = Literal["short", "medium", "long_input", "long_output"]
# A request's class names the catalog pipeline made for it (llmlab_common.catalog.Pipeline).
RequestClass = Literal["latency", "throughput", "long_context"]

_REASONING = re.compile(
    r"\b(prove|proof|derive|derivation|analy[sz]e|analysis|compare|contrast|design|architect|optimi[sz]e|"
    r"debug|trade-?offs?|explain why|step[- ]by[- ]step|reason about|justify)\b",
    re.IGNORECASE,
)
_CODE = re.compile(r"```|\b(def|class|import|function|return|SELECT|INSERT|lambda|async|struct|fn|public static)\b")
_MATH = re.compile(r"(\d\s*[-+*/^=]\s*\d)|\\(frac|sum|int|sqrt)|\$[^$]+\$|∫|∑")
_LIST_ITEM = re.compile(r"^\s*(\d+[.)]|[-*•])\s+", re.MULTILINE)

WEIGHTS = {
    "reasoning": 0.30,
    "code": 0.20,
    "math": 0.15,
    "constraints": 0.15,
    "long_input": 0.10,
    "long_output": 0.10,
}
LONG_INPUT_TOKENS = 2000
LONG_OUTPUT_TOKENS = 1024


def difficulty_signals(task: str, prompt_tokens: int, max_output_tokens: int) -> dict[str, bool]:
    return {
        "reasoning": bool(_REASONING.search(task)),
        "code": bool(_CODE.search(task)),
        "math": bool(_MATH.search(task)),
        "constraints": task.count("?") >= 2 or len(_LIST_ITEM.findall(task)) >= 3,
        "long_input": prompt_tokens >= LONG_INPUT_TOKENS,
        "long_output": max_output_tokens >= LONG_OUTPUT_TOKENS,
    }


def difficulty(task: str, prompt_tokens: int, max_output_tokens: int) -> float:
    signals = difficulty_signals(task, prompt_tokens, max_output_tokens)
    return round(min(1.0, sum(WEIGHTS[k] for k, on in signals.items() if on)), 4)


def difficulty_class(score: float) -> DifficultyClass:
    return "easy" if score < 0.34 else "medium" if score < 0.67 else "hard"


def length_class(prompt_tokens: int, max_output_tokens: int) -> LengthClass:
    if prompt_tokens >= 4096:
        return "long_input"
    if max_output_tokens >= LONG_OUTPUT_TOKENS:
        return "long_output"
    if prompt_tokens < 1024 and max_output_tokens <= 256:
        return "short"
    return "medium"


def request_class(
    prompt_tokens: int, max_output_tokens: int, ttft_bound: bool, long_prompt_tokens: int, latency_max_output: int
) -> RequestClass:
    """Which pipeline a request is made for (tutorial §2.3): a long prompt wants the long-context pipeline
    (prefix caching, a big context, long prefills that do not stall the rest); a request whose SLO class bounds
    its TTFT (``interactive``), with a bounded answer, the latency pipeline; everything else, traffic without a
    TTFT bound (``batch``) or a long answer, the throughput pipeline. The prompt's length decides first: a long
    prefill is what hurts a latency pipeline's neighbours most."""
    if prompt_tokens >= long_prompt_tokens:
        return "long_context"
    if ttft_bound and max_output_tokens <= latency_max_output:
        return "latency"
    return "throughput"


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def chat_task(messages: Sequence[dict[str, Any]]) -> str:
    """The text difficulty is judged on: the last user message (the question being asked)."""
    for m in reversed(messages):
        if m.get("role") == "user":
            return _content_text(m.get("content"))
    return ""


def chat_prefix_text(messages: Sequence[dict[str, Any]]) -> str:
    """The prompt as the engine will see its leading tokens: role and content in order."""
    return "".join(f"<{m.get('role', '')}>{_content_text(m.get('content'))}\n" for m in messages)


def prefix_hashes(text: str, block_chars: int, max_blocks: int) -> list[str]:
    """Chained hashes of the prompt's leading full blocks (block i covers characters [0, (i+1)*size)),
    like an engine's prefix-cache block keys: two prompts share hash i iff they share that whole prefix."""
    out: list[str] = []
    h = hashlib.blake2b(digest_size=8)
    n = min(max_blocks, len(text) // block_chars)
    for i in range(n):
        h.update(text[i * block_chars : (i + 1) * block_chars].encode("utf-8", "surrogatepass"))
        out.append(h.copy().hexdigest())
    return out
