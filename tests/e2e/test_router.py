"""The router service through the whole stack: three simulated deployments with different cost,
speed and quality, the choice under each policy, fallback when the chosen worker dies before its
first token, a chain where every target fails (503, bounded), and `router explain` replaying
logged decisions exactly."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import nats
import pytest
from llmlab_common.subjects import Topology
from llmlab_testkit.e2e import LLAMA, QWEN, eventually, metric, sim_stats
from llmlab_testkit.fixtures import DEV_KEY
from llmlab_testkit.procs import ManagedProcess, Stack, url
from nats.aio.msg import Msg

pytestmark = pytest.mark.e2e
AUTH = {"Authorization": f"Bearer {DEV_KEY}"}
SMOL = "SmolLM2-135M-Instruct"
HELLO = [{"role": "user", "content": "hello"}]
REPO = Path(__file__).resolve().parents[2]


def three_deployments(stack: Stack, *, ttft_ms: float = 30, qwen_ttft_ms: float = 30) -> dict[str, ManagedProcess]:
    """One simulator + worker per catalog deployment (llama: gpu-vllm, qwen: gpu-sglang, smollm: cpu-vllm)."""
    sims = {
        "llama-8b-vllm": stack.sim("vllm", LLAMA, ttft_ms=ttft_ms, itl_ms=5, output_len=8),
        "qwen3-32b-sglang": stack.sim("sglang", QWEN, ttft_ms=qwen_ttft_ms, itl_ms=5, output_len=8),
        "smollm2-cpu": stack.sim("vllm", SMOL, ttft_ms=ttft_ms, itl_ms=5, output_len=8),
    }
    stack.worker("vllm", "gpu-vllm", url(sims["llama-8b-vllm"]), worker_id="llama-w1")
    stack.worker("sglang", "gpu-sglang", url(sims["qwen3-32b-sglang"]), worker_id="qwen-w1")
    stack.worker("vllm", "cpu-vllm", url(sims["smollm2-cpu"]), worker_id="smol-w1")
    return sims


def catalog_status(router: ManagedProcess) -> dict:
    return httpx.get(url(router) + "/admin/catalog", timeout=5).json()  # type: ignore[no-any-return]


def explain(request_id: str, log_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llmlab_router", "explain", request_id, "--log", str(log_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )


async def chat(gw: ManagedProcess, model: str = "auto", timeout: float = 30, **headers: str) -> httpx.Response:
    async with httpx.AsyncClient() as h:
        return await h.post(
            url(gw) + "/v1/chat/completions",
            headers={**AUTH, **headers},
            timeout=timeout,
            json={"model": model, "messages": HELLO, "max_tokens": 8},
        )


async def test_choice_under_each_policy_through_the_router_service(stack: Stack) -> None:
    sims = three_deployments(stack)
    router = stack.router()
    gw = stack.gateway(router="service")
    # Priors from configs/catalog.yaml (fewer than min_samples completions per deployment, so
    # the priors decide): llama fastest, smollm cheapest, qwen best quality.
    expected = {
        "static": "llama-8b-vllm",  # alias auto -> the deployment that carries it, catalog order
        "latency-first": "llama-8b-vllm",
        "cost-first": "smollm2-cpu",
        "quality-first": "qwen3-32b-sglang",
        "multi-objective": "llama-8b-vllm",  # 0.5 quality + 0.3 latency + 0.2 cost
    }
    for policy, dep in expected.items():
        r = await chat(gw, **{"x-llmlab-route-policy": policy})
        assert r.status_code == 200, r.text
        assert r.headers["x-llmlab-deployment"] == dep, policy
        assert r.headers["x-llmlab-route-policy"] == policy
    # A stricter quality floor asked by the request removes llama (0.62) and smollm (0.10).
    r = await chat(gw, **{"x-llmlab-quality-floor": "0.7"})
    assert r.headers["x-llmlab-deployment"] == "qwen3-32b-sglang"
    # The request's SLO class changes the weights: batch traffic cares little about latency
    # (multi-objective's slo_weights), so the better, slower model wins.
    r = await chat(gw, **{"x-llmlab-slo-class": "batch"})
    assert r.headers["x-llmlab-deployment"] == "qwen3-32b-sglang"
    # Aliases carry their policy.
    assert (await chat(gw, "cheap")).headers["x-llmlab-deployment"] == "smollm2-cpu"
    assert (await chat(gw, "best")).headers["x-llmlab-deployment"] == "qwen3-32b-sglang"
    # The engines that answered are the ones chosen.
    assert sim_stats(sims["qwen3-32b-sglang"])["received"] == 4
    assert sim_stats(sims["smollm2-cpu"])["received"] == 2
    # Hints that ask for the impossible are the client's error, in OpenAI's shape.
    r = await chat(gw, **{"x-llmlab-quality-floor": "0.95"})
    assert r.status_code == 422 and r.json()["error"]["code"] == "no_route"
    r = await chat(gw, **{"x-llmlab-route-policy": "fastest-ever"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_route_policy"
    r = await chat(gw, **{"x-llmlab-quality-floor": "high"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_header"
    r = await chat(gw, **{"x-llmlab-slo-class": "whenever"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_slo_class"
    # Every decision was made by the router service (none degraded to the gateway), the refused
    # one included; the three malformed requests never reached a decision.
    log_path = router.decision_log
    await eventually(lambda: len(log_path.read_text().splitlines()) == 10, what="10 records")  # written off-path
    decisions = [json.loads(line) for line in log_path.read_text().splitlines()]
    assert decisions[-1]["decision"]["targets"] == [] and decisions[-1]["decision"]["error_status"] == 422


async def test_killed_worker_before_first_token_falls_back_to_the_next_deployment(stack: Stack) -> None:
    # qwen's long prefill keeps attempt 1 before its first token while its worker is killed.
    sims = three_deployments(stack, qwen_ttft_ms=4000)
    stack.router()
    gw = stack.gateway(router="service")
    pending = asyncio.create_task(chat(gw, "best"))
    await eventually(lambda: sim_stats(sims["qwen3-32b-sglang"])["received"] == 1, what="qwen took it")
    doomed = next(p for p in stack.procs if p.name == "worker-sglang-gpu-sglang")
    doomed.kill()  # SIGKILL: heartbeats stop, no token ever comes
    r = await pending
    assert r.status_code == 200, r.text
    # The chain: qwen's worker, qwen's pool (its replica retry: no worker came back within
    # empty_pool_wait_s), then llama, the next deployment by quality.
    assert r.headers["x-llmlab-attempts"] == "3"
    assert r.headers["x-llmlab-deployment"] == "llama-8b-vllm"
    assert r.json()["choices"][0]["message"]["content"]


async def test_chain_where_every_target_fails_ends_in_503_within_the_limit(stack: Stack) -> None:
    # One deployment, two workers on one slow engine: the chain is worker A then worker B.
    sim = stack.sim("vllm", LLAMA, ttft_ms=5000, itl_ms=5, output_len=8)
    a = stack.worker("vllm", "gpu-vllm", url(sim), worker_id="wa")
    b = stack.worker("vllm", "gpu-vllm", url(sim), worker_id="wb")
    gw = stack.gateway()
    t0 = time.monotonic()
    pending = asyncio.create_task(chat(gw, LLAMA))
    await eventually(lambda: sim_stats(sim)["received"] == 1, what="a worker took it")
    a.kill()
    b.kill()
    r = await pending
    assert r.status_code == 503, r.text
    err = r.json()["error"]
    assert err["code"] == "all_routes_failed"
    assert "All 2 routes failed" in err["message"]
    assert time.monotonic() - t0 < 15
    assert sim_stats(sim)["received"] == 1  # the fallback never reached an engine, nothing looped


async def test_router_explain_reproduces_ten_logged_decisions(stack: Stack) -> None:
    three_deployments(stack)
    router = stack.router()
    gw = stack.gateway(router="service")
    policies = ["multi-objective", "cost-first", "quality-first", "latency-first", "static", "cache-aware"]
    for i in range(10):
        r = await chat(gw, **{"x-llmlab-route-policy": policies[i % len(policies)]})
        assert r.status_code == 200, r.text
    log_path = router.decision_log
    await eventually(lambda: len(log_path.read_text().splitlines()) == 10, what="10 records")
    records = [json.loads(line) for line in log_path.read_text().splitlines()]
    for rec in records:
        out = explain(rec["request_id"], log_path)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "recomputed from the record: IDENTICAL" in out.stdout
        assert rec["decision"]["targets"][0]["deployment"] in out.stdout


async def test_catalog_reload_with_an_error_keeps_the_last_good_one(stack: Stack) -> None:
    catalog = stack.workdir / "catalog.yaml"
    shutil.copy(REPO / "configs" / "catalog.yaml", catalog)
    env = {"LLMLAB_CATALOG_PATH": str(catalog), "LLMLAB_ROUTER_RELOAD_INTERVAL_S": "0.2"}
    sim = stack.sim("vllm", LLAMA, ttft_ms=20, itl_ms=5, output_len=4)
    stack.worker("vllm", "gpu-vllm", url(sim))
    router = stack.router(env=env)
    gw = stack.gateway(router="service", env=env)
    before = catalog_status(router)
    text = catalog.read_text()
    catalog.write_text(text.replace("picker: prefix-affinity", "picker: telepathy", 1))
    await eventually(
        lambda: catalog_status(router)["failed_reloads"] >= 1,
        what="refused reload",
    )
    status = catalog_status(router)
    assert status["version"] == before["version"]
    assert "unknown picker 'telepathy'" in status["last_error"]
    line = next(i for i, s in enumerate(catalog.read_text().splitlines(), 1) if "telepathy" in s)
    assert f"catalog.yaml:{line}:" in status["last_error"]
    r = await chat(gw, LLAMA)  # still routing with the last good catalog
    assert r.status_code == 200 and r.headers["x-llmlab-deployment"] == "llama-8b-vllm"
    catalog.write_text(text.replace("max_chain: 3", "max_chain: 2", 1))
    await eventually(
        lambda: catalog_status(router)["version"] != before["version"],
        what="good reload",
    )
    assert catalog_status(router)["last_error"] is None


def _chosen_workers(log_path: Path) -> dict[str, str]:
    """request id -> the first target's worker, from a decision log."""
    out = {}
    for line in log_path.read_text().splitlines():
        rec = json.loads(line)
        out[rec["request_id"]] = rec["decision"]["targets"][0]["worker_id"]
    return out


