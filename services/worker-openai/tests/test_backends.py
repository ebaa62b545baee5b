"""The adapters against the documented API shapes of servers that cannot run here (Ollama, LM Studio), served
by a small in-process HTTP server, and against a port nobody listens on (a real refusal). The same adapter
against real llama.cpp: test_llamacpp_contract.py."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from llmlab_common.messages import InferenceRequest, SamplingParams
from llmlab_testkit.procs import free_port
from llmlab_worker.engine import EngineRequestError
from llmlab_worker_openai import adapter as a

DATA = Path(__file__).parent / "data"
MODEL = "meta-llama-3.1-8b-instruct"


def _chunk(content: str | None, finish: str | None = None) -> bytes:
    """An OpenAI chat chunk as Ollama's and LM Studio's /v1 endpoints send it."""
    delta = {} if content is None else {"role": "assistant", "content": content}
    doc = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": MODEL,
           "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}  # fmt: skip
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


class FakeServer:
    """Ollama's or LM Studio's endpoints from their documents: the model list shows the model once a request
    loaded it (the first request waits ``load_s``)."""

    def __init__(self, backend: str, load_s: float = 0.3) -> None:
        self.backend, self.load_s, self.loaded, self.requests = backend, load_s, False, 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/api/version", self.version)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/api/ps", self.ps)
        app.router.add_get("/api/v0/models", self.lms_v0)  # no /api/v1/models: an LM Studio before 0.4
        app.router.add_post("/v1/chat/completions", self.chat)
        return app

    async def version(self, _: web.Request) -> web.Response:
        return web.json_response({"version": "0.12.0"})

    async def models(self, _: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def ps(self, _: web.Request) -> web.Response:
        doc: Any = json.loads((DATA / "ollama_ps.json").read_text())
        doc["models"][0]["name"] = doc["models"][0]["model"] = MODEL
        return web.json_response(doc if self.loaded else {"models": []})

    async def lms_v0(self, _: web.Request) -> web.Response:
        doc: Any = json.loads((DATA / "lmstudio_v0_models.json").read_text())
        for m in doc["data"]:
            m["state"] = "loaded" if m["id"] == MODEL and self.loaded else "not-loaded"
        return web.json_response(doc)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        if not self.loaded:
            await asyncio.sleep(self.load_s)
            self.loaded = True
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for piece in ("Hello", " there", "!"):
            await resp.write(_chunk(piece))
        await resp.write(_chunk(None, "stop"))
        await resp.write(b"data: [DONE]\n\n")
        return resp


@pytest.fixture
async def server(request: pytest.FixtureRequest) -> AsyncIterator[tuple[FakeServer, str]]:
    fake = FakeServer(request.param)
    runner = web.AppRunner(fake.app())
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield fake, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def _req(rid: str) -> InferenceRequest:
    now = time.time()
    return InferenceRequest(
        request_id=rid, attempt=1, gateway_id="g", reply_subject="x", endpoint="chat", model=MODEL,
        deployment="d", pool="p", messages=[{"role": "user", "content": "hi"}], params=SamplingParams(max_tokens=8),
        created_at=now, dispatched_at=now, start_deadline=now + 5, deadline=now + 60,
    )  # fmt: skip


def _value(adapter: a.LocalServerAdapter, name: str, **labels: str) -> float:
    for c in adapter.collectors():
        for metric in c.collect():  # type: ignore[attr-defined]
            for s in metric.samples:
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                    return float(s.value)
    return 0.0


@pytest.mark.parametrize("server", ["ollama", "lmstudio"], indirect=True)
async def test_a_request_that_loads_its_model_is_a_cold_start_and_the_next_is_not(
    server: tuple[FakeServer, str],
) -> None:
    fake, base = server
    adapter = a.ADAPTERS[fake.backend](base, 4)
    await adapter.start()
    try:
        assert await adapter.healthy()
        load = await adapter.load()
        assert load.running is None and load.kv_cache_usage is None  # no load figures: none invented
        assert adapter.loaded == set()  # the server's list, with our model not loaded
        assert adapter.is_cold(MODEL)
        texts = [ev.text async for ev in adapter.stream(_req("r1"))]
        assert "".join(texts) == "Hello there!"
        assert _value(adapter, "llmlab_worker_engine_cold_starts_total") == 1
        took = _value(adapter, "llmlab_worker_engine_model_load_seconds_sum", kind="first_request")
        assert fake.load_s <= took < fake.load_s + 2
        # The server now lists the model; the next request is warm and no load is counted.
        await adapter.load()
        assert not adapter.is_cold(MODEL)
        assert "".join([ev.text async for ev in adapter.stream(_req("r2"))]) == "Hello there!"
        assert _value(adapter, "llmlab_worker_engine_cold_starts_total") == 1
        assert fake.requests == 2
    finally:
        await adapter.close()


async def test_a_refused_connection_is_named_and_counted_as_such() -> None:
    adapter = a.LlamaCppAdapter(f"http://127.0.0.1:{free_port()}", 4, connect_timeout_s=2)
    await adapter.start()
    try:
        assert not await adapter.healthy() and adapter.state == "down"
        with pytest.raises(EngineRequestError) as info:
            async for _ in adapter.stream(_req("r3")):
                pass
        assert info.value.status == 0 and info.value.message.startswith("connection refused: ")
        assert _value(adapter, "llmlab_worker_engine_connect_failures_total", kind="refused") == 1
        assert _value(adapter, "llmlab_worker_engine_connect_failures_total", kind="timeout") == 0
    finally:
        await adapter.close()
