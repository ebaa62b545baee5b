"""``python -m llmlab_worker_sglang``: a worker in front of an SGLang server (LLMLAB_WORKER_ENGINE_URL)."""

from llmlab_worker.app import run_worker

from llmlab_worker_sglang.adapter import SglangAdapter

if __name__ == "__main__":
    run_worker(SglangAdapter, "worker-sglang")
