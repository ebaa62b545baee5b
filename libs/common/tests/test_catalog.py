from __future__ import annotations

from pathlib import Path

import pytest
from llmlab_common.catalog import CatalogError, load_catalog
from llmlab_common.settings import DEFAULT_CATALOG

pytestmark = pytest.mark.unit


def test_shipped_catalog_loads_and_resolves_aliases() -> None:
    c = load_catalog(DEFAULT_CATALOG)
    assert [d.id for d in c.resolve("auto")] == ["llama-8b-vllm"]
    assert [d.id for d in c.resolve("SmolLM2-135M-Instruct")] == ["smollm2-cpu"]
    assert c.resolve("no-such-model") == []
    assert c.model_price("Qwen/Qwen3-32B") is not None
    for d in c.deployments:
        assert c.gpu_price(d.gpu) is not None
    assert c.plans["free"].slo_class in c.slo_classes


def _broken(tmp_path: Path, old: str, new: str) -> Path:
    text = DEFAULT_CATALOG.read_text()
    assert old in text
    p = tmp_path / "catalog.yaml"
    p.write_text(text.replace(old, new, 1))
    return p


def _line_of(path: Path, needle: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if needle in line)


def test_error_names_the_line_of_a_bad_value(tmp_path: Path) -> None:
    p = _broken(tmp_path, "quality: 0.80", "quality: 1.7")
    with pytest.raises(CatalogError) as exc:
        load_catalog(p)
    assert f"{p}:{_line_of(p, 'quality: 1.7')}:" in str(exc.value)
    assert "deployments.1.quality" in str(exc.value)


def test_error_names_the_line_of_an_unknown_field(tmp_path: Path) -> None:
    p = _broken(tmp_path, "    pipeline: throughput", "    pipline: throughput")
    with pytest.raises(CatalogError) as exc:
        load_catalog(p)
    msg = str(exc.value)
    assert f"{p}:{_line_of(p, 'pipline: throughput')}:" in msg


def test_cross_references_are_checked(tmp_path: Path) -> None:
    p = _broken(
        tmp_path, "    gpu: H100-SXM\n    priors: {ttft_p95_s: 0.25", "    gpu: B200\n    priors: {ttft_p95_s: 0.25"
    )
    with pytest.raises(CatalogError, match="B200"):
        load_catalog(p)


def test_invalid_yaml_is_reported(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("version: 1\ndeployments: [\n")
    with pytest.raises(CatalogError, match="invalid YAML"):
        load_catalog(p)


def test_a_plan_priority_must_have_a_queue(tmp_path: Path) -> None:
    # One queue per priority and pool (llmlab_common.subjects.PRIORITY_LEVELS): 0..3.
    from llmlab_common.subjects import PRIORITY_LEVELS

    p = _broken(tmp_path, "priority: 2", f"priority: {PRIORITY_LEVELS}")
    with pytest.raises(CatalogError, match="priority"):
        load_catalog(p)
    assert max(plan.priority for plan in load_catalog(DEFAULT_CATALOG).plans.values()) < PRIORITY_LEVELS
