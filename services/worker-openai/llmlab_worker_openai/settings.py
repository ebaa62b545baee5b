"""worker-openai's settings: the shared worker settings plus which kind of server it drives."""

from __future__ import annotations

from typing import Literal

from llmlab_worker.settings import WorkerSettings

Backend = Literal["llamacpp", "ollama", "lmstudio", "openai"]


class OpenAIWorkerSettings(WorkerSettings):
    """Env prefix ``LLMLAB_WORKER_``. ``backend`` picks how health, load and the model's state are read:
    llama.cpp's ``/health`` and ``/metrics``, Ollama's ``/api/ps``, LM Studio's ``/api/v0/models``; ``openai``
    (any other OpenAI-compatible server) knows only ``/v1/models`` and reports no load."""

    backend: Backend = "openai"
