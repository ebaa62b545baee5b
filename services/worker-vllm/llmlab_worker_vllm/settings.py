"""worker-vllm's settings: the shared worker settings plus how vLLM is reached."""

from __future__ import annotations

from typing import Any, Literal

from llmlab_worker.settings import WorkerSettings
from pydantic import Field, model_validator


class VllmWorkerSettings(WorkerSettings):
    """Env prefix ``LLMLAB_WORKER_``. ``engine_mode`` http (default): a vLLM OpenAI server at
    ``engine_url``. inproc: vLLM's engine inside this process (``engine_model``, ``engine_args``);
    the worker must then run in vLLM's Python environment."""

    engine_mode: Literal["http", "inproc"] = "http"
    # inproc: the model path or name vLLM loads, and the name requests use (default: engine_model).
    engine_model: str = ""
    engine_served_name: str = ""
    # inproc: more vLLM engine arguments, as JSON (e.g. {"dtype": "bfloat16", "max_model_len": 2048}).
    engine_args: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _inproc_needs(self) -> VllmWorkerSettings:
        if self.engine_mode == "inproc":
            if not self.engine_model:
                raise ValueError("engine_mode=inproc needs LLMLAB_WORKER_ENGINE_MODEL (the model vLLM loads)")
            if self.processes > 1:
                raise ValueError("engine_mode=inproc runs one engine per process: LLMLAB_WORKER_PROCESSES must be 1")
        return self

    @property
    def served_name(self) -> str:
        return self.engine_served_name or self.engine_model
