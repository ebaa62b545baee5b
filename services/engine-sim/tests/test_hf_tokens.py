"""``--tokenizer``: the simulator counts prompts as the real engine does. Checked against REAL vLLM on this
CPU (the vllm_cpu tier's SmolLM2-135M, whose directory holds the tokenizer and chat template): the same
chat and completion requests get the same ``usage.prompt_tokens`` from both."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from llmlab_engine_sim.hf_tokens import HfPromptTokens
from llmlab_testkit.procs import Stack, url
from llmlab_testkit.vllm import MODEL_DIR, SERVED_NAME

pytestmark = [pytest.mark.integration, pytest.mark.vllm_cpu]

DOCUMENT = " ".join(f"Clause {i}: the tenant pays {i * 37} euros by day {i % 28 + 1}." for i in range(1, 40))
SYSTEM = {"role": "system", "content": "Answer in one word."}
REQUESTS: list[tuple[str, dict[str, Any]]] = [
    ("chat", {"messages": [{"role": "user", "content": "Hello there, how are you today?"}]}),
    ("chat", {"messages": [SYSTEM, {"role": "user", "content": DOCUMENT + "\n\nWhat does clause 7 say?"}]}),
    ("completions", {"prompt": "Once upon a time, in a land far away, 1234567 owls"}),
]


def _prompt_tokens(base: str, endpoint: str, body: dict[str, Any]) -> int:
    path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
    r = httpx.post(base + path, json={"model": SERVED_NAME, "max_tokens": 1, **body}, timeout=120)
    assert r.status_code == 200, r.text
    return int(r.json()["usage"]["prompt_tokens"])


def test_the_simulator_counts_prompts_as_real_vllm_with_its_tokenizer(stack: Stack, vllm_url: str) -> None:
    sim = stack.sim("vllm", SERVED_NAME, extra=["--tokenizer", str(MODEL_DIR), "--max-model-len", "8192"])
    plain = stack.sim("vllm", SERVED_NAME, extra=["--max-model-len", "8192"])
    for endpoint, body in REQUESTS:
        real = _prompt_tokens(vllm_url, endpoint, body)
        assert _prompt_tokens(url(sim), endpoint, body) == real, (endpoint, body)
    # without the tokenizer the simulator's own rule counts the document's digits as whole words
    doc = REQUESTS[1]
    assert _prompt_tokens(url(plain), *doc) < _prompt_tokens(vllm_url, *doc)


def test_the_twins_prefix_blocks_follow_the_real_ids(stack: Stack) -> None:
    """Two chats sharing the document share its full 128-token blocks, as vLLM's hash chain would."""
    sim = stack.sim(
        "vllm",
        SERVED_NAME,
        extra=["--tokenizer", str(MODEL_DIR), "--max-model-len", "8192", "--mode", "twin", "--twin-model",
               "SmolLM2-135M", "--twin-device", "cpu-local", "--twin-dtype", "fp32", "--block-size", "128",
               "--num-gpu-blocks", "182"],
    )  # fmt: skip

    def metric(name: str) -> float:
        text = httpx.get(url(sim) + "/metrics", timeout=10).text
        return sum(float(ln.rsplit(" ", 1)[-1]) for ln in text.splitlines() if ln.startswith(name))

    first = {"messages": [{"role": "user", "content": DOCUMENT + "\n\nWhat does clause 7 say?"}]}
    second = {"messages": [{"role": "user", "content": DOCUMENT + "\n\nWhat does clause 9 say?"}]}
    _prompt_tokens(url(sim), "chat", first)
    assert metric("vllm:prefix_cache_hits_total") == 0
    _prompt_tokens(url(sim), "chat", second)
    # the ids (their count checked against real vLLM above) agree up to the clause number: the full blocks
    # before it hit
    tok = HfPromptTokens(MODEL_DIR)
    a, b = tok.chat(first["messages"]), tok.chat(second["messages"])
    common = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    assert common > 3 * 128
    assert metric("vllm:prefix_cache_hits_total") == common // 128 * 128
