"""KV-cache calculator (MISSION §3): bytes per token, per request, and how many tokens/requests fit.

    python -m llmlab_twin.kvcalc --model Llama-3.1-8B --device H100-SXM --dtype bf16 \
        --kv-dtype fp8 --gpu-mem-util 0.9 --tp 1 --context 4096 [--json]

KV bytes/token = 2 (K and V) x layers x kv_heads x head_dim x bytes(kv_dtype).
Budget per GPU, vLLM rule (default): memory x gpu_mem_util - weights/tp - reserve, where the reserve stands
for vLLM's profiled activation peak plus non-torch memory (CUDA graphs, NCCL buffers); 1.5 GiB by default,
a typical figure for 8B-70B models at the default max_num_batched_tokens, not a measurement here.
TensorRT-LLM rule (--rule trtllm): (memory - weights/tp - reserve) x fraction (kv_cache_free_gpu_mem_fraction).
Tensor parallel shards KV heads; with fewer KV heads than GPUs each GPU keeps one (replicated) head.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from dataclasses import asdict, dataclass
from typing import Literal

from llmlab_twin.hwcatalog import CatalogError, DeviceSpec, ModelSpec, dtype_bytes, get_device, get_model

log = logging.getLogger(__name__)

GiB = 1024**3
DEFAULT_RESERVE_BYTES = int(1.5 * GiB)
DEFAULT_BLOCK_SIZE = 16  # vLLM's default KV block (tokens); capacity is counted in whole blocks

Rule = Literal["vllm", "trtllm"]


class WeightsDoNotFitError(CatalogError):
    """The weights (plus the reserve) exceed the memory budget of a GPU."""


@dataclass(frozen=True)
class KvPlan:
    model: str
    device: str
    dtype: str
    kv_dtype: str
    tp: int
    gpu_mem_util: float
    rule: str
    context: int
    kv_bytes_per_token: float  # whole model, all GPUs together
    kv_bytes_per_token_per_gpu: float
    kv_bytes_per_request: float  # at `context`, all GPUs together
    weight_bytes: float  # whole model
    weight_bytes_per_gpu: float
    device_memory_bytes: int
    reserve_bytes_per_gpu: int
    kv_budget_bytes_per_gpu: float
    block_size: int
    max_tokens: int  # KV tokens that fit (whole blocks)
    max_concurrent_requests: int  # requests of `context` tokens that fit at once
    context_exceeds_model_limit: bool


def kv_heads_per_gpu(model: ModelSpec, tp: int) -> int:
    return max(1, math.ceil(model.num_key_value_heads / tp))


def kv_bytes_per_token_per_gpu(model: ModelSpec, kv_dtype: str, tp: int) -> float:
    return 2 * model.num_layers * kv_heads_per_gpu(model, tp) * model.head_dim * dtype_bytes(kv_dtype)


def plan(
    model: ModelSpec,
    device: DeviceSpec,
    *,
    dtype: str = "bf16",
    kv_dtype: str | None = None,
    gpu_mem_util: float = 0.9,
    tp: int = 1,
    context: int = 4096,
    reserve_bytes: int = DEFAULT_RESERVE_BYTES,
    rule: Rule = "vllm",
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> KvPlan:
    kv_dtype = kv_dtype or dtype
    if not 0 < gpu_mem_util <= 1:
        raise ValueError(f"gpu_mem_util must be in (0, 1], got {gpu_mem_util}")
    if tp < 1 or context < 1 or block_size < 1:
        raise ValueError("tp, context and block_size must be >= 1")
    weights = model.weight_bytes(dtype)
    weights_gpu = weights / tp  # vLLM shards the vocab too, so everything divides by tp
    mem = device.memory_bytes
    if rule == "vllm":
        budget = mem * gpu_mem_util - weights_gpu - reserve_bytes
    else:
        budget = (mem - weights_gpu - reserve_bytes) * gpu_mem_util
    if budget <= 0:
        raise WeightsDoNotFitError(
            f"{model.name} {dtype} weights ({weights_gpu / GiB:.1f} GiB per GPU at tp={tp}) plus the "
            f"{reserve_bytes / GiB:.1f} GiB reserve do not fit in {device.name} "
            f"({mem / GiB:.1f} GiB x {gpu_mem_util}): raise --tp, quantise, or raise --gpu-mem-util"
        )
    per_tok_gpu = kv_bytes_per_token_per_gpu(model, kv_dtype, tp)
    blocks = int(budget // (per_tok_gpu * block_size))
    max_tokens = blocks * block_size
    # A request holds whole blocks, so its footprint is its context rounded up to a block.
    req_blocks = math.ceil(context / block_size)
    return KvPlan(
        model=model.name,
        device=device.name,
        dtype=dtype,
        kv_dtype=kv_dtype,
        tp=tp,
        gpu_mem_util=gpu_mem_util,
        rule=rule,
        context=context,
        kv_bytes_per_token=model.kv_bytes_per_token(kv_dtype),
        kv_bytes_per_token_per_gpu=per_tok_gpu,
        kv_bytes_per_request=model.kv_bytes_per_token(kv_dtype) * context,
        weight_bytes=weights,
        weight_bytes_per_gpu=weights_gpu,
        device_memory_bytes=mem,
        reserve_bytes_per_gpu=reserve_bytes,
        kv_budget_bytes_per_gpu=budget,
        block_size=block_size,
        max_tokens=max_tokens,
        max_concurrent_requests=blocks // req_blocks,
        context_exceeds_model_limit=context > model.max_position_embeddings,
    )


def plan_by_name(model: str, device: str, **kw: object) -> KvPlan:
    return plan(get_model(model), get_device(device), **kw)  # type: ignore[arg-type]


def format_plan(p: KvPlan) -> str:
    def gib(x: float) -> str:
        return f"{x / GiB:,.2f} GiB"

    lines = [
        f"model {p.model}  device {p.device} x{p.tp} (tp={p.tp})  weights {p.dtype}  KV {p.kv_dtype}  rule {p.rule}",
        f"KV bytes/token            {p.kv_bytes_per_token:,.0f} B  ({p.kv_bytes_per_token_per_gpu:,.0f} B per GPU)",
        f"KV per request @ {p.context:>6}   {gib(p.kv_bytes_per_request)}",
        f"weights                   {gib(p.weight_bytes)}  ({gib(p.weight_bytes_per_gpu)} per GPU)",
        f"GPU memory                {gib(p.device_memory_bytes)} x util {p.gpu_mem_util}",
        f"reserve (activations etc) {gib(p.reserve_bytes_per_gpu)} per GPU (stated, not measured)",
        f"KV budget                 {gib(p.kv_budget_bytes_per_gpu)} per GPU",
        f"max KV tokens             {p.max_tokens:,}  (blocks of {p.block_size})",
        f"max concurrent requests   {p.max_concurrent_requests:,} at context {p.context}",
    ]
    if p.context_exceeds_model_limit:
        lines.append(f"warning: context {p.context} exceeds the model's max_position_embeddings")
    lines.append("(computed from the model config and the device datasheet: an estimate, not a measurement)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m llmlab_twin.kvcalc", description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="name, alias or HF id from configs/models.yaml")
    ap.add_argument("--device", required=True, help="name from configs/hardware.yaml")
    ap.add_argument("--dtype", default="bf16", help="weight dtype: bf16, fp16, fp8, int8, int4, fp32")
    ap.add_argument("--kv-dtype", default=None, help="KV cache dtype (default: --dtype)")
    ap.add_argument("--gpu-mem-util", type=float, default=0.9)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--context", type=int, default=4096, help="tokens per request (prompt + output)")
    ap.add_argument("--reserve-gib", type=float, default=DEFAULT_RESERVE_BYTES / GiB)
    ap.add_argument("--rule", choices=["vllm", "trtllm"], default="vllm")
    ap.add_argument("--block-size", type=int, default=DEFAULT_BLOCK_SIZE)
    ap.add_argument("--json", action="store_true", help="machine-readable output")
    args = ap.parse_args(argv)
    try:
        p = plan_by_name(
            args.model,
            args.device,
            dtype=args.dtype,
            kv_dtype=args.kv_dtype,
            gpu_mem_util=args.gpu_mem_util,
            tp=args.tp,
            context=args.context,
            reserve_bytes=int(args.reserve_gib * GiB),
            rule=args.rule,
            block_size=args.block_size,
        )
    except (CatalogError, ValueError) as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    sys.stdout.write((json.dumps(asdict(p), indent=2) if args.json else format_plan(p)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
