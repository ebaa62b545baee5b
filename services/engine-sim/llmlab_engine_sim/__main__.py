"""``python -m llmlab_engine_sim --flavor sglang --port 8002 --ttft-ms 100 --itl-ms 50 ...``

Flags override ``LLMLAB_SIM_*`` environment settings; unset flags leave them alone.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from llmlab_common.runtime import serve

from llmlab_engine_sim.api import create_app
from llmlab_engine_sim.settings import SimSettings


def parse_args(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="llmlab_engine_sim", description="OpenAI-compatible vLLM/SGLang simulator")
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
    args = p.parse_args(argv)
    return {k: v for k, v in vars(args).items() if v is not None}


def main(argv: Sequence[str] | None = None) -> None:
    settings = SimSettings(**parse_args(argv))
    serve(create_app(settings), settings, "engine-sim")


if __name__ == "__main__":
    main()
