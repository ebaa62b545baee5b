"""Export SmolLM2-135M (the HF checkpoint that scripts/setup-vllm-cpu.sh dequantises from the Q4_1 GGUF) to ONNX
for the edge experiment (``edge_onnx``). Run as a script with the cached vLLM venv's Python, the only place torch
is installed here:

    $VLLM_PYTHON experiments/llmlab_experiments/edge_export.py MODEL_DIR OUT.onnx --shapes dynamic|static

The decoder is written out explicitly (Llama: RMSNorm, rotary embeddings, grouped-query attention, SwiGLU) from the
checkpoint's tensors rather than traced through transformers, so the graph's inputs are plain tensors and the KV
cache is one tensor per K and V for all layers:

- ``dynamic``: ``input_ids [1, n]`` and ``past_k/past_v [layers, kv_heads, p, head_dim]`` of any n and p; outputs
  the last position's logits and the caches grown to p + n. One graph serves the prefill (n = the prompt) and each
  decode step (n = 1).
- ``static``: every shape fixed: ``input_ids [1, 1]``, ``pos [1]`` and caches of ``--cache-len`` positions written
  in place at ``pos``; the prompt is fed one token at a time, as a runtime that compiles one shape does.

Before writing, the module's logits are checked against transformers' own forward on a fixed prompt and nothing is
written above ``MAX_LOGIT_DIFF`` (the figure is printed as JSON with the export's timings), so the graph computes
the model and not something near it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

# fp32 against fp32: the two differ only in the order of their sums (7.9e-5 and 1.3e-4 measured)
MAX_LOGIT_DIFF = 1e-3
REFUSED = 3  # the exit status when the check fails (a crash exits 1)


class Decoder(nn.Module):
    def __init__(self, model_dir: Path, static_len: int = 0) -> None:
        super().__init__()
        cfg = json.loads((model_dir / "config.json").read_text())
        w = {k: v.float() for k, v in load_file(str(model_dir / "model.safetensors")).items()}
        self.layers, self.heads, self.kv_heads = (
            cfg["num_hidden_layers"],
            cfg["num_attention_heads"],
            cfg["num_key_value_heads"],
        )
        self.head_dim = cfg.get("head_dim") or cfg["hidden_size"] // self.heads
        self.eps = float(cfg["rms_norm_eps"])
        theta = float((cfg.get("rope_parameters") or {}).get("rope_theta") or cfg.get("rope_theta", 10000.0))
        self.static_len = static_len
        self.register_buffer("inv_freq", 1.0 / theta ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim))
        self.register_buffer("embed", w["model.embed_tokens.weight"])
        # Weights as [in, out] so each projection is a MatMul with a constant right operand (what ONNX Runtime's
        # dynamic INT8 quantisation rewrites); the tied output head gets its own transposed copy for the same reason.
        head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
        self.register_buffer("head_t", head.t().contiguous())
        self.register_buffer("norm", w["model.norm.weight"])
        names = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
                 "mlp.up_proj", "mlp.down_proj")  # fmt: skip
        for i in range(self.layers):
            p = f"model.layers.{i}."
            for n in names:
                self.register_buffer(f"l{i}_{n.split('.')[1]}", w[p + n + ".weight"].t().contiguous())
            self.register_buffer(f"l{i}_ln1", w[p + "input_layernorm.weight"])
            self.register_buffer(f"l{i}_ln2", w[p + "post_attention_layernorm.weight"])

    def _layer(self, i: int) -> Callable[[str], torch.Tensor]:
        return lambda name: getattr(self, f"l{i}_{name}")

    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * weight

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = self.head_dim // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin

    def forward(
        self, input_ids: torch.Tensor, past_k: torch.Tensor, past_v: torch.Tensor, pos: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        n = input_ids.shape[1]
        hd, kvh, group = self.head_dim, self.kv_heads, self.heads // self.kv_heads
        x = self.embed[input_ids[0]]  # [n, hidden]
        if pos is None:  # dynamic: positions follow the cache
            start = past_k.shape[2]
            positions = torch.arange(n) + start
            keys = torch.arange(start + n)
            allowed = keys[None, :] <= positions[:, None]  # [n, p + n]
        else:  # static: one token at pos, the cache's other slots masked out
            positions = pos
            keys = torch.arange(self.static_len)
            allowed = keys[None, :] <= pos[:, None]  # [1, S]
            slot = (keys == pos).view(1, -1, 1)
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()  # [n, hd]
        mask = torch.where(allowed, 0.0, float("-inf"))
        ks, vs = [], []
        for i in range(self.layers):
            b = self._layer(i)
            h = self._rms(x, b("ln1"))
            q = (h @ b("q_proj")).view(n, self.heads, hd).transpose(0, 1)  # [heads, n, hd]
            k = (h @ b("k_proj")).view(n, kvh, hd).transpose(0, 1)  # [kv_heads, n, hd]
            v = (h @ b("v_proj")).view(n, kvh, hd).transpose(0, 1)
            q, k = self._rope(q, cos, sin), self._rope(k, cos, sin)
            if pos is None:
                k_all = torch.cat((past_k[i], k), dim=1)
                v_all = torch.cat((past_v[i], v), dim=1)
            else:
                k_all = torch.where(slot, k, past_k[i])
                v_all = torch.where(slot, v, past_v[i])
            ks.append(k_all)
            vs.append(v_all)
            qg = q.reshape(kvh, group, n, hd)  # query head h reads kv head h // group, as transformers' repeat_kv
            scores = qg @ k_all.unsqueeze(1).transpose(-1, -2) / math.sqrt(hd) + mask
            attn = torch.softmax(scores, dim=-1) @ v_all.unsqueeze(1)  # [kvh, group, n, hd]
            x = x + attn.reshape(self.heads, n, hd).transpose(0, 1).reshape(n, self.heads * hd) @ b("o_proj")
            h = self._rms(x, b("ln2"))
            x = x + (torch.nn.functional.silu(h @ b("gate_proj")) * (h @ b("up_proj"))) @ b("down_proj")
        logits = self._rms(x[-1:], self.norm) @ self.head_t  # [1, vocab]
        return logits, torch.stack(ks), torch.stack(vs)


def _check(dec: Decoder, model_dir: Path, static_len: int) -> float:
    """Max |logit difference| against transformers' forward over every decode step of a fixed 12-token prompt."""
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    ids = torch.tensor([[1, 4093, 28, 1303, 314, 260, 3575, 282, 4649, 47, 216, 2]])
    with torch.no_grad():
        want = ref(ids).logits[0]  # [12, vocab]
        shape = (dec.layers, dec.kv_heads, static_len, dec.head_dim)
        pk, pv = torch.zeros(shape), torch.zeros(shape)
        worst = 0.0
        if static_len:
            for t in range(ids.shape[1]):
                got, pk, pv = dec(ids[:, t : t + 1], pk, pv, torch.tensor([t]))
                worst = max(worst, (got[0] - want[t]).abs().max().item())
        else:
            got, pk, pv = dec(ids[:, :8], pk, pv)  # a prefill, then decode steps on its cache
            worst = (got[0] - want[7]).abs().max().item()
            for t in range(8, ids.shape[1]):
                got, pk, pv = dec(ids[:, t : t + 1], pk, pv)
                worst = max(worst, (got[0] - want[t]).abs().max().item())
    return worst


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model_dir", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--shapes", choices=("dynamic", "static"), default="dynamic")
    p.add_argument("--cache-len", type=int, default=256, help="static: the cache's fixed length (prompt + answer)")
    a = p.parse_args(argv)
    torch.set_num_threads(2)
    t0 = time.perf_counter()
    static_len = a.cache_len if a.shapes == "static" else 0
    dec = Decoder(a.model_dir, static_len).eval()
    err = _check(dec, a.model_dir, static_len)
    if err > MAX_LOGIT_DIFF:  # a graph that computes another model is not written
        sys.stderr.write(f"logits differ from transformers' by {err:.3g} (> {MAX_LOGIT_DIFF}): not exported\n")
        return REFUSED
    t1 = time.perf_counter()
    cache = (dec.layers, dec.kv_heads, static_len or 3, dec.head_dim)
    args: tuple[torch.Tensor, ...] = (torch.tensor([[1, 2]]) if not static_len else torch.tensor([[1]]),
                                      torch.zeros(cache), torch.zeros(cache))  # fmt: skip
    names = ["input_ids", "past_k", "past_v"]
    dynamic_axes = None
    if static_len:
        args, names = (*args, torch.tensor([0])), [*names, "pos"]
    else:
        dynamic_axes = {"input_ids": {1: "n"}, "past_k": {2: "p"}, "past_v": {2: "p"},
                        "present_k": {2: "p_n"}, "present_v": {2: "p_n"}}  # fmt: skip
    a.out.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        torch.onnx.export(dec, args, str(a.out), input_names=names, output_names=["logits", "present_k", "present_v"],
                          dynamic_axes=dynamic_axes, opset_version=17, dynamo=False)  # fmt: skip
    info = {
        "max_abs_logit_diff_vs_transformers": err,
        "build_and_check_s": round(t1 - t0, 1),
        "export_s": round(time.perf_counter() - t1, 1),
        "torch": torch.__version__,
        "bytes": a.out.stat().st_size,
    }
    sys.stdout.write(json.dumps(info) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
