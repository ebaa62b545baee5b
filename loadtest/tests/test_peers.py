"""The peers comparison's arithmetic (llmlab_loadtest.peers): what each proxy added over the
direct run of the same step, and whose CPU counts as the proxy's. The run itself is
``make peers`` (LiteLLM in its own venv); its committed result is under results/peers/."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from llmlab_loadtest import peers

pytestmark = pytest.mark.unit


def _row(target: str, step: int, ttft50: float, ttft95: float, tokens: float) -> dict[str, Any]:
    return {
        "target": target,
        "step": step,
        "ttft_ms": {"p50": ttft50, "p95": ttft95},
        "output_tokens_per_s": tokens,
    }


def test_added_latency_and_token_ratio_are_against_the_direct_run_of_the_same_step() -> None:
    rows = [
        _row("direct", 1, 20.0, 30.0, 100.0),
        _row("ours", 1, 25.0, 40.0, 95.0),
        _row("litellm", 1, 60.0, 90.0, 80.0),
        _row("direct", 64, 50.0, 70.0, 4000.0),
        _row("ours", 64, 80.0, 150.0, 3600.0),
    ]
    out = {(r["target"], r["step"]): r for r in peers.compare(rows)}
    assert out[("ours", 1)]["added_ttft_p50_ms"] == 5.0 and out[("ours", 1)]["added_ttft_p95_ms"] == 10.0
    assert out[("litellm", 1)]["tokens_ratio"] == 0.8
    assert out[("ours", 64)]["added_ttft_p50_ms"] == 30.0 and out[("ours", 64)]["tokens_ratio"] == 0.9
    assert "tokens_ratio" not in out[("direct", 64)]


def test_the_proxy_cpu_is_the_proxys_processes_only() -> None:
    cpu = {"gateway": 0.3, "worker-vllm": 0.2, "nats": 0.1, "redis": 0.05, "twin-llama": 0.4, "client": 0.2}
    cpu["litellm"] = 0.9
    assert peers.proxy_cpu("ours", cpu) == pytest.approx(0.65)  # the engine and the client are not the proxy's
    assert peers.proxy_cpu("litellm", cpu) == 0.9
    assert peers.proxy_cpu("direct", cpu) == 0.0


def test_the_makefile_pins_the_litellm_the_module_expects() -> None:
    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    m = re.search(r"^LITELLM_VERSION := (\S+)$", makefile, re.M)
    assert m and m.group(1) == peers.LITELLM_VERSION
