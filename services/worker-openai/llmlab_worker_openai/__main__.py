"""``python -m llmlab_worker_openai``: a worker in front of an OpenAI-compatible local server
(LLMLAB_WORKER_ENGINE_URL; LLMLAB_WORKER_BACKEND=llamacpp|ollama|lmstudio|openai)."""

from llmlab_worker.app import run_worker
from llmlab_worker.engine import EngineAdapter

from llmlab_worker_openai.adapter import ADAPTERS
from llmlab_worker_openai.settings import OpenAIWorkerSettings


def make_adapter(s: OpenAIWorkerSettings) -> EngineAdapter:
    return ADAPTERS[s.backend](s.engine_url, s.max_concurrency, s.engine_connect_timeout_s)


if __name__ == "__main__":
    run_worker(make_adapter, "worker-openai", OpenAIWorkerSettings, "local OpenAI-compatible")
