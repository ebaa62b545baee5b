"""Pipelines as configs: every file loads, argv for both engines, a bad file is refused naming it; the A search."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from llmlab_experiments import pipeline_search
from llmlab_experiments.pipelines import (
    PIPELINE_DIR,
    PipelineError,
    engine_argv,
    get_pipeline,
    load_pipeline,
    load_pipelines,
    main,
    twin_setup,
)

pytestmark = pytest.mark.unit


def test_every_pipeline_loads_and_maps_to_a_catalog_pipeline() -> None:
    pls = load_pipelines()
    assert sorted(pls) == ["A", "B", "C", "D"]
    assert {p.catalog_pipeline for p in pls.values()} == {"throughput", "latency", "long_context", "experimental"}
    assert get_pipeline("long_context").name == "C"


def test_vllm_argv() -> None:
    argv = engine_argv(get_pipeline("A"), "vllm", "meta-llama/Llama-3.1-8B-Instruct", 8001, served_model_name="x")
    assert argv[:3] == ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"]
    s = " ".join(argv)
    for part in (
        "--served-model-name x",
        "--port 8001",
        "--gpu-memory-utilization 0.85",
        "--max-num-seqs 128",
        "--max-num-batched-tokens 8192",
        "--max-model-len 8192",
    ):
        assert part in s
    assert "--enable-prefix-caching" in argv and "--enable-chunked-prefill" in argv


def test_sglang_argv() -> None:
    argv = engine_argv(get_pipeline("C"), "sglang", "Qwen/Qwen3-32B", 30000, exe="/opt/sg/bin/python")
    assert argv[:5] == ["/opt/sg/bin/python", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3-32B"]
    s = " ".join(argv)
    for part in ("--tp-size 2", "--context-length 32768", "--schedule-policy lpm", "--chunked-prefill-size 4096"):
        assert part in s
    assert "--enable-metrics" in argv
    d = engine_argv(get_pipeline("D"), "sglang", "m", 1)
    assert "fp8_e4m3" in d and "--quantization" in d


def test_cli_prints_one_argument_per_line(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["argv", "--pipeline", "B", "--engine", "vllm", "--model", "m", "--port", "9", "--exe", "/x/vllm"])
    assert rc == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:3] == ["/x/vllm", "serve", "m"] and "--max-num-seqs" in lines


def _bad(tmp_path: Path, old: str, new: str) -> Path:
    src = (PIPELINE_DIR / "A-throughput.yaml").read_text()
    assert old in src
    p = tmp_path / "A-bad.yaml"
    p.write_text(src.replace(old, new, 1))
    return p


@pytest.mark.parametrize(
    ("old", "new", "why"),
    [
        ("--max-num-seqs: 128", "--max-num-seq: 128", "unknown flag"),  # a typo
        ("--mem-fraction-static: 0.83", "--gpu-memory-utilization: 0.83", "unknown flag"),  # the other engine's
        ("--max-num-seqs: 128", "--max-num-seqs: 256", "the twin must replay"),  # engine and twin disagree
        ("  max_num_seqs: 128", "  max_num_seqs: -1", "max_num_seqs"),
    ],
)
def test_invalid_pipeline_is_refused_naming_the_file(tmp_path: Path, old: str, new: str, why: str) -> None:
    p = _bad(tmp_path, old, new)
    with pytest.raises(PipelineError) as e:
        load_pipeline(p)
    assert str(p) in str(e.value) and why in str(e.value)


def test_directory_with_a_bad_file_is_refused(tmp_path: Path) -> None:
    for f in PIPELINE_DIR.glob("*.yaml"):
        shutil.copy(f, tmp_path / f.name)
    (tmp_path / "Z.yaml").write_text("name: Z\n")
    with pytest.raises(PipelineError, match=r"Z\.yaml"):
        load_pipelines(tmp_path)


def test_twin_setup_follows_the_pipeline() -> None:
    a = get_pipeline("A")
    s = twin_setup(a)
    assert s.config.max_num_seqs == 128 and s.config.max_num_batched_tokens == 8192
    assert s.config.kv.prefix_style == "vllm" and s.config.kv.prefix_caching
    lo = twin_setup(a, gpu_memory_utilization=0.7)
    assert lo.config.kv.num_gpu_blocks < s.config.kv.num_gpu_blocks  # utilisation sets the KV capacity
    c = twin_setup(get_pipeline("C"), engine="sglang")
    assert c.config.kv.prefix_style == "sglang" and c.config.long_prefill_token_threshold == 2048


def test_pipeline_search_quick_writes_every_output(tmp_path: Path) -> None:
    d = pipeline_search.run(tmp_path, True, "python -m llmlab_experiments --quick --only pipeline_search")
    assert {p.name for p in d.iterdir()} == {"results.json", "table.md", "command.txt", "NOTE.md", "plot.png"}
    res = json.loads((d / "results.json").read_text())
    rows = res["rows"]
    assert res["label"].startswith("SIMULATED") and rows["simulated"] is True
    rungs = rows["rungs"]
    # the walk: every rung before the chosen one meets the SLO, the one after it (if any) breaks it
    assert rows["chosen_rung"] is not None
    k = rows["chosen_rung"]
    assert all(r["meets_p95_slo"] for r in rungs[: k + 1])
    if k + 1 < len(rungs):
        assert not rungs[k + 1]["meets_p95_slo"]
    assert rows["chosen"]["max_num_seqs"] == rungs[k]["max_num_seqs"]
    # a bigger batch carries more sequences per step: ITL p95 does not fall along the ladder
    itl = [r["itl_p95_s"] for r in rungs]
    assert itl == sorted(itl)
    table = (d / "table.md").read_text()
    assert "SIMULATED" in table and "**chosen**" in table
    assert table.count("\n| ") - 1 == len(rungs)  # header + one row per rung
