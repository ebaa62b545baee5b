"""What differs for SGLang: metric names (``python/sglang/srt/metrics/collector.py``; /metrics
needs ``--enable-metrics``) and a ready-made cache hit-rate gauge."""

from __future__ import annotations

from typing import Any, ClassVar

from llmlab_worker.engine import MetricNames, OpenAIEngineAdapter


class SglangAdapter(OpenAIEngineAdapter):
    engine: ClassVar[str] = "sglang"
    health_path: ClassVar[str] = "/health"
    metric_names: ClassVar[MetricNames] = MetricNames(
        running="sglang:num_running_reqs",
        waiting="sglang:num_queue_reqs",
        kv_cache_usage="sglang:token_usage",
        queue_time_sum="sglang:queue_time_seconds_sum",
        queue_time_count="sglang:queue_time_seconds_count",
        prefix_hit_rate="sglang:cache_hit_rate",
        # Retractions (SGLang's preemption: a running request sent back to the queue when the KV
        # pool runs out); the counter of recent SGLang releases, absent in older ones.
        preemptions="sglang:num_retracted_requests_total",
        # No tokens-per-step histogram: the batch size is the running requests.
    )
    # SGLang's ChatCompletionRequest has continue_final_message (it then adds no generation
    # prompt) and no add_generation_prompt field.
    continue_fields: ClassVar[dict[str, Any] | None] = {"continue_final_message": True}
