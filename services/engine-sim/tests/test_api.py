"""The simulator over real HTTP (uvicorn in-process), driven by the official openai SDK."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import openai
import pytest
from llmlab_common.metrics import parse_prometheus_text
from llmlab_engine_sim import textgen
from llmlab_engine_sim.api import create_app
from llmlab_engine_sim.settings import SimSettings
from llmlab_testkit.inproc import serve_in_loop

pytestmark = pytest.mark.integration

MODEL = "sim/test-model"
MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hello, world!"}]
PROMPT = "Once upon a time,"

REQUIRED_METRICS = {
    "vllm": [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:request_success_total",
        "vllm:num_preemptions_total",
        "vllm:time_to_first_token_seconds_count",
        "vllm:inter_token_latency_seconds_count",
        "vllm:e2e_request_latency_seconds_count",
        "vllm:request_queue_time_seconds_count",
        "vllm:request_prefill_time_seconds_count",
        "vllm:request_decode_time_seconds_count",
    ],
    "sglang": [
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "sglang:num_used_tokens",
        "sglang:token_usage",
        "sglang:gen_throughput",
        "sglang:cache_hit_rate",
        "sglang:prompt_tokens_total",
        "sglang:generation_tokens_total",
        "sglang:num_requests_total",
        "sglang:cached_tokens_total",
        "sglang:num_aborted_requests_total",
        "sglang:time_to_first_token_seconds_count",
        "sglang:inter_token_latency_seconds_count",
        "sglang:e2e_request_latency_seconds_count",
        "sglang:queue_time_seconds_count",
    ],
}
RUNNING = {"vllm": "vllm:num_requests_running", "sglang": "sglang:num_running_reqs"}
GEN_TOKENS = {"vllm": "vllm:generation_tokens_total", "sglang": "sglang:generation_tokens_total"}

flavors = pytest.mark.parametrize("flavor", ["vllm", "sglang"])


@asynccontextmanager
async def running_sim(**overrides: Any) -> AsyncIterator[str]:
    """Serve a fresh simulator on a free port in this event loop; yields its base URL."""
    kw: dict[str, Any] = {"model": MODEL, "ttft_ms": 20, "itl_ms": 5, "output_len": 6} | overrides
    settings = SimSettings(**kw)
    async with serve_in_loop(create_app(settings), "simulator") as base:
        yield base


def client(base: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base + "/v1", api_key="sk-test", max_retries=0)


async def stats(base: str) -> dict[str, Any]:
    async with httpx.AsyncClient() as http:
        r = await http.get(base + "/sim/stats")
        r.raise_for_status()
        out: dict[str, Any] = r.json()
        return out


async def metrics(base: str) -> dict[str, float]:
    async with httpx.AsyncClient() as http:
        r = await http.get(base + "/metrics")
        r.raise_for_status()
        assert r.headers["content-type"].startswith("text/plain")
        return parse_prometheus_text(r.text)


@flavors
async def test_chat_streaming_with_usage(flavor: str) -> None:
    async with running_sim(flavor=flavor) as base:
        oai = client(base)
        stream = await oai.chat.completions.create(
            model=MODEL, messages=MESSAGES, stream=True, stream_options={"include_usage": True}, temperature=0.7
        )
        chunks = [c async for c in stream]
        await oai.close()
    assert {c.id for c in chunks} == {chunks[0].id} and chunks[0].id.startswith("chatcmpl-")
    assert all(c.model == MODEL and c.object == "chat.completion.chunk" for c in chunks)
    first, *tokens, usage_chunk = chunks
    assert first.choices[0].delta.role == "assistant" and first.choices[0].delta.content == ""
    assert len(tokens) == 6  # one event per generated token
    assert all(c.choices[0].delta.content for c in tokens)
    assert [c.choices[0].finish_reason for c in tokens] == [None] * 5 + ["stop"]
    assert all(c.usage is None for c in [first, *tokens])
    assert usage_chunk.choices == [] and usage_chunk.usage is not None
    assert usage_chunk.usage.completion_tokens == 6
    assert usage_chunk.usage.prompt_tokens == textgen.count_chat_tokens(MESSAGES) == 3 + (4 + 4) + (4 + 4)
    assert usage_chunk.usage.total_tokens == usage_chunk.usage.prompt_tokens + 6


@pytest.mark.parametrize("chunk_tokens", [1, 4])
async def test_continuous_usage_and_several_tokens_per_chunk(chunk_tokens: int) -> None:
    """As vLLM with stream_options.continuous_usage_stats: every chunk carries the running usage;
    with --chunk-tokens N each content chunk carries N tokens (6 tokens: 4 + 2). Catches a count
    that drifts from the text: each generated token is one word."""
    async with running_sim(chunk_tokens=chunk_tokens) as base:
        oai = client(base)
        stream = await oai.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True},  # type: ignore[typeddict-unknown-key]
        )
        chunks = [c async for c in stream]
        await oai.close()
    first, *content, last = chunks
    prompt = textgen.count_chat_tokens(MESSAGES)
    assert first.usage is not None and (first.usage.prompt_tokens, first.usage.completion_tokens) == (prompt, 0)
    words = [len((c.choices[0].delta.content or "").split()) for c in content]
    assert words == ([1] * 6 if chunk_tokens == 1 else [4, 2])
    running = [c.usage.completion_tokens for c in content if c.usage is not None]
    assert running == [sum(words[: i + 1]) for i in range(len(words))]
    assert content[-1].choices[0].finish_reason == "stop"
    assert last.choices == [] and last.usage is not None and last.usage.completion_tokens == 6


@flavors
async def test_chat_non_streaming_length_and_determinism(flavor: str) -> None:
    async with running_sim(flavor=flavor) as base:
        oai = client(base)
        a = await oai.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=3)
        b = await oai.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=3)
        full = await oai.chat.completions.create(model=MODEL, messages=MESSAGES)
        other = await oai.chat.completions.create(model=MODEL, messages=MESSAGES, seed=12345)
        await oai.close()
    assert a.object == "chat.completion" and a.choices[0].message.role == "assistant"
    assert a.choices[0].finish_reason == "length"
    assert a.usage is not None and (a.usage.completion_tokens, a.usage.prompt_tokens) == (3, 19)
    content = a.choices[0].message.content
    assert content is not None and len(content.split()) == 3
    assert b.choices[0].message.content == content  # same request, same text
    assert full.choices[0].finish_reason == "stop" and full.usage is not None and full.usage.completion_tokens == 6
    assert (full.choices[0].message.content or "").startswith(content)
    assert other.choices[0].message.content != full.choices[0].message.content


@flavors
async def test_continue_final_message_goes_on_with_the_rest_of_the_answer(flavor: str) -> None:
    # As vLLM's and SGLang's continue_final_message: the final assistant message is continued,
    # not answered. Continuing the simulator's own partial answer gives exactly the rest of it.
    cont = {"continue_final_message": True} | ({"add_generation_prompt": False} if flavor == "vllm" else {})
    async with running_sim(flavor=flavor, output_len=8) as base:
        oai = client(base)
        full = await oai.chat.completions.create(model=MODEL, messages=MESSAGES)
        whole = full.choices[0].message.content or ""
        head = "".join(" " + w for w in whole.split()[:3])  # the first 3 tokens (each " word")
        assert whole.startswith(head)
        partial = [*MESSAGES, {"role": "assistant", "content": head}]
        rest = await oai.chat.completions.create(model=MODEL, messages=partial, max_tokens=10, extra_body=cont)
        # Only a final assistant message can be continued; vLLM refuses a generation prompt with it.
        with pytest.raises(openai.BadRequestError):
            await oai.chat.completions.create(model=MODEL, messages=MESSAGES, extra_body=cont)
        if flavor == "vllm":
            with pytest.raises(openai.BadRequestError, match="add_generation_prompt"):
                await oai.chat.completions.create(
                    model=MODEL, messages=partial, extra_body={"continue_final_message": True}
                )
        await oai.close()
    assert head + (rest.choices[0].message.content or "") == whole
    assert rest.choices[0].finish_reason == "stop"  # where the uninterrupted answer stopped
    assert rest.usage is not None and full.usage is not None
    assert rest.usage.completion_tokens == 8 - 3
    # The prompt: the conversation, then the open final message's text (no end, no new header).
    assert rest.usage.prompt_tokens == full.usage.prompt_tokens + 3


@flavors
async def test_completions_stream_matches_non_stream(flavor: str) -> None:
    async with running_sim(flavor=flavor) as base:
        oai = client(base)
        stream = await oai.completions.create(model=MODEL, prompt=PROMPT, stream=True)
        chunks = [c async for c in stream]
        whole = await oai.completions.create(model=MODEL, prompt=PROMPT)
        await oai.close()
    assert len(chunks) == 6 and all(c.object == "text_completion" for c in chunks)
    assert chunks[0].id.startswith("cmpl-")
    assert [c.choices[0].finish_reason for c in chunks][-1] == "stop"
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert whole.choices[0].finish_reason == "stop"
    assert whole.usage is not None
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (textgen.count_text_tokens(PROMPT), 6)


@flavors
async def test_stop_string(flavor: str) -> None:
    async with running_sim(flavor=flavor) as base:
        oai = client(base)
        full = (await oai.completions.create(model=MODEL, prompt=PROMPT)).choices[0].text
        stop = " " + full.split()[3]
        cut = await oai.completions.create(model=MODEL, prompt=PROMPT, stop=[stop])
        await oai.close()
    text = cut.choices[0].text
    assert cut.choices[0].finish_reason == "stop"
    assert stop not in text and full.startswith(text)
    assert cut.usage is not None and cut.usage.completion_tokens <= 4


@flavors
async def test_errors_have_the_openai_shape(flavor: str) -> None:
    async with running_sim(flavor=flavor, max_model_len=64) as base:
        oai = client(base)
        with pytest.raises(openai.NotFoundError) as nf:
            await oai.chat.completions.create(model="no-such-model", messages=MESSAGES)
        assert nf.value.status_code == 404
        with pytest.raises(openai.BadRequestError):
            await oai.completions.create(model=MODEL, prompt="word " * 100)  # longer than max_model_len
        with pytest.raises(openai.BadRequestError):
            await oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1000)  # prompt + max_tokens > 64
        await oai.close()
        async with httpx.AsyncClient() as http:
            r = await http.post(base + "/v1/chat/completions", content=b"{not json")
            assert r.status_code == 400
            assert set(r.json()["error"]) == {"message", "type", "param", "code"}
            r = await http.post(base + "/v1/chat/completions", json={"model": MODEL})
            assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
            r = await http.post(base + "/v1/completions", json={"model": "nope", "prompt": "x"})
            assert r.status_code == 404
            assert r.json() == {
                "error": {"message": "The model `nope` does not exist.", "type": "NotFoundError", "param": "model",
                          "code": 404}
            }  # fmt: skip


@flavors
async def test_metrics_use_the_flavours_names(flavor: str) -> None:
    async with running_sim(flavor=flavor) as base:
        oai = client(base)
        await oai.chat.completions.create(model=MODEL, messages=MESSAGES)
        await oai.close()
        values = await metrics(base)
    missing = [n for n in REQUIRED_METRICS[flavor] if n not in values]
    assert not missing
    other = "sglang:" if flavor == "vllm" else "vllm:"
    assert not [n for n in values if n.startswith(other)]
    assert values[GEN_TOKENS[flavor]] == 6
    assert values[RUNNING[flavor]] == 0
    if flavor == "vllm":
        assert values["vllm:request_success_total"] == 1
        assert values["vllm:prompt_tokens_total"] == 19
        assert values["vllm:inter_token_latency_seconds_count"] == 5
    else:
        assert values["sglang:num_requests_total"] == 1
        assert values["sglang:queue_time_seconds_count"] == 1


@flavors
async def test_health_info_and_models_endpoints(flavor: str) -> None:
    async with running_sim(flavor=flavor, max_model_len=4096) as base:
        oai = client(base)
        models = await oai.models.list()
        await oai.close()
        assert [m.id for m in models.data] == [MODEL] and models.data[0].owned_by == flavor
        async with httpx.AsyncClient(base_url=base) as http:
            assert (await http.get("/health")).status_code == 200
            assert (await http.get("/v1/models")).json()["data"][0]["max_model_len"] == 4096
            if flavor == "vllm":
                assert (await http.get("/ping")).status_code == 200
                assert (await http.post("/ping")).status_code == 200
                assert "version" in (await http.get("/version")).json()
                tok = (await http.post("/tokenize", json={"model": MODEL, "messages": MESSAGES})).json()
                assert tok["count"] == len(tok["tokens"]) == 19 and tok["max_model_len"] == 4096
                assert (await http.post("/tokenize", json={"prompt": PROMPT})).json()["count"] == 5
                assert (await http.get("/get_model_info")).status_code == 404
            else:
                assert (await http.get("/health_generate")).status_code == 200
                assert (await http.get("/get_model_info")).json()["model_path"] == MODEL
                info = (await http.get("/get_server_info")).json()
                assert info["served_model_name"] == MODEL and info["context_length"] == 4096
                assert (await http.get("/version")).status_code == 404


async def test_health_is_503_before_startup() -> None:
    app = create_app(SimSettings(model=MODEL))
    transport = httpx.ASGITransport(app=app)  # runs no lifespan: the engine never started
    async with httpx.AsyncClient(transport=transport, base_url="http://sim") as http:
        assert (await http.get("/health")).status_code == 503
        r = await http.post("/v1/completions", json={"prompt": "x"})
        assert r.status_code == 503


async def test_generation_routes_also_work_through_fastapi() -> None:
    app = create_app(SimSettings(model=MODEL, ttft_ms=1, itl_ms=1, output_len=3))
    app.fast_routes = {}  # SimApp's fast path off: FastAPI's router serves them
    engine = app.state.engine
    engine.start()  # ASGITransport runs no lifespan
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://sim") as http:
            r = await http.post("/v1/completions", json={"prompt": PROMPT})
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
            r = await http.post("/v1/chat/completions", json={"messages": MESSAGES, "stream": True})
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            assert r.text.count("data: ") == 1 + 3 + 1 and r.text.endswith("data: [DONE]\n\n")
    finally:
        await engine.stop()


async def _wait_running(base: str, running: int, timeout: float = 3.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        s = await stats(base)
        if s["running"] == running or time.monotonic() > deadline:
            return s
        await asyncio.sleep(0.02)


@flavors
async def test_closing_a_stream_aborts_the_request(flavor: str) -> None:
    async with running_sim(flavor=flavor, output_len=100_000, max_model_len=200_000) as base:
        oai = client(base)
        stream = await oai.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
        got = 0
        async for _ in stream:
            got += 1
            if got == 3:
                break
        assert (await stats(base))["running"] == 1
        await stream.close()
        s = await _wait_running(base, 0)
        await oai.close()
        assert s["running"] == 0 and s["aborted"] == 1 and s["finished"] == 0
        values = await metrics(base)
        assert values[RUNNING[flavor]] == 0
        if flavor == "vllm":
            assert values["vllm:request_success_total"] == 1  # finished_reason="abort"
        else:
            assert values["sglang:num_aborted_requests_total"] == 1


async def test_abandoned_non_streaming_request_is_aborted() -> None:
    async with running_sim(output_len=100_000, max_model_len=200_000) as base:
        async with httpx.AsyncClient(timeout=0.3) as http:
            with pytest.raises(httpx.ReadTimeout):
                await http.post(base + "/v1/completions", json={"prompt": PROMPT})
        s = await _wait_running(base, 0)
        assert s["running"] == 0 and s["aborted"] == 1


async def test_max_num_seqs_queues_over_http() -> None:
    async with running_sim(max_num_seqs=1, output_len=40, ttft_ms=10, itl_ms=10) as base:
        oai = client(base)

        async def run() -> float:
            t = time.monotonic()
            r = await oai.completions.create(model=MODEL, prompt=PROMPT)
            assert r.choices[0].finish_reason == "stop"
            return time.monotonic() - t

        tasks = [asyncio.create_task(run()) for _ in range(2)]
        deadline = time.monotonic() + 3
        while (s := await stats(base))["received"] < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert (s["running"], s["waiting"]) == (1, 1)
        durations = sorted(await asyncio.gather(*tasks))
        await oai.close()
        values = await metrics(base)
    # The second waited for the first: ~0.4 s queue + ~0.4 s of its own.
    assert durations[1] > durations[0] + 0.25
    assert values["vllm:request_queue_time_seconds_sum"] > 0.3


def test_cli_runs_the_server_and_stops_on_sigterm() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "llmlab_engine_sim", "--flavor", "sglang", "--port", str(port), "--model", "N"]
    cmd += ["--ttft-ms", "10", "--itl-ms", "5", "--max-num-seqs", "4", "--output-len", "8"]
    proc = subprocess.Popen(cmd, env={**os.environ, "LLMLAB_LOG_JSON": "false"}, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 20
        while True:
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "simulator did not become healthy"
            time.sleep(0.1)
        base = f"http://127.0.0.1:{port}"
        assert httpx.get(base + "/get_model_info").json()["model_path"] == "N"
        s = httpx.get(base + "/sim/stats").json()
        assert (s["flavor"], s["max_num_seqs"], s["output_len"], s["itl_ms"]) == ("sglang", 4, 8, 5.0)
        r = httpx.post(base + "/v1/completions", json={"model": "N", "prompt": "x"}).json()
        assert r["usage"]["completion_tokens"] == 8
    finally:
        proc.send_signal(signal.SIGTERM)
        # uvicorn re-raises the signal once it has shut down cleanly.
        assert proc.wait(10) in (0, -signal.SIGTERM)
    assert proc.stderr is not None and b"engine simulator stopped" in proc.stderr.read()
