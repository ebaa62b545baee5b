"""§4 quantization on the twin: weight bytes per format, kernel paths, the experiment's outputs and the §4.3 rule."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from llmlab_experiments import quantization as q
from llmlab_experiments.quantization import PrecisionConstraints, select_precision
from llmlab_twin.hwcatalog import get_device, get_model

pytestmark = pytest.mark.unit

BF16, FP8, AWQ, GPTQ = q.FORMATS


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    d = q.run(tmp_path_factory.mktemp("quant"), True, "python -m llmlab_experiments --quick --only quantization")
    return d, json.loads((d / "results.json").read_text())


def test_int4_layer_weights_are_a_quarter_of_bf16() -> None:
    m = get_model("Llama-3.1-8B")
    other = (m.num_parameters - m.num_layers * m.layer_linear_parameters()) * 2.0
    for fmt in (AWQ, GPTQ):
        ratio = (q.weight_bytes(m, fmt) - other) / (q.weight_bytes(m, BF16) - other)
        assert ratio == pytest.approx(0.25, abs=0.01)  # 4/16 bits + group scales
        # embeddings and LM head stay 16-bit: the whole model shrinks less than 4x
        assert q.weight_bytes(m, fmt) > q.weight_bytes(m, BF16) / 4


def test_fp8_is_weight_only_without_fp8_units() -> None:
    assert q.kernel_for(FP8, get_device("H100-SXM"))[1] == "native"
    assert "fallback" in q.kernel_for(FP8, get_device("A100-80GB"))[1]


def test_quick_run_writes_every_output_labelled_simulated(quick: tuple[Path, dict[str, Any]]) -> None:
    d, data = quick
    assert {p.name for p in d.iterdir()} >= {"results.json", "table.md", "command.txt", "NOTE.md", "plot.png"}
    assert data["label"].startswith("SIMULATED") and data["meta"]["simulated"] is True
    assert all(r["simulated"] and r["accuracy"] == "not measured on the twin" for r in data["rows"]["by_concurrency"])
    assert "Memory saved and throughput gained, apart" in (d / "table.md").read_text()


def _summary(data: dict[str, Any], model: str, fmt: str) -> dict[str, Any]:
    return next(s for s in data["rows"]["summary"] if (s["model"], s["format"]) == (model, fmt))


def _row(data: dict[str, Any], model: str, fmt: str, c: int) -> dict[str, Any]:
    rows = data["rows"]["by_concurrency"]
    return next(r for r in rows if (r["model"], r["format"], r["concurrency"]) == (model, fmt, c))


def test_memory_and_speed_effects(quick: tuple[Path, dict[str, Any]]) -> None:
    _, data = quick
    # capacity: INT4 frees KV for many more 32B sequences; BF16 preempts at c=64, INT4 does not
    assert (
        _summary(data, "Qwen3-32B", GPTQ.name)["max_seqs_at_context"]
        > 4 * _summary(data, "Qwen3-32B", "BF16")["max_seqs_at_context"]
    )
    assert (
        _row(data, "Qwen3-32B", "BF16", 64)["preemptions"] > 0 == _row(data, "Qwen3-32B", GPTQ.name, 64)["preemptions"]
    )
    # fewer weight bytes speed up single-stream decode; the AWQ kernel loses to BF16 once compute-bound
    for fmt in (FP8, AWQ, GPTQ):
        assert _row(data, "Llama-3.1-8B", fmt.name, 1)["tok_s_vs_bf16"] > 1.2
    assert _row(data, "Llama-3.1-8B", AWQ.name, 64)["tok_s_vs_bf16"] < 1.0
    assert _row(data, "Llama-3.1-8B", FP8.name, 64)["tok_s_vs_bf16"] > 1.2  # FP8 units on H100


@pytest.mark.parametrize(
    ("constraints", "choice"),
    [
        # H100, FP8 quality within tolerance -> FP8
        (PrecisionConstraints(fp8_hardware=True, fp8_quality_drop=0.005), "FP8"),
        # H100 but FP8 quality drop too large, VRAM-bound with a verified INT4 kernel -> INT4
        (
            PrecisionConstraints(fp8_hardware=True, fp8_quality_drop=0.03, vram_bound=True, int4_kernels_verified=True),
            "AWQ/GPTQ INT4",
        ),
        # A100 (no FP8 units), VRAM-bound, kernel verified -> INT4
        (PrecisionConstraints(fp8_hardware=False, vram_bound=True, int4_kernels_verified=True), "AWQ/GPTQ INT4"),
        # A100, VRAM-bound but the INT4 kernel is not verified -> baseline
        (PrecisionConstraints(fp8_hardware=False, vram_bound=True), "BF16/FP16"),
        # FP8 hardware, quality never measured, VRAM not the constraint -> baseline
        (PrecisionConstraints(fp8_hardware=True), "BF16/FP16"),
        # FP8 units but no engine kernel -> not FP8
        (PrecisionConstraints(fp8_hardware=True, fp8_engine_kernels=False, fp8_quality_drop=0.0), "BF16/FP16"),
    ],
)
def test_selection_rule(constraints: PrecisionConstraints, choice: str) -> None:
    got, reasons = select_precision(constraints)
    assert got == choice
    assert reasons


def test_vram_bound() -> None:
    h100 = get_device("H100-SXM")
    assert q.vram_bound(get_model("Llama-3.1-70B"), h100, needed_concurrency=1, context=1280) == (
        True,
        "BF16 weights do not fit",
    )
    assert q.vram_bound(get_model("Qwen3-32B"), h100, needed_concurrency=64, context=1280)[0] is True
    assert q.vram_bound(get_model("Llama-3.1-8B"), h100, needed_concurrency=64, context=1280)[0] is False
