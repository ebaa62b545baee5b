"""``python -m llmlab_worker_vllm``: a worker in front of a vLLM server (LLMLAB_WORKER_ENGINE_URL),
or with vLLM's engine in its own process (LLMLAB_WORKER_ENGINE_MODE=inproc)."""

from llmlab_worker.app import run_worker
from llmlab_worker.engine import EngineAdapter

from llmlab_worker_vllm.adapter import VllmAdapter
from llmlab_worker_vllm.settings import VllmWorkerSettings


def make_adapter(s: VllmWorkerSettings) -> EngineAdapter:
    if s.engine_mode == "inproc":
        from llmlab_worker_vllm.inproc import InProcessVllmAdapter  # needs vLLM's environment

        return InProcessVllmAdapter(s.engine_model, s.served_name, s.engine_args, s.max_concurrency)
    return VllmAdapter(s.engine_url, s.max_concurrency, s.engine_connect_timeout_s)


if __name__ == "__main__":
    run_worker(make_adapter, "worker-vllm", VllmWorkerSettings, "vLLM")
