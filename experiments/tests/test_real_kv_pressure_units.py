"""The pure parts of the KV-pressure experiment: the two launches, sizes that must make vLLM preempt, the
engine's own report of its cache, and the summary. (The run itself, on real vLLM: ``make
pipelines-kv-pressure``; the quick run in test_real.py.)"""

from __future__ import annotations

import math
from typing import Any

import pytest
from llmlab_experiments import real_kv_pressure as m
from llmlab_experiments import real_pipelines as rp


@pytest.mark.parametrize("s", [m.FULL, m.QUICK], ids=["full", "quick"])
def test_the_launches_are_cs_flags_with_only_the_cache_and_model_length_changed(s: m.KvSizes) -> None:
    ls = m.launches(s)
    c = rp.launches_of_pipelines()["C"].flags
    for key, launch in ls.items():
        # C's 2,048-token long-prefill threshold capped at the model length (vLLM refuses it above)
        extra = {"--max-model-len": 768, "--block-size": 128, "--long-prefill-token-threshold": 768}
        if key == m.TIGHT:
            extra["--num-gpu-blocks-override"] = s.tight_blocks
        assert launch.flags == {**c, **extra}, key
        assert launch.flags["--enable-prefix-caching"] is True  # C's own setting kept
        cmd = rp.engine_command(8000, launch)
        assert cmd[cmd.index("--max-model-len") + 1] == "768"
    assert "--num-gpu-blocks-override" not in ls[m.ROOMY].flags


@pytest.mark.parametrize("s", [m.FULL, m.QUICK], ids=["full", "quick"])
def test_the_sizes_start_on_vllm_and_must_preempt(s: m.KvSizes) -> None:
    """Derived from vLLM's rules, not from the module: the cache keeps one block back (the null block), a
    request of the model length must fit what is left, a waiting request is admitted only when its prompt's
    blocks are free, and a running one takes a block more at each block boundary."""
    block = 128
    usable = s.tight_blocks - 1
    assert usable * block >= m.MAX_MODEL_LEN  # vLLM starts
    prompt = 29 * s.doc_sentences + 40  # the clauses, the title and question, the chat template (generous)
    assert prompt <= block and prompt + s.max_tokens <= m.MAX_MODEL_LEN  # a block each; no request refused
    admitted = min(s.streams, usable)  # a block each
    final = math.ceil((prompt + s.max_tokens) / block)
    assert admitted * final > usable  # those admitted together outgrow the cache: preemption
    assert s.streams * (prompt + s.max_tokens) < 23_000  # the roomy cache (1 GiB) never runs out


def test_the_cache_as_the_engine_reports_it() -> None:
    text = (
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
        'vllm:cache_config_info{block_size="128",cache_dtype="auto",enable_prefix_caching="True",'
        'num_cpu_blocks="None",num_gpu_blocks="8"} 1.0\n'
        "vllm:num_preemptions_total 3.0\n"
    )
    assert m.parse_cache_config(text) == {"num_gpu_blocks": 8, "block_size": 128, "tokens": 1024}
    assert m.parse_cache_config("vllm:num_preemptions_total 0\n")["tokens"] is None


def _row(engine: str, rnd: int, cpu: float, tok_s: float, preempt: float) -> dict[str, Any]:
    return {"engine": engine, "round": rnd, "engine_cpu_s": cpu, "output_tok_s": tok_s, "preemptions": preempt}


def test_the_summary_pairs_each_round_of_the_tight_engine_with_the_roomy_one() -> None:
    rows = [_row(m.ROOMY, 1, 10.0, 50.0, 0), _row(m.TIGHT, 1, 15.0, 40.0, 6), _row(m.TIGHT, 2, 12.0, 45.0, 4),
            _row(m.ROOMY, 2, 8.0, 60.0, 0)]  # fmt: skip
    s = m.summarize(rows)
    assert s["tight_over_roomy"] == {"engine_cpu_s": [1.5, 1.5], "output_tok_s": [0.8, 0.75]}
    assert s[m.TIGHT]["preemptions"]["runs"] == [6, 4] and s[m.ROOMY]["preemptions"]["mean"] == 0
