"""Paged KV cache of the twin: ``num_gpu_blocks`` blocks of ``block_size`` tokens.

Blocks are counted, not named: a request holds ``blocks`` blocks, some of them cached prefix
entries (:mod:`llmlab_twin.prefix`), the rest anonymous. Free capacity is the blocks
never used (or returned) plus the cached blocks no request holds (reclaimable, evicted on demand
in the eviction policy's order), as in vLLM's free block queue and SGLang's evictable size.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, Protocol

from llmlab_twin import kvcalc
from llmlab_twin.prefix import PrefixCache, make_prefix_cache

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class KVConfig:
    num_gpu_blocks: int = 16384
    block_size: int = 16
    prefix_caching: bool = True
    prefix_style: str = "vllm"  # "vllm" (hash chain) | "sglang" (radix tree)
    eviction_policy: str = "lru"

    def __post_init__(self) -> None:
        if self.num_gpu_blocks < 1 or self.block_size < 1:
            raise ValueError("num_gpu_blocks and block_size must be >= 1")


class HoldsBlocks(Protocol):
    """What the cache needs of a sequence (the scheduler's ``TwinSeq``) to free its blocks."""

    blocks: int
    held: list[Any]
    own: Any
    own_key: Hashable | None
    priority: int


class KVCacheManager:
    def __init__(self, config: KVConfig) -> None:
        self.config = config
        self.total = config.num_gpu_blocks
        self.block_size = config.block_size
        self.unused = config.num_gpu_blocks  # free and not cached
        self.cache: PrefixCache | None = (
            make_prefix_cache(config.prefix_style, self, config.eviction_policy) if config.prefix_caching else None
        )

    @property
    def free_blocks(self) -> int:
        cache = self.cache
        return self.unused + (cache.reclaimable if cache is not None else 0)

    @property
    def used_blocks(self) -> int:
        return self.total - self.free_blocks

    @property
    def usage(self) -> float:
        return self.used_blocks / self.total

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def allocate(self, n: int) -> bool:
        """Take ``n`` free blocks (evicting cached ones if needed); False (nothing taken) if fewer
        than ``n`` are free."""
        if n <= 0:
            return True
        unused = self.unused
        if n <= unused:
            self.unused = unused - n
            return True
        cache = self.cache
        if cache is None or n > unused + cache.reclaimable:
            return False
        cache.evict(n - unused)  # credits self.unused
        self.unused -= n
        return True

    def release(self, seq: HoldsBlocks, now: float) -> None:
        """Free every block the request holds (its cached entries stay cached, reclaimable)."""
        cache = self.cache
        if cache is None:
            self.unused += seq.blocks
        else:
            own = seq.own
            own_blocks = seq.blocks - len(seq.held) - (own.blocks if own is not None else 0)
            cache.release(seq.held, own, seq.own_key, own_blocks, now, seq.priority)
        seq.blocks = 0
        seq.held = []
        seq.own = None


def num_gpu_blocks_from_kvcalc(
    model: str,
    device: str,
    *,
    block_size: int = 16,
    gpu_memory_utilization: float = 0.9,
    dtype: str = "bf16",
    kv_dtype: str | None = None,
    tp: int = 1,
) -> int:
    """KV capacity in blocks from the twin's KV calculator (:func:`llmlab_twin.kvcalc.plan_by_name`):
    GPU memory x utilisation - weights - reserve, in whole blocks."""
    p = kvcalc.plan_by_name(
        model, device, block_size=block_size, gpu_mem_util=gpu_memory_utilization, dtype=dtype, kv_dtype=kv_dtype, tp=tp
    )
    return max(1, int(p.max_tokens) // block_size)
