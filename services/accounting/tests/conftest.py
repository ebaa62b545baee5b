"""Fixtures of the accounting tests: the catalog and event factories."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from llmlab_common.catalog import Catalog, load_catalog
from llmlab_common.messages import AttemptEvent, ErrorInfo, Principal, RequestEvent, Timings, Usage
from llmlab_common.settings import DEFAULT_CATALOG

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"


@pytest.fixture(scope="session")
def catalog() -> Catalog:
    return load_catalog(DEFAULT_CATALOG)


def make_attempt(
    rid: str = "r1",
    attempt: int = 1,
    outcome: str = "completed",
    source: str = "worker",
    *,
    prompt: int = 10,
    completion: int = 20,
    error_code: str | None = None,
    timings: Timings | None = None,
    ended_at: float | None = None,
    **kw: Any,
) -> AttemptEvent:
    end = time.time() if ended_at is None else ended_at
    usage: Usage | None = Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)
    if source == "gateway" and outcome != "cancelled":
        usage = None  # the gateway knows no engine counts for an attempt it gave up on
    if timings is None and source == "worker":
        timings = Timings(nats_queue_s=0.01, ttft_s=0.1, decode_s=0.38, e2e_s=0.5, tpot_s=0.02)
    fields: dict[str, Any] = {
        "request_id": rid,
        "attempt": attempt,
        "outcome": outcome,
        "source": source,
        "worker_id": "w1" if source == "worker" else None,
        "pool": "gpu-vllm",
        "deployment": "llama-8b-vllm",
        "model": LLAMA,
        "engine": "vllm" if source == "worker" else None,
        "endpoint": "chat",
        "principal": Principal(tenant_id="acme", team_id="t", user_id="u", key_id="k", plan="pro"),
        "usage": usage,
        "timings": timings,
        "finish_reason": "stop" if outcome == "completed" else None,
        "error": None
        if outcome == "completed"
        else ErrorInfo(
            status=499 if error_code == "client_disconnected" else 0,
            type="attempt",
            code=error_code or outcome,
            message="x",
        ),
        "created_at": end - 1.0,
        "ended_at": end,
    }
    fields.update(kw)
    return AttemptEvent.model_validate(fields)


def make_refusal(rid: str = "r9", status: int = 429, type_: str = "insufficient_quota") -> RequestEvent:
    now = time.time()
    return RequestEvent(
        request_id=rid,
        status=status,
        error=ErrorInfo(status=status, type=type_, code=type_, message="refused"),
        model=LLAMA,
        principal=Principal(tenant_id="acme", plan="pro"),
        created_at=now,
        ended_at=now,
    )


@pytest.fixture
def attempt_factory() -> Callable[..., AttemptEvent]:
    return make_attempt


@pytest.fixture
def refusal_factory() -> Callable[..., RequestEvent]:
    return make_refusal


def _stop_merges(store: Any) -> None:
    """No background merge on the raw tables of ``store`` (a ``ClickHouseStore``), so that their
    ``count()`` without FINAL is the number of rows inserted: chdb merges small parts within a
    second or so, collapsing duplicates at a time of its choosing. A table setting, so it lasts
    across a reopen of the directory."""
    for table in ("attempts_raw", "requests_raw"):
        store.client.command(f"ALTER TABLE {table} MODIFY SETTING max_bytes_to_merge_at_max_space_in_pool = 1")


@pytest.fixture
def stop_merges() -> Callable[[Any], None]:
    return _stop_merges
