"""Decision records: the log alone reproduces every decision (seed included); tampering shows."""

from __future__ import annotations

from pathlib import Path

import pytest
from llmlab_common.messages import RouteQuery
from llmlab_common.settings import DEFAULT_CATALOG
from llmlab_routing.config import load_router_catalog
from llmlab_routing.core import RouterCore
from llmlab_routing.records import DecisionLog, find_record, iter_records, replay
from llmlab_testkit.routing import heartbeat

pytestmark = pytest.mark.unit


def log_decisions(log_path: Path) -> None:
    """Twelve decisions over four workers and every policy, logged to ``log_path``."""
    dlog = DecisionLog(log_path)
    core = RouterCore(load_router_catalog(DEFAULT_CATALOG), decision_log=dlog)
    for i, pool in enumerate(["gpu-vllm", "gpu-vllm", "gpu-sglang", "cpu-vllm"]):
        core.state.on_heartbeat(heartbeat(f"w{i}", pool, in_flight=i, interval=60, slots=4))
    policies = [None, "static", "cost-first", "quality-first", "latency-first", "cache-aware"]
    for i in range(12):
        q = RouteQuery(
            request_id=f"r{i}",
            model="auto",
            prompt_tokens=50 + i * 300,
            max_output_tokens=64,
            difficulty=(i % 4) / 4,
            policy=policies[i % len(policies)],
            prefix_hashes=["a", "b"] if i % 2 else [],
        )
        core.route(q)
    dlog.flush()


def test_every_logged_decision_replays_identically(tmp_path: Path) -> None:
    log_path = tmp_path / "decisions.jsonl"
    log_decisions(log_path)
    records = list(iter_records(log_path))
    assert len(records) == 12
    for rec in records:
        _, same = replay(rec)
        assert same, rec["request_id"]
    # A record whose inputs were changed no longer reproduces its logged choice.
    rec = find_record(log_path, "r3")
    assert rec is not None
    rec["inputs"]["deployments"][0]["quality"] = 1.0
    rec["inputs"]["deployments"][1]["quality"] = 0.0
    rec["inputs"]["deployments"][2]["quality"] = 0.0
    assert replay(rec)[1] is False