async def test_shared_mode_gateways_route_on_each_others_decisions(stack: Stack) -> None:
    """Gateways in ``shared`` router mode decide themselves and publish each choice, so each counts
    the others' work in flight before any heartbeat reports it (heartbeats every 5 s here). Two idle
    workers, the least-load picker (ties by id): a request through gateway A, and 0.3 s later one
    through B, go to different workers, twice; so do one through A and one through a
    service-mode gateway C (the router service follows the commits too). Without the commits, B and
    the router would see two idle workers and pick A's worker again."""
    sim = stack.sim("vllm", SMOL, ttft_ms=800, itl_ms=1, output_len=2)
    for i in (1, 2):
        stack.worker("vllm", "cpu-vllm", url(sim), worker_id=f"smol-w{i}", heartbeat_s=5)
    router = stack.router()
    a, b = stack.gateway(router="shared"), stack.gateway(router="shared")
    c = stack.gateway(router="service", env={"LLMLAB_GATEWAY_ROUTER_TIMEOUT_S": "5"})
    # Every gateway has heard both workers before the first pair: a commit about a worker a gateway
    # has not heard of yet is not counted (heartbeats come every 5 s here; a loaded CI host started
    # the gateways between two of them, twice, and B then saw two idle workers).
    await eventually(
        lambda: all(metric(g, "llmlab_gateway_live_workers", pool="cpu-vllm") == 2 for g in (a, b, c)),
        timeout=15,
        what="every gateway sees both workers",
    )

    # The second request of a pair leaves once A's commit is on the bus (plus 0.3 s for the other
    # gateway and the router to take it), not at a fixed delay: a loaded CI host once took longer
    # than 0.3 s to route A's request at all (CI of 2026-12-06).
    nc = await nats.connect(stack.nats_url)
    committed = asyncio.Queue[bytes]()

    async def on_commit(msg: Msg) -> None:
        committed.put_nowait(msg.data)

    await nc.subscribe(Topology(stack.namespace).router_commit_wildcard, cb=on_commit)

    async def send(gw: ManagedProcess, after_commit: bool) -> str:
        if after_commit:
            await asyncio.wait_for(committed.get(), timeout=10)
            await asyncio.sleep(0.3)
        async with httpx.AsyncClient() as h:
            r = await h.post(
                url(gw) + "/v1/chat/completions",
                headers={**AUTH, "x-llmlab-route-policy": "latency-first"},
                timeout=30,
                json={"model": SMOL, "messages": HELLO, "max_tokens": 2},
            )
        assert r.status_code == 200, r.text
        return r.headers["x-request-id"]

    pairs = []
    for other in (b, b, c):
        pairs.append(await asyncio.gather(send(a, False), send(other, True)))
        while not committed.empty():  # B's own commit: the next pair waits for A's again
            committed.get_nowait()
    await nc.close()
    chosen: dict[str, str] = {}
    for log_path in [*stack.workdir.glob("gateway-*-decisions.jsonl"), router.decision_log]:
        chosen.update(_chosen_workers(log_path))
    for first, second in pairs:
        assert {chosen[first], chosen[second]} == {"smol-w1", "smol-w2"}, pairs

    # The router service counts the gateways' decisions too: A made 3 and B 2, by the policy asked.
    def decisions(outcome: str) -> float:
        return metric(router, "llmlab_router_decisions_total", policy="latency-first", outcome=outcome)

    await eventually(lambda: decisions("shared") == 3 + 2, timeout=5, what="5 shared decisions counted")
    assert decisions("routed") == 1  # C's, decided by the service itself
