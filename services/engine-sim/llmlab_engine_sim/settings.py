"""Settings of the engine simulator, env prefix ``LLMLAB_SIM_``; the CLI overrides them."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from llmlab_common.settings import ServiceSettings
from pydantic import Field
from pydantic_settings import SettingsConfigDict


class SimSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="LLMLAB_SIM_", extra="ignore")

    # Which engine the simulator presents itself as: metric names/labels and extra endpoints.
    flavor: Literal["vllm", "sglang"] = "vllm"
    # The served model name (what ``/v1/models`` lists and requests must name).
    model: str = "meta-llama/Llama-3.1-8B-Instruct"
    port: int = 8001
    # Time from admission (leaving the engine queue) to the first token.
    ttft_ms: float = Field(default=100.0, gt=0)
    # Time between two tokens of one request (one engine step).
    itl_ms: float = Field(default=50.0, gt=0)
    # Scheduler timer granularity: a request admitted while the engine is busy waits for the next
    # tick, and the loop wakes at most itl/tick times per ITL however many streams run. Set it to
    # itl_ms for a strict step loop (one wake-up per ITL, admissions only at step boundaries).
    tick_ms: float = Field(default=1.0, gt=0)
    # Requests running at once; the rest wait in the engine queue (FIFO, or by ``priority``).
    max_num_seqs: int = Field(default=256, ge=1)
    # Tokens a request generates when its max_tokens allows (finish_reason "stop");
    # a smaller max_tokens cuts it short (finish_reason "length").
    output_len: int = Field(default=256, ge=1)
    # Prompt + max_tokens may not exceed this (400 otherwise), as in vLLM.
    max_model_len: int = Field(default=8192, ge=1)
    # KV-cache capacity in tokens: the denominator of the KV-cache usage gauges.
    kv_cache_tokens: int = Field(default=262144, ge=1)
    # Seed of the generated text (with the prompt and the request's own ``seed``).
    seed: int = 0
    # Tokens per streamed chunk: above 1, each content chunk carries that many tokens (the last
    # one fewer), as vLLM merges output deltas into one chunk when its consumer lags. Tokens wait
    # until a chunk is full, so a count is always exact and a test can rely on it.
    chunk_tokens: int = Field(default=1, ge=1)
    # A Hugging Face tokenizer directory (tokenizer.json and the chat template): prompts are counted,
    # and the twin's prefix blocks keyed, by its ids as the real engine would; None: the simulator's
    # own counting rule (textgen). Needs no model weights.
    tokenizer: Path | None = None

    # -- timing model -----------------------------------------------------------------------------
    # "fixed": the constant TTFT/ITL model above (the default). "twin": the engine twin's step
    # scheduler (chunked prefill, paged KV, preemption, prefix caching) with step times from the
    # roofline cost model of ``twin_model`` on ``twin_device``; ttft_ms/itl_ms/tick_ms are unused.
    mode: Literal["fixed", "twin"] = "fixed"
    twin_model: str = "Llama-3.1-8B"
    twin_device: str = "H100-SXM"
    twin_dtype: str = "bf16"
    # Twin: every step lasts this long instead of the cost model's time (pins decode ITL).
    fixed_step_ms: float | None = Field(default=None, gt=0)
    max_num_batched_tokens: int = Field(default=8192, ge=1)
    # vLLM's --long-prefill-token-threshold: one request's prefill chunk per step at most (0: none).
    long_prefill_token_threshold: int = Field(default=0, ge=0)
    block_size: int = Field(default=16, ge=1)
    # Twin KV blocks; None: kv_cache_tokens // block_size; 0: from the KV calculator
    # (GPU memory x gpu_memory_utilization - weights, llmlab_twin.kvcalc).
    num_gpu_blocks: int | None = Field(default=None, ge=0)
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    prefix_caching: bool = True
    # "vllm" (hash chain of blocks) or "sglang" (radix tree); None: the flavour's own.
    prefix_style: Literal["vllm", "sglang"] | None = None
    eviction_policy: str = "lru"
    # Board power for the simulated GPU gauges (W); None: gpu.DEFAULT_POWER_W.
    tdp_w: float | None = Field(default=None, gt=0)
    idle_w: float | None = Field(default=None, ge=0)
