"""``python -m llmlab_worker_vllm``: a worker in front of a vLLM server (LLMLAB_WORKER_ENGINE_URL)."""

from llmlab_worker.app import run_worker

from llmlab_worker_vllm.adapter import VllmAdapter

if __name__ == "__main__":
    run_worker(VllmAdapter, "worker-vllm")
