"""What differs for vLLM: its metric names (``vllm/v1/metrics/loggers.py``)."""

from __future__ import annotations

from typing import ClassVar

from llmlab_worker.engine import MetricNames, OpenAIEngineAdapter


class VllmAdapter(OpenAIEngineAdapter):
    engine: ClassVar[str] = "vllm"
    health_path: ClassVar[str] = "/health"
    metric_names: ClassVar[MetricNames] = MetricNames(
        running="vllm:num_requests_running",
        waiting="vllm:num_requests_waiting",
        kv_cache_usage="vllm:kv_cache_usage_perc",
        queue_time_sum="vllm:request_queue_time_seconds_sum",
        queue_time_count="vllm:request_queue_time_seconds_count",
        prefix_hits="vllm:prefix_cache_hits_total",
        prefix_queries="vllm:prefix_cache_queries_total",
        preemptions="vllm:num_preemptions_total",
        # Tokens scheduled per engine step: the batch size is its windowed mean (tokens, not requests).
        batch_tokens_sum="vllm:iteration_tokens_total_sum",
        batch_tokens_count="vllm:iteration_tokens_total_count",
    )
