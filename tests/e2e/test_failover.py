"""Mid-stream failover on the simulator, in both flavours: a worker SIGKILLed after tokens reached
the client, and the client still gets one uninterrupted answer (the same text, id, finish and
usage as a stream nobody interrupted), billed once for what it received. The same kill on real
vLLM: tests/e2e/test_real_vllm.py."""

from __future__ import annotations

from typing import Any

import pytest
from llmlab_testkit.e2e import LLAMA, QWEN, eventually, metric
from llmlab_testkit.e2e import accounting_sql as sql
from llmlab_testkit.failover import kill_mid_stream, relay
from llmlab_testkit.procs import Stack, url

pytestmark = pytest.mark.e2e
ENGINES = {"vllm": (LLAMA, "gpu-vllm"), "sglang": (QWEN, "gpu-sglang")}
STORY = [{"role": "user", "content": "Tell me a long story."}]


@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
async def test_worker_killed_mid_stream_the_client_gets_one_uninterrupted_answer(stack: Stack, flavor: str) -> None:
    model, pool = ENGINES[flavor]
    sim = stack.sim(flavor, model, ttft_ms=30, itl_ms=40, output_len=40)
    workers = [stack.worker(flavor, pool, url(sim), max_concurrency=1, worker_id=f"w-{i}") for i in (1, 2)]
    gw = stack.gateway(queue_timeout_s=10)
    acc = stack.accounting(env={"LLMLAB_ACCOUNTING_FLUSH_INTERVAL_S": "0.2"})
    body = {"model": model, "messages": STORY}

    got, before, killed = await kill_mid_stream(url(gw), body, workers, after=8)
    survivor = next(w for w in workers if w is not killed)
    # The same request, never interrupted (the simulator's text depends on the prompt only).
    ref = await relay(url(gw), body)

    assert got.status == ref.status == 200 and not got.errors and got.done == 1, got.errors
    assert len(set(got.ids)) == 1 and got.ids[0].startswith("chatcmpl-")  # one response, one id
    assert 8 <= before < 40
    # Nothing repeated, nothing missing: the continuation went on where the client was.
    assert got.text == ref.text and len(got.text.split()) == 40
    assert got.finishes == ref.finishes == ["stop"]
    # Usage: the original prompt once, every received token once.
    assert got.usage == ref.usage and got.usage["completion_tokens"] == 40
    assert metric(gw, "llmlab_gateway_stream_resumes_total", status="200") == 1
    assert metric(survivor, "llmlab_worker_attempts_total", outcome="completed") == 2

    # Billing: the request pays its input and the 40 tokens once; the continuation's engine read
    # the delivered tokens again as prompt, which is burnt (our cost), and so is nothing else of it.
    rid = got.request_id
    carried: list[list[Any]] = []

    def both_attempts() -> bool:
        q = f"SELECT attempt, resumed_tokens, carried_tokens FROM attempts_raw FINAL WHERE request_id = '{rid}'"
        carried[:] = [r for r in sql(acc, q) if r[1] or r[2]]
        return len(carried) == 2

    await eventually(both_attempts, timeout=20, what="the interrupted and the continuing attempt's events")
    (a1, _, delivered), (a2, resumed, _) = sorted(carried)
    assert (a1, a2) == (1, 2) and delivered == resumed >= before
    billed = "SELECT attempts, billed_input_tokens, billed_output_tokens FROM requests WHERE request_id ="
    req = sql(acc, f"{billed} '{rid}'")
    assert req == [[2, got.usage["prompt_tokens"], 40]]
    cont = sql(
        acc,
        "SELECT outcome, prompt_tokens, billed_input_tokens, billed_output_tokens, burnt_input_tokens,"
        f" burnt_output_tokens FROM attempts WHERE request_id = '{rid}' AND attempt = 2",
    )
    prompt = got.usage["prompt_tokens"]
    assert cont == [["completed", prompt + resumed, prompt, 40, resumed, 0]]

    if flavor == "vllm":  # completions: the delivered text is appended to the prompt
        spare = stack.worker(flavor, pool, url(sim), max_concurrency=1, worker_id="w-3")
        comp = {"model": model, "prompt": "Once upon a time", "max_tokens": 30}
        got, before, _ = await kill_mid_stream(url(gw), comp, [survivor, spare], after=5, endpoint="completions")
        assert got.status == 200 and not got.errors and len(set(got.ids)) == 1, got.errors
        assert got.finishes == ["length"] and got.usage["completion_tokens"] == 30
        assert len(got.text.split()) == 30  # one word per simulated token, none repeated or lost
