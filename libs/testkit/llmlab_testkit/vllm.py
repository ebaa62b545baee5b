"""Real vLLM on the CPU for the ``vllm_cpu`` tier (built by scripts/setup-vllm-cpu.sh).

The engine lives in its own venv outside the repo so the services' environment stays light.
If it cannot start, tests FAIL with the reason: this tier never skips silently.
``LLMLAB_VLLM_URL`` points the tier at an already running server instead (development).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from llmlab_testkit.procs import ManagedProcess, Stack, free_port

CACHE = Path(os.environ.get("LLMLAB_CACHE", Path.home() / ".cache" / "llm-inference-lab"))
VENV_PY = CACHE / "vllm-cpu-venv" / "bin" / "python"
MODEL_DIR = CACHE / "models" / "SmolLM2-135M-Instruct"
SERVED_NAME = "SmolLM2-135M-Instruct"
REPO = Path(__file__).resolve().parents[3]
ENGINE_ENV = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
# The same engine both ways: the server's flags and the in-process worker's engine arguments.
ENGINE_ARGS: dict[str, object] = {"dtype": "bfloat16", "max_model_len": 2048, "enforce_eager": True}
# What worker-vllm imports, from this checkout, when it runs in the engine's venv.
WORKER_SOURCE_ROOTS = ("libs/common", "libs/worker", "services/worker-vllm")


def vllm_command(port: int) -> list[str]:
    return [
        str(VENV_PY),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(MODEL_DIR),
        "--served-model-name",
        SERVED_NAME,
        "--dtype",
        str(ENGINE_ARGS["dtype"]),
        "--max-model-len",
        str(ENGINE_ARGS["max_model_len"]),
        "--enforce-eager",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]


def missing_engine() -> list[str]:
    return [str(p) for p in (VENV_PY, MODEL_DIR / ".llmlab-ready") if not p.exists()]


def inproc_worker(stack: Stack, pool: str, *, heartbeat_s: float = 0.2, max_concurrency: int = 8) -> ManagedProcess:
    """worker-vllm with vLLM's engine in its own process (engine_mode=inproc), run by the engine
    venv's Python with this checkout's worker packages on its path. Raises when the engine cannot
    start (this tier never skips)."""
    missing = missing_engine()
    if missing:
        raise RuntimeError(f"in-process vLLM cannot run: {', '.join(missing)} missing (make install-vllm)")
    env = {
        **ENGINE_ENV,
        "LLMLAB_WORKER_ENGINE_MODE": "inproc",
        "LLMLAB_WORKER_ENGINE_MODEL": str(MODEL_DIR),
        "LLMLAB_WORKER_ENGINE_SERVED_NAME": SERVED_NAME,
        "LLMLAB_WORKER_ENGINE_ARGS": json.dumps(ENGINE_ARGS),
        # An inherited PYTHONPATH goes first: the mutation runner puts its broken copy there.
        "PYTHONPATH": os.pathsep.join(
            [*filter(None, [os.environ.get("PYTHONPATH")]), *(str(REPO / r) for r in WORKER_SOURCE_ROOTS)]
        ),
    }
    return stack.worker(
        "vllm",
        pool,
        "inproc://" + SERVED_NAME,
        max_concurrency=max_concurrency,
        heartbeat_s=heartbeat_s,
        env=env,
        python=str(VENV_PY),
        ready_timeout=240,
    )


@pytest.fixture(scope="session")
def vllm_url() -> Iterator[str]:
    existing = os.environ.get("LLMLAB_VLLM_URL")
    if existing:
        yield existing.rstrip("/")
        return
    missing = missing_engine()
    if missing:
        pytest.fail(
            f"real vLLM tier cannot run: {', '.join(missing)} missing. "
            f"Run `bash {REPO}/scripts/setup-vllm-cpu.sh` (make install-vllm) first.",
            pytrace=False,
        )
    port = free_port()
    proc = ManagedProcess("vllm-cpu", vllm_command(port), ENGINE_ENV, ready_url=f"http://127.0.0.1:{port}/health")
    proc.start()
    try:
        proc.wait_ready(timeout=240)
    except Exception as exc:
        proc.stop()
        pytest.fail(f"real vLLM did not start: {exc}", pytrace=False)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.stop(timeout=30)


def vllm_gauge(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", timeout=5).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[-1])
    return total
