"""§3.2–§3.4 KV-cache experiments: the quick runs write every output, and the results keep the
invariants the notes rely on (all figures simulated by the engine twin)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from llmlab_experiments import kv_blocks, kv_eviction, kv_traffic

pytestmark = pytest.mark.unit

OUTPUTS = {"results.json", "table.md", "command.txt", "NOTE.md", "plot.png"}


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("results")


def load(d: Path) -> dict[str, Any]:
    assert {p.name for p in d.iterdir()} >= OUTPUTS
    assert (d / "plot.png").read_bytes()[:4] == b"\x89PNG"
    assert "SIMULATED" in (d / "table.md").read_text()
    note = (d / "NOTE.md").read_text()
    assert "## Interpretation" in note and "SIMULATED" in note
    data = json.loads((d / "results.json").read_text())
    assert data["label"].startswith("SIMULATED") and data["meta"]["simulated"] is True
    return data


def test_waste_grows_with_block_size() -> None:
    lengths = np.asarray([1, 15, 16, 17, 100, 1000, 4097], dtype=float)
    rows = kv_blocks.waste_rows(lengths, 131072.0, kv_blocks.BLOCK_SIZES)
    waste = [r["waste_tokens_mean"] for r in rows]
    assert waste == sorted(waste) and waste[0] < waste[-1]
    # a 16-token request wastes nothing at block 8 or 16, the shared 1000-token prompt loses its tail
    assert rows[1]["shared_prefix_tokens_shareable"] == 992 and rows[-1]["shared_prefix_tokens_shareable"] == 896


def test_kv_bytes_from_the_model_config() -> None:
    # Llama-3.1-8B: 32 layers x 2 x 8 KV heads x 128 head_dim x 2 bytes
    assert kv_blocks.kv_bytes_per_token("Llama-3.1-8B", "bf16") == 32 * 2 * 8 * 128 * 2


def test_kv_blocks_quick(out: Path) -> None:
    d = kv_blocks.run(out, True, "python -m llmlab_experiments --quick --only kv_blocks")
    data = load(d)
    rows = data["rows"]["block_sizes"]
    shares = [r["waste_share"] for r in rows]
    assert shares == sorted(shares) and shares[-1] > shares[0]
    hits = [r["replay_hit_rate_first_admission"] for r in rows]
    assert hits[1] > hits[-1]  # block 128 shares fewer of the 1000 prefix tokens than block 16
    assert data["rows"]["contiguous_baseline"]["waste_share"] > 10 * shares[-1]


def test_kv_traffic_quick(out: Path) -> None:
    d = kv_traffic.run(out, True, "python -m llmlab_experiments --quick --only kv_traffic")
    data = load(d)["rows"]
    full = max(a["num_gpu_blocks"] for a in data["by_shape_and_budget"])
    at = {(a["shape"], a["num_gpu_blocks"]): a for a in data["by_shape_and_budget"]}
    chat, shared, docs = at[("short-chat", full)], at[("shared-system", full)], at[("longdoc-mix", full)]
    assert shared["hit_rate_first_admission"] > chat["hit_rate_first_admission"]
    # the hit rate can not exceed the share of identical prompt tokens
    assert shared["hit_rate_first_admission"] <= shared["identical_prefix_token_share"]
    assert docs["kv_usage_max"] > chat["kv_usage_max"]
    # the long-document mix runs out of KV at a larger budget than short chats
    knees = data["cache_runs_out"]
    assert knees["longdoc-mix"]["last_short_blocks"] > (knees["short-chat"]["last_short_blocks"] or 0)
    case = data["hit_rate_up_p95_worse"]
    assert case is not None and case["small"]["ttft_p95_s"] > case["large"]["ttft_p95_s"]
    assert case["small"]["preemptions"] > 0


def test_kv_eviction_quick(out: Path) -> None:
    d = kv_eviction.run(out, True, "python -m llmlab_experiments --quick --only kv_eviction")
    aggs = {a["policy"]: a for a in load(d)["rows"]["by_policy"]}
    assert {"LRU", "largest first", "cheapest recompute first", "keep paid users"} <= set(aggs)
    assert any(k.startswith("weighted") for k in aggs)
    paid, lru = aggs["keep paid users"], aggs["LRU"]
    # keep-paid protects the enterprise tenant: the best enterprise hit rate of all policies, better than LRU's
    ent = {k: a["hit_rate_by_tenant"]["enterprise"] for k, a in aggs.items()}
    assert ent["keep paid users"] == max(ent.values()) and ent["keep paid users"] > ent["LRU"]
    assert paid["hit_kept_by_tenant"]["enterprise"] > paid["hit_kept_by_tenant"]["free"]
    assert paid["hit_rate_by_tenant"]["free"] <= lru["hit_rate_by_tenant"]["free"]
    assert all(a["recompute_tokens"] > 0 for a in aggs.values())  # the budget is below the working set
