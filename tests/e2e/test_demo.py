"""`make demo`'s own path: scripts/stack.sh brings the native stack up, scripts/demo.py drives it
with the openai SDK and a load run and writes its report. Ports, run dir and namespace are the
test's own so a developer's running stack is not touched."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from llmlab_testkit.fixtures import _cleanup
from llmlab_testkit.procs import free_port, unique_namespace

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]


def test_demo_runs_end_to_end_and_writes_its_report(tmp_path: Path) -> None:
    ns = unique_namespace()
    env = {
        **os.environ,
        "LLMLAB_NAMESPACE": ns,
        "LLMLAB_RUN_DIR": str(tmp_path / "run"),
        **{
            k: str(free_port())
            for k in (
                "GATEWAY_PORT",
                "BUDGET_PORT",
                "ROUTER_PORT",
                "ACCOUNTING_PORT",
                "SIM_VLLM_PORT",
                "SIM_SGLANG_PORT",
                "WORKER_VLLM_PORT",
                "WORKER_SGLANG_PORT",
            )
        },
    }
    try:
        subprocess.run(["bash", "scripts/stack.sh", "up"], cwd=REPO, env=env, check=True, timeout=120)
        out = subprocess.run(
            [sys.executable, "scripts/demo.py", "--out", str(tmp_path / "results")],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        assert "HTTP 404" in out.stdout and "HTTP 503" in out.stdout  # the error tour
        assert "recomputed from the record: IDENTICAL" in out.stdout  # the routing tour's explain
        assert "HTTP 401" in out.stdout and "HTTP 429" in out.stdout and "insufficient_quota" in out.stdout
        reports = list((tmp_path / "results").glob("demo-*.md"))
        assert len(reports) == 1
        text = reports[0].read_text()
        assert "| meta-llama/Llama-3.1-8B-Instruct | 150 x 2 | 300 | 0 |" in text
        assert "| Qwen/Qwen3-32B | 50 x 2 | 100 | 0 |" in text
        assert '"simulated": true' in text
        assert list((tmp_path / "results").glob("demo-*.png"))
        # Every request reached ClickHouse (chdb) through accounting; the SQL reports ran on it.
        assert "attempts in ClickHouse" in out.stdout
        (cost_dir,) = (tmp_path / "results").glob("demo-*-cost")
        assert "meta-llama/Llama-3.1-8B-Instruct" in (cost_dir / "cost_by_model_day.md").read_text()
    finally:
        subprocess.run(["bash", "scripts/stack.sh", "down"], cwd=REPO, env=env, timeout=60)
        asyncio.run(
            _cleanup(
                ns,
                env.get("LLMLAB_NATS_URL", "nats://127.0.0.1:4222"),
                env.get("LLMLAB_REDIS_URL", "redis://127.0.0.1:6379/0"),
            )
        )
