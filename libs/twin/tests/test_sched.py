"""The twin's step scheduler on hand-computable cases (fixed step times, tiny KV caches)."""

from __future__ import annotations

import pytest
from llmlab_twin.kvcache import KVConfig
from llmlab_twin.sched import (
    FixedStepCost,
    SeqState,
    StepBatch,
    StepScheduler,
    TwinConfig,
    TwinSeq,
)

pytestmark = pytest.mark.unit


class Recorder:
    """A fixed-step cost model that keeps every batch it was asked about."""

    def __init__(self, seconds: float = 0.01) -> None:
        self.seconds = seconds
        self.batches: list[StepBatch] = []

    def step_seconds(self, batch: StepBatch) -> float:
        self.batches.append(batch)
        return self.seconds


def make(
    *, seqs: int = 8, budget: int = 64, blocks: int = 1000, bs: int = 16, prefix: bool = False, cost: object = None
) -> StepScheduler:
    cfg = TwinConfig(
        max_num_seqs=seqs,
        max_num_batched_tokens=budget,
        kv=KVConfig(num_gpu_blocks=blocks, block_size=bs, prefix_caching=prefix),
    )
    return StepScheduler(cfg, cost if cost is not None else FixedStepCost(0.01))  # type: ignore[arg-type]


def test_chunked_prefill_then_one_token_per_step() -> None:
    s = make()
    a = TwinSeq("a", 100, 5)
    s.add(a, 0.0)
    end = s.run_until_idle(0.0)
    # 100 prompt tokens at 64 per step: 2 prefill steps (first token at the end of the 2nd),
    # then 4 decode steps for tokens 2..5.
    assert s.stats.steps == 6
    assert a.first_token_at == pytest.approx(0.02)
    assert a.finished_at == pytest.approx(0.06) == pytest.approx(end)
    assert a.generated == 5 and a.state is SeqState.DONE
    assert a.ttft == pytest.approx(0.02) and a.tpot == pytest.approx(0.01)
    assert s.stats.generation_tokens == 5 and s.stats.prefill_tokens == 100
    assert s.kv.used_blocks == 0


def test_batches_seen_by_the_cost_model() -> None:
    rec = Recorder()
    s = make(cost=rec, budget=64)
    s.add(TwinSeq("a", 40, 3), 0.0)
    s.add(TwinSeq("b", 40, 3), 0.0)
    s.run_until_idle(0.0)
    b = rec.batches
    # step 0: a's 40 tokens + b's first 24; step 1: a decodes, b's last 16 (context 24).
    # Attention work of a chunk: against the KV before it, plus its own causal half (n*n//2).
    assert (b[0].prefill_tokens, b[0].prefill_context_tokens, b[0].decode_seqs) == (64, 40 * 40 // 2 + 24 * 24 // 2, 0)
    assert (b[1].prefill_tokens, b[1].prefill_context_tokens, b[1].decode_seqs) == (16, 24 * 16 + 16 * 16 // 2, 1)
    # a decodes with 40 tokens in KV + its new one: context 41
    assert b[1].decode_context_tokens == 41
    # step 2: both decode: a at 42, b at 41
    assert (b[2].decode_seqs, b[2].decode_context_tokens, b[2].prefill_tokens) == (2, 42 + 41, 0)
    # step 3: only b (a emitted its 3rd token at the end of step 2)
    assert (b[3].decode_seqs, b[3].decode_context_tokens) == (1, 42)
    assert len(b) == 4


def test_max_num_seqs_and_priority_order() -> None:
    s = make(seqs=1)
    late_urgent = TwinSeq("urgent", 10, 2, priority=0)
    first = TwinSeq("first", 10, 2, priority=1)
    second = TwinSeq("second", 10, 2, priority=1)
    s.add(first, 0.0)
    s.step(0.0)  # "first" is running alone
    s.add(second, 0.001)
    s.add(late_urgent, 0.002)
    s.run_until_idle(0.0)
    # one at a time; the urgent one overtakes the earlier "second" (lower priority value first)
    assert first.finished_at is not None and late_urgent.admitted_at is not None
    assert late_urgent.admitted_at == pytest.approx(first.finished_at)
    assert second.admitted_at == pytest.approx(late_urgent.finished_at)
    assert s.stats.steps == 6


def test_preemption_when_blocks_run_out() -> None:
    # 4 blocks of 4 tokens; two requests of 4 prompt tokens each generating 8: each ends with
    # 4 + 8 = 12 tokens = 3 blocks, so both cannot hold their KV at once.
    s = make(blocks=4, bs=4, budget=64)
    a = TwinSeq("a", 4, 8)
    b = TwinSeq("b", 4, 8)
    s.add(a, 0.0)
    s.add(b, 0.0)
    s.run_until_idle(0.0)
    assert s.stats.preemptions >= 1
    assert b.preemptions >= 1 and a.preemptions == 0  # the later arrival is the victim
    assert a.state is SeqState.DONE and b.state is SeqState.DONE
    assert a.generated == 8 and b.generated == 8
    assert s.kv.used_blocks == 0 and s.num_running == 0
    # b's recompute re-prefills prompt + generated tokens, so more prefill than the two prompts
    assert s.stats.prefill_tokens > 8
    assert s.gap_itls and max(s.gap_itls) > 0.01  # the preempted one waited longer than a step


def test_preemption_victim_is_lowest_priority() -> None:
    s = make(blocks=4, bs=4, budget=64)
    low = TwinSeq("low", 4, 8, priority=5)
    high = TwinSeq("high", 4, 8, priority=0)
    s.add(low, 0.0)
    s.add(high, 0.0)
    s.run_until_idle(0.0)
    assert low.preemptions >= 1 and high.preemptions == 0


def test_too_big_for_the_cache_is_rejected() -> None:
    s = make(blocks=2, bs=4)
    big = TwinSeq("big", 8, 4)
    s.add(big, 0.0)
    assert big.state is SeqState.REJECTED and s.stats.rejected == 1
    assert s.step(0.0) is None


def test_abort_frees_blocks() -> None:
    s = make(blocks=100, bs=4)
    a = TwinSeq("a", 20, 50)
    s.add(a, 0.0)
    s.step(0.0)
    s.step(0.01)
    assert a.state is SeqState.DECODE and s.kv.used_blocks > 0
    assert s.abort(a, 0.015)
    assert s.kv.used_blocks == 0 and s.num_running == 0 and not s.decoding
    assert s.step(0.02) is None  # the in-flight step ends, nothing left
    assert s.step(0.03) is None
    assert a.finish_reason == "abort"


def test_late_caller_steps_stay_anchored() -> None:
    s = make()
    s.add(TwinSeq("a", 10, 4), 0.0)
    end = s.step(0.0)
    assert end == pytest.approx(0.01)
    # the caller wakes 3 ms late: the next step still starts at 0.01
    assert s.step(0.013) == pytest.approx(0.02)
