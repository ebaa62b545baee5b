"""`make demo`'s own path: scripts/stack.sh brings the native stack up, scripts/demo.py drives it
with the openai SDK and a load run and writes its report. Ports, run dir and namespace are the
test's own so a developer's running stack is not touched."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from llmlab_testkit.e2e import accounting_sql
from llmlab_testkit.procs import delete_namespace, free_port, unique_namespace

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
# What scripts/demo.py sends that a worker answers, besides its load run: the SDK tour's unary
# chat, streamed chat and completion (its five error calls are refused before any attempt), and
# the routing tour's four aliases plus one with a quality floor.
TOUR_ANSWERED = 3 + 5


def demo_load() -> list[tuple[str, int, int, int]]:
    """The demo's LOAD table (model, concurrent streams, requests per stream, max_tokens)."""
    spec = importlib.util.spec_from_file_location("llmlab_demo_script", REPO / "scripts" / "demo.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return list(mod.LOAD)


def test_demo_runs_end_to_end_and_writes_its_report(tmp_path: Path) -> None:
    """Catches, besides a broken demo: accounting losing or duplicating attempts on the demo's path
    (the count it prints, and the rows behind it, are those of the requests the demo made; 0 or
    any other number fails)."""
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
                "PROMETHEUS_PORT",
                "ALERTMANAGER_PORT",
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
        # Every request reached ClickHouse (chdb) through accounting, once; the SQL reports ran on it.
        load = demo_load()
        answered = TOUR_ANSWERED + sum(streams * per_stream for _, streams, per_stream, _ in load)
        printed = re.search(r"== 5\. cost report: (\d+) attempts in ClickHouse", out.stdout)
        assert printed is not None, out.stdout[-3000:]
        assert int(printed.group(1)) == answered
        acc = f"http://127.0.0.1:{env['ACCOUNTING_PORT']}"
        # One answered attempt per answered request, each model's load run all there.
        assert accounting_sql(acc, "SELECT count(), countIf(status_class = 'ok') FROM attempts") == [
            [answered, answered]
        ]
        assert accounting_sql(acc, "SELECT count() FROM requests WHERE attempts = 1 AND status_class = 'ok'") == [
            [answered]
        ]
        by_model = dict(map(tuple, accounting_sql(acc, "SELECT model, count() FROM attempts GROUP BY model")))
        for model, streams, per_stream, _ in load:
            assert by_model.get(model, 0) >= streams * per_stream, by_model
        (cost_dir,) = (tmp_path / "results").glob("demo-*-cost")
        assert "meta-llama/Llama-3.1-8B-Instruct" in (cost_dir / "cost_by_model_day.md").read_text()
        # The run's GPU time is attributed before the report, not a period and its lag later.
        gpu = re.search(r"GPU time attributed for the demo's \d+ period\(s\): \$([0-9.]+)", out.stdout)
        assert gpu is not None and float(gpu.group(1)) > 0, out.stdout[-3000:]
        gpu_rows = accounting_sql(acc, "SELECT sum(gpu_cost_usd) FROM gpu_attribution FINAL")[0][0]
        assert gpu_rows > 0
        # It ends pointing at the dashboards (one PNG per row, every one printed) and at the split
        # of its slowest request.
        (dash_dir,) = (tmp_path / "results").glob("demo-*-dashboards")
        pngs = sorted(dash_dir.glob("*.png"))
        assert len(pngs) >= 6 and all(str(p) in out.stdout for p in pngs), out.stdout[-3000:]
        assert "where the slowest request's time went" in out.stdout
        assert re.search(r"request \S+: completed on \S+, attempt 1", out.stdout), out.stdout[-3000:]
        assert "gateway: auth + reserve" in out.stdout and "decode" in out.stdout
        # Its output is for a person: no HTTP client request log lines, no warnings.
        assert "HTTP Request:" not in out.stdout + out.stderr
        assert "Warning" not in out.stdout + out.stderr, (out.stdout + out.stderr)[-3000:]
    finally:
        subprocess.run(["bash", "scripts/stack.sh", "down"], cwd=REPO, env=env, timeout=60)
        asyncio.run(
            delete_namespace(
                ns,
                env.get("LLMLAB_NATS_URL", "nats://127.0.0.1:4222"),
                env.get("LLMLAB_REDIS_URL", "redis://127.0.0.1:6379/0"),
            )
        )
