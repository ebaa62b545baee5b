"""Scale-out on one host: a gateway run as several processes on one port (SO_REUSEPORT) and a
worker run as several processes in front of one engine (``processes`` in their settings)."""

from __future__ import annotations

import asyncio
import functools
import signal
import socket

import httpx
import psutil
import pytest
from llmlab_testkit.e2e import LLAMA, client, eventually, metric
from llmlab_testkit.fixtures import DEV_KEY
from llmlab_testkit.procs import Stack, url

pytestmark = pytest.mark.e2e
HELLO = [{"role": "user", "content": "hello"}]


def _two_free_ports() -> int:
    """A port p such that p and p + 1 are both free now."""
    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            base = int(a.getsockname()[1])
            try:
                with socket.socket() as b:
                    b.bind(("127.0.0.1", base + 1))
                    return base
            except OSError:
                continue
    raise RuntimeError("no two consecutive free ports")


def _requests_total(ops_url: str) -> float:
    text = httpx.get(ops_url + "/metrics", timeout=5).text
    return sum(
        float(line.rsplit(" ", 1)[-1])
        for line in text.splitlines()
        if line.startswith("llmlab_gateway_requests_total{") and 'status="200"' in line
    )


async def test_gateway_processes_share_its_port_and_stop_together(stack: Stack) -> None:
    """Catches: copies that are not started, that cannot bind the shared port (no SO_REUSEPORT),
    that never receive a connection, or that outlive their first process on SIGTERM."""
    sim = stack.sim("vllm", LLAMA, itl_ms=100, output_len=40)
    stack.worker("vllm", "gpu-vllm", url(sim), heartbeat_s=0.2)
    ops = _two_free_ports()
    gw = stack.gateway(
        env={"LLMLAB_GATEWAY_PROCESSES": "2", "LLMLAB_GATEWAY_PROCESS_OPS_PORT_BASE": str(ops)},
    )
    copies = psutil.Process(gw.pid).children()
    assert len(copies) == 1, copies
    ops_urls = [f"http://127.0.0.1:{ops + i}" for i in range(2)]
    for u in ops_urls:  # each process answers on its own ops port once it is up
        await eventually(functools.partial(_ready, u), timeout=15, what=f"{u}/ready")
    # One connection per request: the kernel spreads new connections over the processes.
    n = 24
    for _ in range(n):
        async with client(gw) as c:
            r = await c.chat.completions.create(model=LLAMA, messages=HELLO, max_tokens=2)
            assert r.choices[0].message.content
    per_process = [_requests_total(u) for u in ops_urls]
    assert sum(per_process) == n, per_process
    assert min(per_process) > 0, f"one process took every connection: {per_process}"

    # A 4 s stream held by the copy: the copy drains for seconds, and the first process must not
    # exit before it (uvicorn re-raises the SIGTERM once it stops serving, ending the process).
    held: list[asyncio.Task[int]] = []
    for _ in range(30):
        held.append(asyncio.create_task(_hold_stream(url(gw))))
        await asyncio.sleep(0.3)
        if _in_flight(ops_urls[1]) >= 1:
            break
    assert _in_flight(ops_urls[1]) >= 1, "no stream reached the copy"

    # SIGTERM to the first process only (not its process group): it drains and stops its copies.
    assert gw.proc is not None
    gw.stopped = True
    gw.proc.send_signal(signal.SIGTERM)
    gw.proc.wait(20)
    assert not any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in copies)
    assert all(n >= 40 for n in await asyncio.gather(*held))  # every in-flight stream was finished


def _in_flight(ops_url: str) -> float:
    text = httpx.get(ops_url + "/metrics", timeout=5).text
    return sum(float(ln.rsplit(" ", 1)[-1]) for ln in text.splitlines() if ln.startswith("llmlab_gateway_in_flight"))


async def _hold_stream(gateway_url: str) -> int:
    """A streamed request on a connection of its own; returns the content chunks received."""
    body = {"model": LLAMA, "messages": HELLO, "max_tokens": 40, "stream": True}
    n = 0
    async with (
        httpx.AsyncClient(timeout=30) as h,
        h.stream(
            "POST", gateway_url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {DEV_KEY}"}
        ) as r,
    ):
        async for line in r.aiter_lines():
            n += line.startswith("data: {") and '"content":"' in line and '"content":""' not in line
    return n


def _ready(u: str) -> bool:
    try:
        return httpx.get(u + "/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


async def test_worker_processes_serve_one_engine(stack: Stack) -> None:
    """Catches: worker copies that share one worker id (the gateway would see one worker) or that
    never pull: with two processes the gateway counts two live workers, and concurrent requests
    are taken by both."""
    sim = stack.sim("vllm", LLAMA, itl_ms=50, output_len=8)
    ops = _two_free_ports()
    w_env = {"LLMLAB_WORKER_PROCESSES": "2", "LLMLAB_WORKER_PROCESS_OPS_PORT_BASE": str(ops)}
    stack.worker("vllm", "gpu-vllm", url(sim), heartbeat_s=0.2, max_concurrency=4, env=w_env)
    gw = stack.gateway()
    await eventually(lambda: metric(gw, "llmlab_gateway_live_workers", pool="gpu-vllm") == 2, timeout=10)
    async with client(gw) as c:
        # 16 concurrent requests of 0.4 s against 4 slots per process: one process alone cannot take them all at once.
        results = await asyncio.gather(
            *(c.chat.completions.create(model=LLAMA, messages=HELLO, max_tokens=8) for _ in range(16))
        )
    assert all(r.choices[0].message.content for r in results)
    taken = [_counter(f"http://127.0.0.1:{ops + i}", "llmlab_worker_attempts_total") for i in range(2)]
    assert sum(taken) == 16 and min(taken) > 0, taken


def _counter(ops_url: str, name: str) -> float:
    text = httpx.get(ops_url + "/metrics", timeout=5).text
    return sum(float(line.rsplit(" ", 1)[-1]) for line in text.splitlines() if line.startswith(name + "{"))
