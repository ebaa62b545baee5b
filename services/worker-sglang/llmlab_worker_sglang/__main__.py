"""``python -m llmlab_worker_sglang``: a worker in front of an SGLang server (LLMLAB_WORKER_ENGINE_URL)."""

from llmlab_worker.app import http_adapter, run_worker
from llmlab_worker.settings import WorkerSettings

from llmlab_worker_sglang.adapter import SglangAdapter

if __name__ == "__main__":
    run_worker(http_adapter(SglangAdapter), "worker-sglang", WorkerSettings, "SGLang")
