"""Builders for decision inputs (pure unit tests of the router's plug-ins)."""

from __future__ import annotations

from typing import Any

from llmlab_common.messages import Heartbeat
from llmlab_routing.model import Constraints, DecisionInputs, DeploymentView, WorkerView


def worker(wid: str, in_flight: int = 0, max_concurrency: int = 8, match: int = 0) -> WorkerView:
    return WorkerView(wid, in_flight, max_concurrency, None, match)


def dep(did: str, **kw: Any) -> DeploymentView:
    base: dict[str, Any] = {
        "id": did,
        "model": f"m-{did}",
        "pool": f"p-{did}",
        "engine": "vllm",
        "pipeline": "throughput",
        "quality": 0.5,
        "max_context": 8192,
        "supports_tools": True,
        "input_usd_per_mtok": 1.0,
        "output_usd_per_mtok": 1.0,
        "ttft_p95_s": 0.2,
        "itl_p95_s": 0.02,
        "latency_source": "prior",
        "workers": [worker(f"{did}-w1")],
    }
    base.update(kw)
    return DeploymentView(**base)


def inputs(deps: list[DeploymentView], **kw: Any) -> DecisionInputs:
    cons = Constraints(
        plan="pro",
        slo_class="interactive",
        slo_ttft_s=1.0,
        slo_tpot_s=0.1,
        slo_e2e_s=None,
        quality_floor=0.0,
        difficulty_floor=0.0,
        cost_cap_usd=1.0,
    )
    for k in list(kw):
        if hasattr(cons, k):
            setattr(cons, k, kw.pop(k))
    base: dict[str, Any] = {
        "request_id": "r1",
        "model": "auto",
        "prompt_tokens": 100,
        "max_output_tokens": 100,
        "difficulty": 0.0,
        "difficulty_class": "easy",
        "length_class": "short",
        "needs_tools": False,
        "prefix_blocks": 0,
        "prefix_key": "",
        "constraints": cons,
        "policy": "test",
        "policy_version": "v",
        "filters": ["healthy", "context", "tools", "quality-floor", "cost-cap", "difficulty", "slo"],
        "weights": {"quality": 0.5, "latency": 0.3, "cost": 0.2},
        "picker": "least-load",
        "max_chain": 3,
        "replica_retries": 1,
        "load_bound": 0.25,
        "seed": 1,
        "deployments": deps,
    }
    base.update(kw)
    return DecisionInputs(**base)


def heartbeat(wid: str, pool: str = "gpu-vllm", in_flight: int = 0, interval: float = 1.0, slots: int = 8) -> Heartbeat:
    return Heartbeat(
        worker_id=wid,
        pool=pool,
        engine="vllm",
        models=[],
        max_concurrency=slots,
        in_flight=in_flight,
        ready=True,
        interval_s=interval,
        sent_at=0.0,
    )
