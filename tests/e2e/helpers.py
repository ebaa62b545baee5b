from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import httpx
import openai
from llmlab_testkit.fixtures import DEV_KEY
from llmlab_testkit.procs import ManagedProcess, url

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
QWEN = "Qwen/Qwen3-32B"


def client(gw: ManagedProcess, api_key: str = DEV_KEY) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url(gw) + "/v1", api_key=api_key, max_retries=0)


def metric(p: ManagedProcess, name: str, **labels: str) -> float:
    """Sum of a metric's samples whose labels include ``labels``."""
    text = httpx.get(url(p) + "/metrics", timeout=5).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#") or not (line.startswith(name + "{") or line.startswith(name + " ")):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[-1])
    return total


def sim_stats(sim: ManagedProcess) -> dict[str, object]:
    return httpx.get(url(sim) + "/sim/stats", timeout=5).json()  # type: ignore[no-any-return]


async def eventually(check: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)
