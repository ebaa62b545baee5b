from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import httpx
import openai
from llmlab_common.metrics import Metrics

from llmlab_testkit.budget import DEV_ADMIN_KEY
from llmlab_testkit.fixtures import DEV_KEY
from llmlab_testkit.procs import ManagedProcess, url

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
QWEN = "Qwen/Qwen3-32B"


def client(gw: ManagedProcess, api_key: str = DEV_KEY) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url(gw) + "/v1", api_key=api_key, max_retries=0)


def metric(p: ManagedProcess | str, name: str, **labels: str) -> float:
    """Sum of a metric's samples whose labels include ``labels`` (a process of the stack, or its base URL)."""
    text = httpx.get((p if isinstance(p, str) else url(p)) + "/metrics", timeout=5).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#") or not (line.startswith(name + "{") or line.startswith(name + " ")):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[-1])
    return total


def serves(p: ManagedProcess, path: str = "/metrics") -> bool:
    """The process answers ``path`` with 200 (up, whether or not it is ready)."""
    try:
        return httpx.get(url(p) + path, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def samples(m: Metrics, prefix: str = "") -> dict[str, float]:
    """A registry's samples by their full key as rendered (name and labels, sorted by
    prometheus_client), for exact assertions in-process; only the names starting with ``prefix``."""
    out: dict[str, float] = {}
    for line in m.render()[0].decode().splitlines():
        if line and not line.startswith("#") and line.startswith(prefix):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def accounting_sql(acc: ManagedProcess | str, query: str) -> list[list[Any]]:
    """Rows of a read-only query through the accounting service's admin endpoint (a process of the
    stack, or its base URL), with the dev admin key."""
    base = acc if isinstance(acc, str) else url(acc)
    r = httpx.post(
        base + "/admin/v1/query", json={"sql": query}, headers={"Authorization": f"Bearer {DEV_ADMIN_KEY}"}, timeout=30
    )
    assert r.status_code == 200, r.text
    return r.json()["rows"]


def edited_json(data: bytes | str, **changes: Any) -> bytes:
    """A JSON document with some values replaced, by path (``usage__prompt_tokens`` is
    ``doc["usage"]["prompt_tokens"]``): poison and out-of-range events for the tests."""
    doc = json.loads(data)
    for path, value in changes.items():
        *parents, leaf = path.split("__")
        node = doc
        for key in parents:
            node = node[key]
        node[leaf] = value
    return json.dumps(doc).encode()


def sim_stats(sim: ManagedProcess) -> dict[str, object]:
    return httpx.get(url(sim) + "/sim/stats", timeout=5).json()


async def eventually(check: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


class Streamed(NamedTuple):
    status: int
    text: str
    finish: str | None
    usage: dict[str, int]  # the final usage chunk ({} unless asked for with include_usage)
    attempts: str | None  # the X-LLMLab-Attempts header


async def stream_chat(
    base: str,
    request_id: asyncio.Future[str],
    api_key: str = DEV_KEY,
    max_tokens: int = 50,
    *,
    include_usage: bool = False,
    timeout: float = 30,
) -> Streamed:
    """Stream one chat completion of LLAMA; ``request_id`` resolves as soon as headers arrive. An
    in-band error event fails the test."""
    text, finish, usage = [], None, {}
    body: dict[str, object] = {
        "model": LLAMA,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": max_tokens,
        "stream": True,
    }
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    async with (
        httpx.AsyncClient(timeout=timeout) as h,
        h.stream(
            "POST", base + "/v1/chat/completions", headers={"Authorization": f"Bearer {api_key}"}, json=body
        ) as resp,
    ):
        request_id.set_result(resp.headers["x-request-id"])
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            obj = json.loads(line[6:])
            assert "error" not in obj, obj
            if obj.get("usage"):
                usage = obj["usage"]
            if obj["choices"]:
                text.append(obj["choices"][0]["delta"].get("content") or "")
                finish = obj["choices"][0]["finish_reason"] or finish
        return Streamed(resp.status_code, "".join(text), finish, usage, resp.headers.get("x-llmlab-attempts"))
