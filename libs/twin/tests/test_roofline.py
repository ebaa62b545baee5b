"""Roofline step-time model: hand-computed step times on a fixed set of parameters."""

from __future__ import annotations

import pytest
from llmlab_twin.hwcatalog import get_device, get_model
from llmlab_twin.roofline import EfficiencyParams, RooflineCostModel, StepBatch, StepCostModel

pytestmark = pytest.mark.unit

P = EfficiencyParams(compute_eff=0.5, bw_eff=0.8, step_overhead_s=0.002, token_overhead_s=0.0)
BW = 3.35e12 * 0.8
FLOPS = 989.4e12 * 0.5


@pytest.fixture
def cm() -> RooflineCostModel:
    return RooflineCostModel(get_model("Llama-3.1-8B"), get_device("H100-SXM"), dtype="bf16", params=P)


def test_single_decode_is_weight_streaming(cm: RooflineCostModel) -> None:
    m = get_model("Llama-3.1-8B")
    weights_read = (m.num_parameters - m.vocab_size * m.hidden_size) * 2  # untied input table not streamed
    kv = 131072 * (1000 + 1)
    expected = weights_read / BW + kv / BW + 0.002
    b = StepBatch(prefill_tokens=0, prefill_context_tokens=0, decode_seqs=1, decode_context_tokens=1000)
    assert cm.step_seconds(b) == pytest.approx(expected, rel=1e-9)
    assert cm.step_seconds(b) == pytest.approx(0.00765, abs=5e-5)  # 15.0 GB at 2.68 TB/s = 5.6 ms, + 2 ms
    assert cm.breakdown(b)["bound"] == "memory"


def test_big_prefill_is_compute_bound(cm: RooflineCostModel) -> None:
    m = get_model("Llama-3.1-8B")
    n = 8192
    b = StepBatch(prefill_tokens=n, prefill_context_tokens=n * n // 2, decode_seqs=0, decode_context_tokens=0)
    linear = 2 * m.matmul_parameters() * n / FLOPS
    attn = 4 * 32 * 4096 * (n * n // 2) / FLOPS
    assert cm.step_seconds(b) == pytest.approx(linear + attn + 0.002, rel=1e-9)
    assert cm.breakdown(b)["bound"] == "compute"
    assert 0.25 < cm.step_seconds(b) < 0.3  # ~0.27 s for 8K tokens at ~495 effective TFLOP/s


def test_monotone_and_empty(cm: RooflineCostModel) -> None:
    assert cm.step_seconds(StepBatch(0, 0, 0, 0)) == 0.0
    small = cm.step_seconds(StepBatch(0, 0, 8, 8 * 512))
    big = cm.step_seconds(StepBatch(0, 0, 256, 256 * 512))
    assert big > small
    assert cm.step_seconds(StepBatch(0, 0, 8, 8 * 4096)) > small  # longer contexts read more KV


def test_tensor_parallel_divides_work_and_adds_allreduce() -> None:
    m, d = get_model("Llama-3.1-70B"), get_device("H100-SXM")
    one = RooflineCostModel(m, d, dtype="fp8", tp=1, params=P)
    four = RooflineCostModel(m, d, dtype="fp8", tp=4, params=P)
    b = StepBatch(0, 0, 64, 64 * 2048)
    core1 = one.step_seconds(b) - 0.002
    bd = four.breakdown(b)
    assert bd["allreduce_s"] == pytest.approx(2 * 80 * 10e-6 + 64 * 2 * 80 * 2 * 3 / 4 * 8192 * 2 / 450e9)
    assert four.step_seconds(b) == pytest.approx(core1 / 4 + bd["allreduce_s"] + 0.002, rel=1e-9)


def test_protocol_and_from_names_use_fitted_device_params() -> None:
    cm: StepCostModel = RooflineCostModel.from_names("Llama-3.1-8B", "H100-SXM")
    assert isinstance(cm, RooflineCostModel)
    eff = get_device("H100-SXM").efficiency
    assert eff is not None and cm.params.compute_eff == eff.compute_eff
    assert cm.step_seconds(StepBatch(0, 0, 1, 100)) > 0


def test_fp8_on_ampere_uses_bf16_math_with_fp8_bytes() -> None:
    m, a100 = get_model("Llama-3.1-8B"), get_device("A100-80GB")
    fp8 = RooflineCostModel(m, a100, dtype="fp8", params=P)
    bf16 = RooflineCostModel(m, a100, dtype="bf16", params=P)
    prefill = StepBatch(4096, 0, 0, 0)
    assert fp8.breakdown(prefill)["compute_s"] == pytest.approx(bf16.breakdown(prefill)["compute_s"])
    decode = StepBatch(0, 0, 1, 10)
    assert fp8.step_seconds(decode) < bf16.step_seconds(decode)


def test_params_validation() -> None:
    with pytest.raises(ValueError):
        EfficiencyParams(compute_eff=1.5)
    with pytest.raises(ValueError):
        EfficiencyParams(step_overhead_s=-1)


@pytest.mark.unit
def test_engine_profile_replaces_the_step_overhead_on_gpus_only() -> None:
    from llmlab_twin.hwcatalog import get_engine_profile

    vllm = get_engine_profile("vllm")
    assert vllm is not None and 0 < vllm.step_overhead_s < 0.004
    decode = StepBatch(0, 0, 1, 300)
    base = RooflineCostModel.from_names("Llama-3.1-8B", "H100-SXM")
    tuned = RooflineCostModel.from_names("Llama-3.1-8B", "H100-SXM", engine="vllm")
    assert tuned.params.step_overhead_s == vllm.step_overhead_s
    assert base.step_seconds(decode) - tuned.step_seconds(decode) == pytest.approx(
        base.params.step_overhead_s - vllm.step_overhead_s
    )
    # An engine without a profile keeps the device fit; a CPU device keeps its own (real-engine) fit.
    assert RooflineCostModel.from_names("Llama-3.1-8B", "H100-SXM", engine="sglang").params == base.params
    cpu = RooflineCostModel.from_names("SmolLM2-135M-Instruct", "cpu-local", dtype="fp32", engine="vllm")
    assert cpu.params == RooflineCostModel.from_names("SmolLM2-135M-Instruct", "cpu-local", dtype="fp32").params
