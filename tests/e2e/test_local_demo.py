"""`make local-demo` at CI size: two real llama.cpp servers (xllamacpp) behind the stack through worker-openai,
server A killed mid-run and restarted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.vllm_cpu]  # the GGUF comes with the vLLM-on-CPU setup
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(600)
def test_a_backend_killed_mid_run_loses_no_request_and_its_load_is_timed_apart(tmp_path: Path) -> None:
    """Catches: a request lost when its backend dies (not started, or mid-stream), a worker that keeps its dead
    backend's pool ready, a model load not timed (or timed with generation), a report that does not show it."""
    out = subprocess.run(
        [sys.executable, "scripts/local_demo.py", "--requests", "12", "--concurrency", "3", "--max-tokens", "48",
         "--out", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=540,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-6000:]
    (run,) = [p for p in tmp_path.iterdir() if not p.is_symlink()]
    assert (tmp_path / "latest").resolve() == run.resolve()  # as the benchmarks' runs
    doc = json.loads((run / "report.json").read_text())
    s = doc["summary"]
    assert [p["requests"] for p in s["phases"].values()] and sum(p["requests"] for p in s["phases"].values()) == 12
    assert all(p["ok"] == p["requests"] and not p["failed"] for p in s["phases"].values()), s["phases"]
    assert all(r["status"] == 200 and r["done"] for r in doc["requests"])
    snaps = s["snapshots"]
    kill, restart, end = snaps["A down"], snaps["before the restart"], snaps["end"]
    # While A was down nothing completed on it, and B served what was sent meanwhile.
    assert restart["worker A"]["attempts"]["completed"] == kill["worker A"]["attempts"]["completed"]
    served_by_b = restart["worker B"]["attempts"]["completed"] - kill["worker B"]["attempts"]["completed"]
    assert served_by_b > 0 and s["phases"]["A down"]["requests"] > 0  # (some may end after the restart)
    # Worker A timed both of its server's loads (first start, restart) from the health answers, apart from
    # generation; B its one.
    assert end["worker A"]["model_loads"] == 2 and end["worker B"]["model_loads"] == 1
    assert 0 < end["worker A"]["model_load_s_total"] < 2 * 120
    assert "A killed" in s["events_s"] and "worker A ready again" in s["events_s"]
    md = (run / "README.md").read_text()
    for heading in ("## Requests by phase", "## Model load, apart from generation", "## Failover", "## Metadata"):
        assert heading in md
    assert (run / "timeline.png").stat().st_size > 5000
