"""The policy evaluation (llmlab_lab.router_eval): seeded request set, replay through the twin with
the router as dispatcher, and the table's invariants. Small runs: about a second each."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from llmlab_lab.router_eval import (
    EVAL_CATALOG,
    PICKERS,
    POLICIES,
    EvalRequest,
    PrefixWorkloadSpec,
    WorkloadSpec,
    generate_prefix_requests,
    generate_requests,
    main,
    picker_catalog,
    policies_markdown,
    route_hashes,
    run_pickers,
    run_policies,
    save_requests,
)
from llmlab_routing.config import RouterCatalog, load_router_catalog
from llmlab_twin.replay import VirtualSetup, run_virtual
from llmlab_twin.sched import LinearCost, SeqState, StepScheduler, TwinSeq
from llmlab_twin.trace import TraceRequest

pytestmark = pytest.mark.unit

SMALL = WorkloadSpec(requests=240, rate_rps=12.0)
Results = tuple[list[EvalRequest], dict[str, dict[str, Any]]]


@pytest.fixture(scope="module")
def rc() -> RouterCatalog:
    return load_router_catalog(EVAL_CATALOG)


@pytest.fixture(scope="module")
def small_results(rc: RouterCatalog) -> Results:
    reqs = generate_requests(3, SMALL)
    return reqs, run_policies(rc, reqs, seed=3)


def test_generator_is_deterministic_for_a_seed() -> None:
    a = [r.to_json() for r in generate_requests(7, SMALL)]
    b = [r.to_json() for r in generate_requests(7, SMALL)]
    c = [r.to_json() for r in generate_requests(8, SMALL)]
    assert a == b
    assert a != c


def test_generator_mixes_kinds_classes_and_difficulty() -> None:
    reqs = generate_requests(7, WorkloadSpec(requests=600))
    kinds = {r.kind for r in reqs}
    assert kinds == {"shared-prefix", "long-doc", "short-chat"}
    assert {r.trace.slo_class for r in reqs} == {"interactive", "batch"}
    assert any(r.difficulty >= 0.67 for r in reqs) and any(r.difficulty < 0.34 for r in reqs)
    assert any(r.quality_floor for r in reqs)
    assert len({r.trace.prefix_group for r in reqs if r.trace.prefix_group}) == WorkloadSpec.groups
    times = [r.trace.t for r in reqs]
    assert times == sorted(times) and times[0] > 0


def test_requests_round_trip_through_jsonl(tmp_path: Path) -> None:
    reqs = generate_requests(1, WorkloadSpec(requests=20))
    path = tmp_path / "r.jsonl"
    save_requests(reqs, path, {"seed": 1})
    lines = path.read_text().splitlines()
    assert json.loads(lines[0])["header"]["seed"] == 1
    assert [EvalRequest.from_json(json.loads(x)) for x in lines[1:]] == reqs


def test_prefix_hashes_shared_within_a_group_only() -> None:
    def tr(i: str, group: str | None) -> TraceRequest:
        return TraceRequest(t=0, id=i, prompt_tokens=3000, output_tokens=8, prefix_group=group, prefix_tokens=2048)

    a, b, c, d = (route_hashes(tr(i, g), 256, 8) for i, g in [("1", "g"), ("2", "g"), ("3", "h"), ("4", None)])
    assert a == b and len(a) == 8
    assert not set(a) & set(c)
    assert not set(a) & set(d)


def test_run_virtual_accepts_a_refusal_from_pick() -> None:
    reqs = [TraceRequest(t=i * 0.1, id=f"x{i}", prompt_tokens=64, output_tokens=4) for i in range(6)]

    def pick(workers: Sequence[StepScheduler], seq: TwinSeq) -> int:
        return -1 if seq.id in {"x1", "x4"} else 0

    _, seqs, _ = run_virtual(reqs, LinearCost(), VirtualSetup(workers=2), pick=pick)
    states = {s.id: s.state for s in seqs}
    assert states["x1"] is SeqState.REJECTED and states["x4"] is SeqState.REJECTED
    assert sum(st is SeqState.DONE for st in states.values()) == 4


def test_every_policy_in_the_table_with_sane_invariants(small_results: Results) -> None:
    reqs, res = small_results
    assert list(res) == list(POLICIES)
    n = len(reqs)
    for m in res.values():
        assert m["requests"] == n
        assert m["routed"] + sum(m["refused"].values()) == n
        assert 0.0 <= m["success_rate"] <= 1.0 and 0.0 <= m["slo_violation_rate"] <= 1.0
        assert m["e2e_p95_s"] >= m["ttft_p95_s"] > 0
        assert abs(sum(m["share"].values()) - m["routed"] / n) < 1e-3
    assert res["cost-first"]["mean_cost_usd"] <= res["quality-first"]["mean_cost_usd"]
    assert res["quality-first"]["quality"] >= res["cost-first"]["quality"]
    # static sends `auto` to its one deployment (llama-8b, quality 0.62): requests stating a floor of
    # 0.75 are refused; every other policy finds the 32B for them.
    strict = sum(1 for r in reqs if r.quality_floor)
    assert strict > 0
    assert sum(res["static"]["refused"].values()) == strict
    assert res["static"]["share"]["llama-8b-h100"] == pytest.approx(1 - strict / n, abs=1e-3)
    assert all(not res[p]["refused"] for p in POLICIES if p != "static")
    md = policies_markdown(res)
    assert all(f"| {p} |" in md for p in POLICIES)


def test_replay_is_reproducible(rc: RouterCatalog) -> None:
    reqs = generate_requests(5, WorkloadSpec(requests=80, rate_rps=10.0))
    a = run_policies(rc, reqs, policies=["multi-objective"], seed=5)["multi-objective"]
    b = run_policies(rc, reqs, policies=["multi-objective"], seed=5)["multi-objective"]
    for k in ("success_rate", "quality", "e2e_p95_s", "mean_cost_usd", "share"):
        assert a[k] == b[k]


def test_picker_catalog_has_one_deployment_and_a_policy_per_picker(rc: RouterCatalog) -> None:
    prc = picker_catalog(rc)
    assert [d.id for d in prc.catalog.deployments] == ["llama-8b-h100"]
    assert sorted(prc.routing.policies) == sorted(f"pick-{p}" for p in PICKERS)


def test_prefix_affinity_raises_the_hit_rate(rc: RouterCatalog) -> None:
    reqs = generate_prefix_requests(2, PrefixWorkloadSpec(requests=300, rate_rps=40.0))
    res = run_pickers(rc, reqs, seed=2)
    assert list(res) == list(PICKERS)
    assert res["round-robin"]["requests_per_worker"] == [75, 75, 75, 75]
    assert res["prefix-affinity"]["prefix_cache_hit_rate"] > res["round-robin"]["prefix_cache_hit_rate"]


def test_cli_writes_every_output(tmp_path: Path) -> None:
    out = tmp_path / "eval"
    assert main(["--out", str(out), "--requests", "60", "--prefix-requests", "60", "--no-spread"]) == 0
    for name in (
        "requests.jsonl",
        "prefix-requests.jsonl",
        "policies.md",
        "policies.json",
        "policies.png",
        "pickers.md",
        "pickers.json",
        "pickers.png",
        "README.md",
        "meta.json",
        "command.txt",
    ):
        assert (out / name).stat().st_size > 0, name
    meta = json.loads((out / "meta.json").read_text())
    assert meta["simulated"] is True and "--requests 60" in meta["command_line"]
    assert json.loads((out / "policies.json").read_text())["simulated"] is True
