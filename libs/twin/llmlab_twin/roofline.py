"""Roofline step-time model of one engine forward pass (a continuous-batching step).

    step_s = max(linear_compute, linear_memory) + max(attention_compute, attention_memory)
             + allreduce_s + step_overhead_s + token_overhead_s * tokens + seq_overhead_s * decode_seqs

Two operator groups run one after the other (GEMMs, then attention kernels), so each gets its own roofline
and the two add; a single max over the whole step overlapped weight streaming with KV streaming, which
kernels do not do, and under-predicted large-batch decode (see TWIN.md, calibration). tokens =
prefill_tokens + decode_seqs.
  linear:    compute = 2 * matmul_params * tokens / F        memory = weight bytes read per step / B
  attention: compute = 4 * layers * q_dim * (prefill_context_tokens + decode_context_tokens) / F   (QK^T, PV)
             memory  = kv_bytes/token * (decode_context_tokens + tokens) / B   (read the decode contexts,
             write the new tokens' K/V). Prefill re-reads of earlier KV and activation traffic are ignored.
  F = tp * peak(dtype) * compute_eff,  B = tp * bandwidth * bw_eff  (each GPU holds 1/tp of the work).
  allreduce (tp > 1): 2 a layer of tokens x hidden x 2 bytes, ring cost 2(tp-1)/tp x bytes / interconnect
  bandwidth, plus allreduce_latency_s each; not overlapped with compute.

Attention inside a prefill chunk: StepBatch.prefill_context_tokens carries (tokens already in KV) x chunk_len;
the causal part within the chunk (chunk_len^2 / 2) is only counted if the caller adds it to that field.
step_seconds is plain float arithmetic on constants precomputed in __init__: it runs once per simulated step.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Protocol

from llmlab_twin.hwcatalog import (
    DeviceSpec,
    ModelSpec,
    dtype_bytes,
    get_device,
    get_engine_profile,
    get_model,
)
from llmlab_twin.kvcalc import kv_bytes_per_token_per_gpu


@dataclass(frozen=True)
class StepBatch:
    prefill_tokens: int  # new prompt tokens computed this step (sum over chunks)
    prefill_context_tokens: int  # sum over prefill chunks of (tokens already in KV before the chunk) * chunk_len
    decode_seqs: int  # sequences producing one token this step
    decode_context_tokens: int  # sum of context lengths (KV tokens read) of the decode seqs


class StepCostModel(Protocol):
    def step_seconds(self, batch: StepBatch) -> float: ...


@dataclass(frozen=True)
class EfficiencyParams:
    """The calibrated parameters. Defaults are generic GPU guesses, used only when a device has no fit."""

    compute_eff: float = 0.5  # achieved / peak dense matmul FLOP/s
    bw_eff: float = 0.8  # achieved / peak memory bandwidth
    step_overhead_s: float = 0.003  # per step: scheduling, launches, sampling, detokenise
    token_overhead_s: float = 0.0  # per token in the step (input prep; matters on CPU)
    seq_overhead_s: float = 0.0  # per decoding sequence in the step (sampling, detokenising, output)
    allreduce_latency_s: float = 10e-6  # per all-reduce, tp > 1 only (not fitted)

    def __post_init__(self) -> None:
        if not (0 < self.compute_eff <= 1 and 0 < self.bw_eff <= 1):
            raise ValueError("compute_eff and bw_eff must be in (0, 1]")
        if min(self.step_overhead_s, self.token_overhead_s, self.seq_overhead_s, self.allreduce_latency_s) < 0:
            raise ValueError("overheads must be >= 0")


def params_for(device: DeviceSpec, engine: str | None = None) -> EfficiencyParams:
    """The device's fitted parameters from hardware.yaml (or the defaults), with the engine's own per-step
    overhead when hardware.yaml has a profile for it and the device is a GPU."""
    e = device.efficiency
    params = (
        EfficiencyParams()
        if e is None
        else EfficiencyParams(
            compute_eff=e.compute_eff,
            bw_eff=e.bw_eff,
            step_overhead_s=e.step_overhead_s,
            token_overhead_s=e.token_overhead_s,
            seq_overhead_s=e.seq_overhead_s,
        )
    )
    profile = get_engine_profile(engine) if engine and device.kind == "gpu" else None
    if profile is not None:
        params = replace(params, step_overhead_s=profile.step_overhead_s)
    return params


class RooflineCostModel:
    """Implements StepCostModel for one model on `tp` identical devices."""

    def __init__(
        self,
        model: ModelSpec,
        device: DeviceSpec,
        *,
        dtype: str = "bf16",
        kv_dtype: str | None = None,
        tp: int = 1,
        params: EfficiencyParams | None = None,
        engine: str | None = None,
    ) -> None:
        if tp < 1:
            raise ValueError("tp must be >= 1")
        self.model = model
        self.device = device
        self.dtype = dtype
        self.kv_dtype = kv_dtype or dtype
        self.tp = tp
        self.params = params if params is not None else params_for(device, engine)
        p = self.params
        flops_s = device.peak_flops(dtype) * p.compute_eff * tp
        bytes_s = device.mem_bandwidth_bytes_s * p.bw_eff * tp
        # Seconds per unit of work, so step_seconds is a handful of multiply-adds.
        self._s_per_token_flops = 2.0 * model.matmul_parameters() / flops_s
        self._s_per_ctx_flops = 4.0 * model.num_layers * model.q_dim / flops_s
        self._weight_s = model.weight_bytes_read_per_step(dtype) / bytes_s
        kv_total = kv_bytes_per_token_per_gpu(model, self.kv_dtype, tp) * tp  # replicated heads included
        self._s_per_kv_token = kv_total / bytes_s
        self._step_overhead_s = p.step_overhead_s
        self._token_overhead_s = p.token_overhead_s
        self._seq_overhead_s = p.seq_overhead_s
        if tp > 1:
            link = device.interconnect_bytes_s or 32e9
            act_bytes = model.hidden_size * dtype_bytes("bf16")  # activations stay 16-bit
            self._ar_s_per_token = 2 * model.num_layers * 2 * (tp - 1) / tp * act_bytes / link
            self._ar_fixed_s = 2 * model.num_layers * p.allreduce_latency_s
        else:
            self._ar_s_per_token = 0.0
            self._ar_fixed_s = 0.0

    @classmethod
    def from_names(cls, model: str, device: str, **kw: Any) -> RooflineCostModel:
        """Load both from configs/ (see hwcatalog for the override)."""
        return cls(get_model(model), get_device(device), **kw)

    def step_seconds(self, batch: StepBatch) -> float:
        tokens = batch.prefill_tokens + batch.decode_seqs
        if tokens <= 0:
            return 0.0
        lin_c = tokens * self._s_per_token_flops
        lin_m = self._weight_s
        att_c = (batch.prefill_context_tokens + batch.decode_context_tokens) * self._s_per_ctx_flops
        att_m = (batch.decode_context_tokens + tokens) * self._s_per_kv_token
        return (
            (lin_c if lin_c > lin_m else lin_m)
            + (att_c if att_c > att_m else att_m)
            + tokens * (self._ar_s_per_token + self._token_overhead_s)
            + batch.decode_seqs * self._seq_overhead_s
            + self._ar_fixed_s
            + self._step_overhead_s
        )

    def breakdown(self, batch: StepBatch) -> dict[str, Any]:
        """Seconds per part. compute_s/memory_s sum the two operator groups; `bound` names the larger one."""
        tokens = batch.prefill_tokens + batch.decode_seqs
        if tokens <= 0:
            zero = dict.fromkeys(("compute_s", "memory_s", "linear_s", "attention_s", "allreduce_s", "overhead_s"), 0.0)
            return {**zero, "step_s": 0.0, "bound": "idle"}
        lin_c = tokens * self._s_per_token_flops
        lin_m = self._weight_s
        att_c = (batch.prefill_context_tokens + batch.decode_context_tokens) * self._s_per_ctx_flops
        att_m = (batch.decode_context_tokens + tokens) * self._s_per_kv_token
        compute = lin_c + att_c
        memory = lin_m + att_m
        return {
            "compute_s": compute,
            "memory_s": memory,
            "linear_s": max(lin_c, lin_m),
            "attention_s": max(att_c, att_m),
            "allreduce_s": tokens * self._ar_s_per_token + self._ar_fixed_s,
            "overhead_s": self._step_overhead_s
            + tokens * self._token_overhead_s
            + batch.decode_seqs * self._seq_overhead_s,
            "step_s": self.step_seconds(batch),
            "bound": "compute" if compute > memory else "memory",
        }
