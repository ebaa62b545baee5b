"""The difficulty heuristic and prefix hashes (stated in llmlab_routing.features)."""

from __future__ import annotations

import pytest
from llmlab_routing.features import (
    chat_prefix_text,
    chat_task,
    difficulty,
    difficulty_class,
    length_class,
    prefix_hashes,
    request_class,
)

pytestmark = pytest.mark.unit


def test_difficulty_signals_add_up_and_classify() -> None:
    assert difficulty("hello there", 10, 64) == 0.0
    assert difficulty_class(0.0) == "easy"
    code = "Debug this:\n```python\ndef f(x): return x/0\n```"
    assert difficulty(code, 50, 64) == pytest.approx(0.5)  # reasoning (debug) + code
    assert difficulty_class(0.5) == "medium"
    hard = "Prove that 2 + 2 = 4 step by step. Why? How?\n1. a\n2. b\n3. c"
    assert difficulty(hard, 3000, 2048) == 1.0 or difficulty(hard, 3000, 2048) >= 0.67
    assert difficulty_class(0.7) == "hard"


def test_length_classes() -> None:
    assert length_class(100, 100) == "short"
    assert length_class(5000, 100) == "long_input"
    assert length_class(100, 2000) == "long_output"
    assert length_class(2000, 300) == "medium"


def test_task_is_the_last_user_message() -> None:
    msgs = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "text", "text": "second"}]},
    ]
    assert chat_task(msgs) == "second"
    assert chat_prefix_text(msgs).startswith("<system>be brief\n<user>first")


def test_prefix_hashes_are_chained_over_full_blocks() -> None:
    a = prefix_hashes("x" * 100 + "A" * 28, 32, 8)
    b = prefix_hashes("x" * 100 + "B" * 28, 32, 8)
    assert len(a) == 4 and a[:3] == b[:3] and a[3] != b[3]
    assert prefix_hashes("short", 32, 8) == []
    assert len(prefix_hashes("y" * 1000, 32, 5)) == 5


@pytest.mark.parametrize(
    ("prompt", "out", "ttft_bound", "expected"),
    [
        (1024, 16, True, "long_context"),  # the prompt's length decides first
        (1023, 16, True, "latency"),
        (100, 512, True, "latency"),
        (100, 513, True, "throughput"),  # a long answer: no latency pipeline's per-request cap
        (100, 16, False, "throughput"),  # no TTFT bound (batch)
        (5000, 16, False, "long_context"),
    ],
)
def test_request_class(prompt: int, out: int, ttft_bound: bool, expected: str) -> None:
    assert request_class(prompt, out, ttft_bound, long_prompt_tokens=1024, latency_max_output=512) == expected
