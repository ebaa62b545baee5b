"""The priority benchmark's arithmetic on hand-made client records (unit)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from llmlab_loadtest.priority_bench import class_summary, verdicts

pytestmark = pytest.mark.unit


def rec(
    ok: bool, ttft_s: float | None = None, status: int = 200, code: str | None = None, headers_s: float = 0.0
) -> Any:
    body = json.dumps({"error": {"code": code, "message": "x"}}) if code else None
    return {
        "ok": ok,
        "status": status,
        "chunk_times": [ttft_s] if ttft_s is not None else [],
        "headers_at": headers_s,
        "error": f"HTTP {status}: {body}" if body else None,
        "error_kind": "http" if body else None,
    }


def test_answered_refused_by_code_ttft_and_admission_latency() -> None:
    records = [rec(True, t) for t in (0.1, 0.2, 0.3, 0.4)]
    records += [rec(False, status=429, code="queue_wait_predicted", headers_s=s) for s in (0.004, 0.006, 0.010)]
    records.append(rec(False, status=429, code="queue_timeout", headers_s=5.0))
    s = class_summary(records)
    assert (s["requests"], s["answered"]) == (8, 4)
    assert s["refused"] == {"429 queue_wait_predicted": 3, "429 queue_timeout": 1}
    # numpy's linear interpolation on [100, 200, 300, 400]: p50 250, p95 385.
    assert s["ttft_ms"] == {"p50": 250.0, "p95": 385.0, "max": 400.0}
    # Only admission's 429s are timed: 4, 6, 10 ms (the queue timeout's 5 s is not one).
    assert s["admission_429_ms"] == {"n": 3, "p50": 6.0, "p95": 9.6, "max": 10.0}


def test_every_shipped_run_must_meet_each_target() -> None:
    def run(variant: str, high_p95: float, fast_p95: float | None, high_refused: int = 0) -> dict[str, Any]:
        high = {"ttft_ms": {"p95": high_p95}, "refused": {"429 queue_timeout": high_refused} if high_refused else {}}
        probe = {"admission_429_ms": {"p95": fast_p95}}
        return {"variant": variant, "classes": {"high": high, "probe": probe}}

    ok = verdicts([run("priority", 400, 8), run("fifo", 4000, None), run("priority", 900, 20)], 1000)
    assert all(t["met"] for t in ok.values())
    assert ok["high_ttft_p95_within_slo"]["values_ms"] == [400, 900]  # the fifo runs are not judged
    bad = verdicts([run("priority", 400, 8), run("priority", 1200, 60, high_refused=2)], 1000)
    assert not any(t["met"] for t in bad.values())
