"""``python -m llmlab_engine_sim --flavor sglang --port 8002 --ttft-ms 100 --itl-ms 50 ...``

Flags override ``LLMLAB_SIM_*`` environment settings; unset flags leave them alone.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from llmlab_common.runtime import serve, settings_help

from llmlab_engine_sim.api import create_app
from llmlab_engine_sim.settings import SimSettings


def parse_args(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(
        prog="python -m llmlab_engine_sim",
        description="OpenAI-compatible vLLM/SGLang simulator",
        epilog=settings_help(SimSettings),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--flavor", choices=["vllm", "sglang"], help="which engine to present as")
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument("--model", "--served-model-name", dest="model", help="served model name")
    p.add_argument("--ttft-ms", type=float, help="admission -> first token")
    p.add_argument("--itl-ms", type=float, help="time between tokens (one engine step)")
    p.add_argument("--tick-ms", type=float, help="scheduler tick: admission granularity (<= itl)")
    p.add_argument("--max-num-seqs", type=int, help="requests running at once; the rest queue")
    p.add_argument("--output-len", type=int, help="tokens generated when max_tokens allows")
    p.add_argument("--max-model-len", type=int, help="context length (prompt + max_tokens)")
    p.add_argument("--kv-cache-tokens", type=int, help="KV-cache capacity for the usage gauges")
    p.add_argument("--seed", type=int, help="seed of the generated text")
    p.add_argument("--chunk-tokens", type=int, help="tokens per streamed chunk (vLLM merges deltas under load)")
    p.add_argument(
        "--tokenizer", type=Path, help="a Hugging Face tokenizer directory: count prompts (and key prefix blocks) by it"
    )
    twin = p.add_argument_group("twin mode (--mode twin: the engine twin's step scheduler, simulated GPU)")
    twin.add_argument("--mode", choices=["fixed", "twin"], help="timing model (default fixed)")
    twin.add_argument("--twin-model", help="model of the roofline cost model (configs/models.yaml)")
    twin.add_argument("--twin-device", help="device of the roofline cost model (configs/hardware.yaml)")
    twin.add_argument("--twin-dtype", help="weights dtype (bf16, fp8, ...)")
    twin.add_argument("--fixed-step-ms", type=float, help="every step lasts this long (pins decode ITL)")
    twin.add_argument("--max-num-batched-tokens", type=int, help="token budget of one step (chunked prefill)")
    twin.add_argument("--long-prefill-token-threshold", type=int, help="one request's prefill chunk per step (0: none)")
    twin.add_argument("--block-size", type=int, help="KV block size in tokens")
    twin.add_argument("--num-gpu-blocks", type=int, help="KV blocks (0: from the KV calculator)")
    twin.add_argument("--gpu-memory-utilization", type=float, help="for --num-gpu-blocks 0")
    twin.add_argument("--prefix-caching", action=argparse.BooleanOptionalAction, default=None)
    twin.add_argument("--prefix-style", choices=["vllm", "sglang"], help="default: the flavour's")
    twin.add_argument("--eviction-policy", help="prefix cache eviction policy (lru, lfu, fifo, ...)")
    twin.add_argument("--tdp-w", type=float, help="board power at full load for the simulated power gauge")
    twin.add_argument("--idle-w", type=float, help="idle board power for the simulated power gauge")
    args = p.parse_args(argv)
    return {k: v for k, v in vars(args).items() if v is not None}


def main(argv: Sequence[str] | None = None) -> None:
    settings = SimSettings(**parse_args(argv))
    serve(create_app(settings), settings, "engine-sim")


if __name__ == "__main__":
    main()
