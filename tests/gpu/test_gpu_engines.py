"""A worker and the gateway in front of a REAL engine on a GPU (vLLM or SGLang).

Run by ``scripts/gpu-smoke.sh``, which starts the engine and passes it here:

* ``LLMLAB_GPU_ENGINE``: ``vllm`` or ``sglang`` (which worker to start);
* ``LLMLAB_GPU_ENGINE_URL``: where the engine serves, e.g. ``http://127.0.0.1:8000``;
* ``LLMLAB_GPU_MODEL``: the engine's served model name (``--served-model-name``).

Needs NATS (``LLMLAB_NATS_URL``, default ``nats://127.0.0.1:4222``) like the other process tests.
Marked ``gpu``: never runs in CI here (``make test`` deselects it). Missing settings FAIL the
tests with the reason: this tier never skips silently.

The gateway resolves models from the catalog, and a GPU smoke model is usually not in
``configs/catalog.yaml``: the tests write a copy of the real catalog with one more deployment
(pool ``gpu-smoke``) and hand it to the worker and the gateway via ``LLMLAB_CATALOG_PATH``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml
from llmlab_common.catalog import load_catalog
from llmlab_testkit.fixtures import DEV_KEY
from llmlab_testkit.natsclient import WorkerClient
from llmlab_testkit.procs import ManagedProcess, Stack, url

pytestmark = [pytest.mark.gpu]

REPO = Path(__file__).resolve().parents[2]
REAL_CATALOG = REPO / "configs" / "catalog.yaml"
POOL = "gpu-smoke"
ENGINES = ("vllm", "sglang")
# A prompt whose answer is far longer than MAX_TOKENS, so every engine stops on length.
MESSAGES = [{"role": "user", "content": "Count from 1 to 200, separated by commas."}]
MAX_TOKENS = 16


@dataclass(frozen=True)
class GpuEngine:
    engine: str  # vllm | sglang
    url: str
    model: str  # served model name


@dataclass(frozen=True)
class SmokeStack:
    stack: Stack
    engine: GpuEngine
    worker: ManagedProcess
    gateway: ManagedProcess

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{url(self.gateway)}/v1", api_key=DEV_KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def gpu_engine() -> GpuEngine:
    missing = [n for n in ("LLMLAB_GPU_ENGINE", "LLMLAB_GPU_ENGINE_URL", "LLMLAB_GPU_MODEL") if not os.environ.get(n)]
    if missing:
        pytest.fail(f"GPU tier needs {', '.join(missing)}; run scripts/gpu-smoke.sh (make gpu-smoke)", pytrace=False)
    engine = GpuEngine(
        os.environ["LLMLAB_GPU_ENGINE"], os.environ["LLMLAB_GPU_ENGINE_URL"].rstrip("/"), os.environ["LLMLAB_GPU_MODEL"]
    )
    if engine.engine not in ENGINES:
        pytest.fail(f"LLMLAB_GPU_ENGINE must be one of {ENGINES}, not {engine.engine!r}", pytrace=False)
    try:
        status = httpx.get(engine.url + "/health", timeout=10).status_code
    except httpx.HTTPError as exc:
        pytest.fail(f"engine at {engine.url} does not answer /health: {exc}", pytrace=False)
    if status != 200:
        pytest.fail(f"engine at {engine.url} answers /health with {status}", pytrace=False)
    return engine


def smoke_catalog(engine: GpuEngine) -> dict[str, Any]:
    """The real catalog plus one deployment of ``engine.model`` on pool ``gpu-smoke``.

    Every field the catalog schema requires is set; the model gets a (zero) price entry if it has
    none, since each deployment's model must be priced. The new deployment comes first so the
    gateway's static routing prefers it when the model is also served by another pool.
    """
    data: dict[str, Any] = yaml.safe_load(REAL_CATALOG.read_text())
    gpus = [g["gpu"] for g in data["prices"]["gpus"]]
    deployment = {
        "id": f"gpu-smoke-{engine.engine}",
        "model": engine.model,
        "engine": engine.engine,
        "pool": POOL,
        "pipeline": "experimental",
        "max_context": 4096,  # gpu-smoke.sh starts vLLM with --max-model-len 4096
        "quality": 0.5,
        "gpu": "H100-SXM" if "H100-SXM" in gpus else gpus[0],
        "gpu_count": 1,
        "priors": {"ttft_p95_s": 1.0, "itl_p95_s": 0.1},
        "aliases": [],
        "supports_tools": False,
    }
    data["deployments"] = [deployment, *(d for d in data["deployments"] if d["id"] != deployment["id"])]
    if engine.model not in {p["model"] for p in data["prices"]["models"]}:
        data["prices"]["models"].append(
            {
                "model": engine.model,
                "input_per_mtok_usd": 0.0,
                "output_per_mtok_usd": 0.0,
                "source": "GPU smoke test deployment (scripts/gpu-smoke.sh); not a price",
                "as_of": dt.date.today(),
            }
        )
    return data


@pytest.fixture(scope="module")
def catalog_path(gpu_engine: GpuEngine, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gpu-catalog") / "catalog.yaml"
    path.write_text(yaml.safe_dump(smoke_catalog(gpu_engine), sort_keys=False))
    catalog = load_catalog(path)  # fails here, with the line, if the copy is not a valid catalog
    first = catalog.resolve(gpu_engine.model)[0]
    assert (first.id, first.pool) == (f"gpu-smoke-{gpu_engine.engine}", POOL)
    return path


@pytest.fixture
def smoke(stack: Stack, gpu_engine: GpuEngine, catalog_path: Path) -> Iterator[SmokeStack]:
    env = {"LLMLAB_CATALOG_PATH": str(catalog_path)}
    worker = stack.worker(gpu_engine.engine, POOL, gpu_engine.url, max_concurrency=8, heartbeat_s=0.2, env=env)
    gateway = stack.gateway(env=env)
    yield SmokeStack(stack, gpu_engine, worker, gateway)


def test_streaming_chat_through_the_gateway(smoke: SmokeStack) -> None:
    stream = smoke.client().chat.completions.create(
        model=smoke.engine.model,
        messages=MESSAGES,
        max_tokens=MAX_TOKENS,
        temperature=0.0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks, "no chunks"
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content.strip(), chunks
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"], finishes
    # include_usage: one last chunk with no choices and the usage; every other chunk has usage None.
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None, last
    assert all(c.usage is None for c in chunks[:-1])
    assert last.usage.completion_tokens == MAX_TOKENS
    assert last.usage.prompt_tokens > 5
    assert last.usage.total_tokens == last.usage.prompt_tokens + MAX_TOKENS
    assert {c.model for c in chunks} == {smoke.engine.model}
    assert len({c.id for c in chunks}) == 1


def test_non_streaming_chat_through_the_gateway(smoke: SmokeStack) -> None:
    resp = smoke.client().chat.completions.create(
        model=smoke.engine.model,
        messages=MESSAGES,
        max_tokens=MAX_TOKENS,
        temperature=0.0,
    )
    assert resp.model == smoke.engine.model
    assert len(resp.choices) == 1
    choice = resp.choices[0]
    assert choice.message.role == "assistant"
    assert (choice.message.content or "").strip(), resp
    assert choice.finish_reason == "length"
    assert resp.usage is not None
    assert resp.usage.completion_tokens == MAX_TOKENS
    assert resp.usage.prompt_tokens > 5
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + MAX_TOKENS


def test_models_lists_the_smoke_model(smoke: SmokeStack) -> None:
    ids = [m.id for m in smoke.client().models.list()]
    assert smoke.engine.model in ids


async def test_worker_heartbeat_carries_engine_load(smoke: SmokeStack) -> None:
    async with WorkerClient(smoke.stack.namespace, smoke.stack.nats_url) as client:
        await asyncio.sleep(1.0)
        hbs = [h for h in client.heartbeats if h.pool == POOL]
    assert hbs, "no heartbeat from the worker"
    hb = hbs[-1]
    assert hb.engine == smoke.engine.engine
    assert hb.ready and not hb.draining
    assert hb.models == [smoke.engine.model]
    # Read from the engine's /metrics (SGLang needs --enable-metrics for these).
    assert hb.load.running is not None, hb.load
    assert hb.load.waiting is not None, hb.load
    assert hb.load.kv_cache_usage is not None and 0 <= hb.load.kv_cache_usage <= 1, hb.load
