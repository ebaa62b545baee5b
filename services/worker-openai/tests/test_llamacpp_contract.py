"""worker-openai against REAL llama.cpp servers on this CPU (PyPI xllamacpp, SmolLM2's Q4_1 GGUF): the shared
worker contract, the load it reports, its model load timed apart from generation, and mid-stream failover
(llama.cpp continues a final assistant message)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from llmlab_testkit import contract
from llmlab_testkit.contract import EngineUnderTest
from llmlab_testkit.e2e import eventually, metric, serves
from llmlab_testkit.failover import kill_mid_stream, relay
from llmlab_testkit.llamacpp import base_url, llamacpp_server
from llmlab_testkit.natsclient import WorkerClient
from llmlab_testkit.procs import Stack, url

# The GGUF comes with the vLLM-on-CPU setup (scripts/setup-vllm-cpu.sh), as the vllm_cpu tier's model.
pytestmark = [pytest.mark.integration, pytest.mark.vllm_cpu]
REPO = Path(__file__).resolve().parents[3]
CATALOG = REPO / "configs" / "local-catalog.yaml"
MODEL = "SmolLM2-135M-Instruct"
ENV = {"LLMLAB_WORKER_BACKEND": "llamacpp", "LLMLAB_CATALOG_PATH": str(CATALOG)}


@pytest.fixture(scope="module")
def llamacpp_url() -> Iterator[str]:
    server = llamacpp_server("llamacpp-contract", slots=4, ctx_per_slot=2048).start()
    try:
        server.wait_ready(timeout=120)
        yield base_url(server)
    finally:
        server.stop(timeout=10)


def processing(base: str) -> float:
    return metric(base, "llamacpp:requests_processing")


@pytest.fixture
def engine(llamacpp_url: str) -> EngineUnderTest:
    return EngineUnderTest(
        "llamacpp", "local-a", llamacpp_url, MODEL, lambda: processing(llamacpp_url), worker="openai", env=ENV
    )


async def test_streams_tokens_usage_and_timings(stack: Stack, engine: EngineUnderTest) -> None:
    await contract.streams_tokens_usage_and_timings(stack, engine)


async def test_stop_sequence_on_completions(stack: Stack, engine: EngineUnderTest) -> None:
    await contract.stop_sequence_on_completions(stack, engine, prompt="1, 2, 3, 4,", stop=",")


async def test_cancel_stops_generation_on_the_engine(stack: Stack, engine: EngineUnderTest) -> None:
    await contract.cancel_stops_generation_on_the_engine(stack, engine)


async def test_heartbeat_carries_what_llamacpp_reports_and_nothing_it_does_not(
    stack: Stack, engine: EngineUnderTest
) -> None:
    engine.start_worker(stack, heartbeat_s=0.2)
    async with WorkerClient(stack.namespace) as client:
        await eventually(lambda: any(h.pool == "local-a" for h in client.heartbeats), timeout=10, what="a heartbeat")
        await eventually(lambda: client.heartbeats[-1].load.running is not None, timeout=10, what="the load")
        hb = [h for h in client.heartbeats if h.pool == "local-a"][-1]
        assert hb.engine == "llamacpp" and hb.ready and hb.models == [MODEL]
        assert hb.load.running == 0 and hb.load.waiting == 0  # llamacpp:requests_processing / _deferred
        # This llama.cpp build exports no KV-cache usage: the worker says it does not know, not 0.
        assert hb.load.kv_cache_usage is None and hb.load.prefix_cache_hit_rate is None


async def test_the_model_load_is_timed_apart_from_generation(stack: Stack) -> None:
    """The worker starts first, then its server: it sees the connection refused, then llama.cpp's 503
    "Loading model", then ready, and records the load once, apart from any request."""
    server = llamacpp_server("llamacpp-cold")
    worker = stack.worker("openai", "local-b", base_url(server), heartbeat_s=0.1, wait=False, env=ENV)
    await eventually(lambda: worker.alive() and serves(worker), timeout=30, what="the worker's /metrics")
    assert metric(worker, "llmlab_worker_engine_model_load_seconds_count", kind="startup") == 0
    server.start()
    try:
        t0 = time.monotonic()
        server.wait_ready(timeout=120)
        loaded_after = time.monotonic() - t0
        await eventually(
            lambda: metric(worker, "llmlab_worker_engine_model_load_seconds_count", kind="startup") == 1,
            timeout=10,
            what="the load recorded",
        )
        took = metric(worker, "llmlab_worker_engine_model_load_seconds_sum", kind="startup")
        # As polled (every 0.1 s): within the server's own start to ready, seen from here.
        assert 0 < took <= loaded_after + 0.5, (took, loaded_after)
        assert metric(worker, "llmlab_worker_engine_loading") == 0
        assert metric(worker, "llmlab_worker_engine_cold_starts_total") == 0  # no request was made
    finally:
        server.stop(timeout=10)


async def test_a_worker_killed_mid_stream_is_continued_on_llamacpp(stack: Stack, llamacpp_url: str) -> None:
    """Two workers on one llama.cpp server; the one serving a stream is SIGKILLed at its first chunk and the other
    continues the delivered text: llama.cpp continues a final assistant message with no extra field."""
    workers = [
        stack.worker("openai", "local-a", llamacpp_url, max_concurrency=1, worker_id=f"w-{i}", env=ENV) for i in (1, 2)
    ]
    gw = stack.gateway(queue_timeout_s=30, env={"LLMLAB_CATALOG_PATH": str(CATALOG)})
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Write a long story about a cat."}],
        "max_tokens": 256,
        "temperature": 0,
        "logit_bias": {"0": -100, "1": -100, "2": -100},  # no end-of-text: the answer runs to max_tokens
    }
    got, before, _ = await kill_mid_stream(url(gw), body, workers, after=1)
    assert got.status == 200 and not got.errors and got.done == 1, got.errors
    assert len(set(got.ids)) == 1 and got.finishes == ["length"]
    assert metric(gw, "llmlab_gateway_stream_resumes_total", status="200") == 1
    assert got.usage["completion_tokens"] == 256  # every token the client received counted once
    ref = await relay(url(gw), body)
    assert ref.text.startswith("".join(got.pieces[:before]))
